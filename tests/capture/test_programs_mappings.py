"""Differential programs on the constructs Hugging Face models lean on: function attributes
read by decorators (`__code__`, `__wrapped__`), classes with `__getattribute__` /
`__setattr__` written in Python (configs with attribute aliases), property setters, dict
subclasses (ModelOutput: an OrderedDict subclass that is also a dataclass; registries that
override `get`), dicts keyed by modules or tensors, user mappings (MutableMapping), instance
`__dict__` reads and `torch.compiler.is_compiling()`. Each runs twice, in one graph."""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import MutableMapping

import pytest
import torch
from torch import nn

import ember
from ember.testing import CompileCounter, check_against_eager, check_program, program_ids


def x4():
    return torch.randn(4)


# ---------------------------------------------------------------- function attributes


def config_defaults(func):
    """transformers' merge_with_config_defaults: reads the wrapped function's parameters."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if "scale" in func.__code__.co_varnames and "scale" not in kwargs:
            index = func.__code__.co_varnames.index("scale")
            if len(args) <= index:
                kwargs["scale"] = func.__defaults__[-1] * 2
        return func(*args, **kwargs)

    return wrapper


@config_defaults
def scaled(x, scale=1.5):
    return x * scale


def p_decorator_reads_code(x):
    return scaled(x) + scaled(x, 3.0) + scaled(x, scale=0.5)


def p_function_metadata(x):
    unwrapped = scaled.__wrapped__
    code = unwrapped.__code__
    tag = len(code.co_name) + code.co_argcount + len(scaled.__name__)
    return unwrapped(x) * tag


def p_local_function_code(x):
    def helper(a, b=2):
        return a * b

    return helper(x) + helper.__code__.co_argcount


# ---------------------------------------------------------------- attribute hooks


class AliasConfig:
    """Like transformers' PreTrainedConfig: attribute aliases in __getattribute__/__setattr__."""

    attribute_map = {"hidden_size": "n_embd"}

    def __init__(self):
        self.n_embd = 4
        self.scale = 2.0

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


CONFIG = AliasConfig()


def p_getattribute_alias(x):
    return x[: CONFIG.hidden_size] * CONFIG.scale + getattr(CONFIG, "hidden_size", 0)


def p_getattribute_default_and_hasattr(x):
    missing = getattr(CONFIG, "not_there", 3.0)
    return x * missing if not hasattr(CONFIG, "also_missing") else x


def p_setattr_alias_on_new_object(x):
    c = AliasConfig()
    c.hidden_size = 2  # stored as n_embd
    return x[: c.n_embd] * c.hidden_size


def p_setattr_alias_on_argument(c, x):
    c.hidden_size = 3
    c.scale = c.scale + 1
    return x * c.n_embd


class Celsius:
    def __init__(self, degrees):
        self.degrees = degrees

    @property
    def kelvin(self):
        return self.degrees + 273.0

    @kelvin.setter
    def kelvin(self, value):
        self.degrees = value - 273.0


def p_property_setter(x):
    c = Celsius(x)
    c.kelvin = x * 2
    return c.degrees, c.kelvin


def p_instance_dict_get(c, x):
    extra = c.__dict__.get("extra")
    return x * c.__dict__.get("scale") if extra is None else x + 1


@dataclasses.dataclass
class Frozen:
    a: torch.Tensor
    b: float = 2.0

    def __setattr__(self, name, value):
        raise AttributeError("frozen")


def p_object_setattr_bypasses_override(x):
    f = Frozen.__new__(Frozen)
    object.__setattr__(f, "a", x)
    object.__setattr__(f, "b", 3.0)
    return f.a * f.b


# ---------------------------------------------------------------- dict subclasses


@dataclasses.dataclass
class Output(collections.OrderedDict):
    """A cut-down transformers ModelOutput."""

    last: torch.Tensor | None = None
    extra: tuple | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = self.__dict__.get(field.name)
            if value is not None:
                self[field.name] = value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


def p_model_output_attribute(x):
    return Output(last=x * 2).last + 1


def p_model_output_returned(x):
    out = Output(last=x.relu())
    out["extra"] = (x + 1,)
    return out


def p_model_output_indexing(x):
    out = Output(x * 3, (x - 1,))
    return out[0] + out["extra"][0] + len(out) + ("extra" in out)


def p_model_output_argument(out, x):
    return out.last * x + out["last"] + len(out)


class Registry(dict):
    """transformers' _CanRecordRegistry: keyed by class name, looked up with the object."""

    def __setitem__(self, model, value):
        super().__setitem__(type(model).__name__, value)

    def get(self, model):
        return super().get(type(model).__name__) or {}


REGISTRY = Registry()
LINEAR = nn.Linear(2, 2)
REGISTRY[LINEAR] = {"scale": 3.0}


def p_dict_subclass_overridden_get(x):
    return x * REGISTRY.get(LINEAR).get("scale", 1.0) + len(REGISTRY.get(x))


def p_dict_subclass_made_in_trace(x):
    r = Registry()
    r[x] = 2.0
    return x * r["Tensor"] + len(r)


# ---------------------------------------------------------------- identity-hashed keys


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)


HOLDER = Holder()
SCALES = {HOLDER.a: 2.0, HOLDER.b: -1.0}


def p_module_keyed_dict_in_trace(x):
    seen = {}
    for m in (HOLDER.a, HOLDER.b, HOLDER.a):
        seen[m] = seen.get(m, 0) + 1
    return HOLDER.a(x) * seen[HOLDER.a] + HOLDER.b(x) * seen[HOLDER.b] + len(seen)


def p_module_keyed_dict_global(x):
    out = x
    for m, k in SCALES.items():
        out = out + m(x) * k
    return out * SCALES[HOLDER.b] + (HOLDER in SCALES)


def p_tensor_keyed_dict(x, y):
    d = {x: 1.0, y: 2.0}
    d[x] = d[x] + 1
    return [t * k for t, k in d.items()]


def p_module_keyed_dict_returned(x):
    return {HOLDER.a: x + 1}


# ---------------------------------------------------------------- user mappings


class Interface(MutableMapping):
    """transformers' GeneralInterface: a class-wide mapping plus local overrides."""

    _global = {"double": lambda t: t * 2, "neg": lambda t: -t}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local.update({key: value})

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())


FUNCTIONS = Interface()


def p_user_mapping(x):
    out = FUNCTIONS["double"](x)
    for name in FUNCTIONS:
        out = out + FUNCTIONS[name](x)
    return out * len(FUNCTIONS) + ("neg" in FUNCTIONS) + FUNCTIONS.get("neg")(x)


def p_user_mapping_made_in_trace(x):
    f = Interface()
    f["triple"] = lambda t: t * 3
    return f["triple"](x) + len(f) + list(f).index("triple")


def p_is_compiling(x):
    if torch.compiler.is_compiling():
        return x + 1
    print("eager")
    return x - 1


CASES = [
    (p_decorator_reads_code, [x4]),
    (p_function_metadata, [x4]),
    (p_local_function_code, [x4]),
    (p_getattribute_alias, [x4]),
    (p_getattribute_default_and_hasattr, [x4]),
    (p_setattr_alias_on_new_object, [x4]),
    (p_setattr_alias_on_argument, [AliasConfig, x4]),
    (p_property_setter, [x4]),
    (p_instance_dict_get, [AliasConfig, x4]),
    (p_object_setattr_bypasses_override, [x4]),
    (p_model_output_attribute, [x4]),
    (p_model_output_returned, [x4]),
    (p_model_output_indexing, [x4]),
    (p_model_output_argument, [lambda: Output(last=x4()), x4]),
    (p_dict_subclass_overridden_get, [x4]),
    (p_dict_subclass_made_in_trace, [x4]),
    (p_module_keyed_dict_in_trace, [x4]),
    (p_module_keyed_dict_global, [x4]),
    (p_tensor_keyed_dict, [x4, x4]),
    (p_user_mapping, [x4]),
    (p_user_mapping_made_in_trace, [x4]),
]


@pytest.mark.parametrize(("fn", "makers"), CASES, ids=program_ids(CASES))
def test_program(fn, makers):
    check_program(fn, makers)


def test_is_compiling_is_true_while_capturing():
    compiled = ember.compile(p_is_compiling, backend="eager", fullgraph=True)
    x = x4()
    torch.testing.assert_close(compiled(x), x + 1)
    assert not torch.compiler.is_compiling()


def test_module_keyed_dict_returned():
    result = ember.compile(p_module_keyed_dict_returned, backend="eager", fullgraph=True)(x4())
    assert list(result) == [HOLDER.a]


def test_model_output_result_type_and_attributes():
    x = x4()
    out = check_against_eager(p_model_output_returned, x, frames=1)
    assert type(out) is Output and list(out) == ["last", "extra"]
    torch.testing.assert_close(out.last, x.relu())
    torch.testing.assert_close(out.extra[0], x + 1)


def test_instance_dict_key_guard_recompiles():
    """`c.__dict__.get(k)` guards that k stays absent (or present), not the whole dict."""
    counter = CompileCounter()
    compiled = ember.compile(p_instance_dict_get, backend=counter, fullgraph=True)
    c, x = AliasConfig(), x4()
    compiled(c, x)
    c.unrelated = 1  # another key: same entry
    compiled(c, x)
    assert counter.frame_count == 1
    c.extra = True  # the key that was looked up appears
    assert torch.equal(compiled(c, x), p_instance_dict_get(c, x))
    assert counter.frame_count == 2


def test_module_keyed_global_dict_guard_recompiles():
    def f(x):
        return sum(k * m(x) for m, k in TABLE.items())

    global TABLE
    TABLE = {HOLDER.a: 1.0}
    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    x = x4()
    torch.testing.assert_close(compiled(x), f(x))
    TABLE = {HOLDER.b: 1.0}  # same length and value, another module
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 2


def test_setattr_alias_on_argument_replays_to_the_real_attribute():
    c = AliasConfig()
    ember.compile(p_setattr_alias_on_argument, backend="eager", fullgraph=True)(c, x4())
    assert c.__dict__["n_embd"] == 3 and "hidden_size" not in c.__dict__
    assert c.scale == 3.0


TABLE: dict = {}


class CountedWrites:
    """A `__setattr__` with an effect of its own: the replay must not run it again."""

    def __init__(self):
        self.value = 1.0

    def __setattr__(self, name, value):
        object.__setattr__(self, "writes", self.__dict__.get("writes", 0) + 1)
        object.__setattr__(self, name, value)


def test_overridden_setattr_runs_once_per_write():
    def f(c, x):
        c.value = c.value * 2
        c.other = 3
        return x * c.value

    check_against_eager(f, CountedWrites(), x4(), frames=1)


def test_instance_dict_sees_writes_of_the_trace():
    def f(c, x):
        c.scale = 5.0
        c.fresh = x * 2
        d = c.__dict__
        return x * d.get("scale") + d["fresh"] + ("fresh" in d)

    check_against_eager(f, AliasConfig(), x4(), frames=1)


class Lazy:
    @property
    def missing(self):
        raise AttributeError("not yet")

    @property
    def broken(self):
        raise ValueError("broken")


def p_hasattr_property_raising_attribute_error(x):
    return x + 1 if hasattr(Lazy(), "missing") else x - 1


def p_hasattr_and_getattr_on_a_class(x):
    return x * getattr(Lazy, "scale", 2.0) if not hasattr(Lazy, "nothing") else x


@pytest.mark.parametrize(
    "fn", [p_hasattr_property_raising_attribute_error, p_hasattr_and_getattr_on_a_class]
)
def test_hasattr_sees_attribute_errors(fn):
    check_against_eager(fn, x4(), frames=1)


def test_hasattr_lets_other_exceptions_through():
    """Python's hasattr only swallows AttributeError: a property raising ValueError must not
    read as a missing attribute."""

    def f(x):
        return x + 1 if hasattr(Lazy(), "broken") else x - 1

    with pytest.raises(ember.Unsupported):
        ember.compile(f, backend="eager", fullgraph=True)(x4())
    with pytest.raises(ValueError, match="broken"):
        ember.compile(f, backend="eager")(x4())


def p_temporary_config_flag(c, x):
    """merge_with_config_defaults: set a flag on the config around the call, then delete it."""
    c.is_causal = True
    try:
        out = x * 2 if c.is_causal else x
    finally:
        del c.is_causal
    return out + hasattr(c, "is_causal")


def p_delete_attribute_of_new_object(x):
    c = Celsius(x)
    c.extra = x * 3
    del c.extra
    return c.degrees + hasattr(c, "extra")


@pytest.mark.parametrize("fn", [p_temporary_config_flag, p_delete_attribute_of_new_object])
def test_delete_attribute(fn):
    args = (AliasConfig(), x4()) if fn is p_temporary_config_flag else (x4(),)
    check_against_eager(fn, *args, frames=1)
