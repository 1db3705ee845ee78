"""Differential programs on user code: functions and methods (inlined), user objects,
dataclasses and namedtuples holding tensors (as inputs and as results), super(),
properties, classmethods/staticmethods, dunder operators and functools.partial."""

from __future__ import annotations

import collections
import dataclasses
import functools
import typing

import pytest
import torch

from ember.testing import check_against_eager, check_program, program_ids


def x4():
    return torch.randn(4)


Pair = collections.namedtuple("Pair", ["a", "b"])


class Typed(typing.NamedTuple):
    value: torch.Tensor
    scale: float = 2.0


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    labels: torch.Tensor
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 4
    act: str = "relu"


class Vec:
    """A user class with operators and a property."""

    def __init__(self, data, tag="v"):
        self.data = data
        self.tag = tag

    def __add__(self, other):
        return Vec(self.data + other.data, self.tag)

    def __mul__(self, k):
        return Vec(self.data * k, self.tag)

    def __rmul__(self, k):
        return Vec(self.data * k, self.tag)

    def __neg__(self):
        return Vec(-self.data, self.tag)

    @property
    def norm(self):
        return self.data.norm()

    def scaled(self, k=2.0):
        return self.data * k

    @classmethod
    def zeros(cls, n):
        return cls(torch.zeros(n))

    @staticmethod
    def combine(a, b):
        return a * b


class Base:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


class Child(Base):
    def __init__(self, k, shift):
        super().__init__(k)
        self.shift = shift

    def apply(self, x):
        return super().apply(x) + self.shift


class Explicit(Base):
    def apply(self, x):
        return super(Explicit, self).apply(x) - 1  # noqa: UP008  (two-argument super is tested)


class Counter:
    def __init__(self):
        self.calls = 0
        self.history = []

    def record(self, t):
        self.calls += 1
        self.history.append(t)
        return t


def user_helper(x, y=1.0):
    return x.sin() * y


def user_calls_user(x):
    return user_helper(x) + user_helper(x, y=2.0)


# ---------------------------------------------------------------- programs


def p_user_functions(x):
    return user_calls_user(x) + user_helper(x, 3.0)


def p_namedtuple_in(p):
    return p.a * p.b + p[0]


def p_namedtuple_out(x):
    return Pair(x, x * 2)


def p_namedtuple_methods(x):
    p = Pair(a=x, b=x + 1)
    q = p._replace(b=x * 10) if hasattr(p, "_replace") and False else p
    a, b = q
    return Pair._make([a, b]) if False else Pair(b, a)


def p_typed_namedtuple(t):
    return Typed(t.value * t.scale), t.scale, Typed(t.value).scale


def p_dataclass_in(batch):
    return (batch.inputs * batch.weight - batch.labels).pow(2).mean()


def p_dataclass_out(x):
    return Batch(x, x.argmax(), weight=0.5)


def p_dataclass_fields_and_config(x):
    cfg = Config(hidden=2)
    names = [f.name for f in dataclasses.fields(cfg)]
    out = x.repeat(cfg.hidden)
    return getattr(torch, cfg.act)(out), names


def p_user_object_in(v):
    return v.data * 2 + v.scaled(), v.tag


def p_user_object_out(x):
    return Vec(x * 2, tag="out")


def p_user_object_operators(x, y):
    a, b = Vec(x), Vec(y)
    c = a + b
    d = 2 * c * 3
    return (-d).data, c.norm


def p_user_classmethod_staticmethod(x):
    z = Vec.zeros(4)
    return Vec.combine(x, 2) + z.data + Vec(x).combine(x, x)


def p_super_zero_arg(x):
    return Child(2.0, 1.0).apply(x)


def p_super_explicit(x):
    return Explicit(3.0).apply(x)


def p_method_of_arg(c, x):
    return c.apply(x)


def p_bound_method_global(x):
    return BOUND(x)


def p_object_attribute_mutation(counter, x):
    y = counter.record(x * 2)
    counter.calls += 10
    return y


def p_new_object_attr_updates(x):
    c = Counter()
    c.record(x)
    c.record(x + 1)
    return c.calls, c.history


def p_partial_global(x):
    return PARTIAL(x)


def p_partial_local(x):
    scale = functools.partial(torch.mul, other=3.0)
    clamp = functools.partial(torch.clamp, min=-0.5)
    return scale(x) + clamp(x, max=0.5)


def p_partial_user_function(x):
    f = functools.partial(user_helper, y=4.0)
    return f(x) + functools.partial(user_helper, x)()


def p_lambda_attribute_holder(x):
    holder = Vec(x)
    holder.fn = lambda t: t + 1
    return holder.fn(holder.data)


BOUND = Child(2.0, -1.0).apply
PARTIAL = functools.partial(user_helper, y=0.5)


CASES = [
    (p_user_functions, [x4]),
    (p_namedtuple_in, [lambda: Pair(x4(), x4())]),
    (p_namedtuple_out, [x4]),
    (p_namedtuple_methods, [x4]),
    (p_typed_namedtuple, [lambda: Typed(x4(), 3.0)]),
    (p_dataclass_in, [lambda: Batch(x4(), x4(), 0.3)]),
    (p_dataclass_out, [x4]),
    (p_dataclass_fields_and_config, [x4]),
    (p_user_object_in, [lambda: Vec(x4(), "in")]),
    (p_user_object_out, [x4]),
    (p_user_object_operators, [x4, x4]),
    (p_user_classmethod_staticmethod, [x4]),
    (p_super_zero_arg, [x4]),
    (p_super_explicit, [x4]),
    (p_method_of_arg, [lambda: Child(1.5, 0.5), x4]),
    (p_bound_method_global, [x4]),
    (p_object_attribute_mutation, [Counter, x4]),
    (p_new_object_attr_updates, [x4]),
    (p_partial_global, [x4]),
    (p_partial_local, [x4]),
    (p_partial_user_function, [x4]),
    (p_lambda_attribute_holder, [x4]),
]


@pytest.mark.parametrize(("fn", "makers"), CASES, ids=program_ids(CASES))
def test_program(fn, makers):
    check_program(fn, makers)


def test_mutation_of_argument_object_is_replayed():
    import ember

    def f(c, x):
        c.record(x)
        c.calls = c.calls + 1
        return x + 1

    compiled = ember.compile(f, backend="eager", fullgraph=True)
    eager_c, comp_c = Counter(), Counter()
    x = x4()
    for _ in range(2):
        f(eager_c, x)
        compiled(comp_c, x)
    assert comp_c.calls == eager_c.calls == 4
    assert len(comp_c.history) == 2 and all(t is x for t in comp_c.history)


def test_swapped_attributes_are_replayed_from_old_values():
    def f(v, x):
        v.data, v.tag = x * 2, v.data
        return x

    check_against_eager(f, Vec(x4(), "t"), x4(), frames=1)


def test_value_read_before_a_replayed_store_is_returned():
    def f(v, x):
        old = v.data
        v.data = x * 2
        return old, v.data

    check_against_eager(f, Vec(x4(), "t"), x4(), frames=1)


def test_dict_rebuilt_from_its_own_items():
    def f(d, x):
        d["a"], d["b"] = d["b"], d["a"] * x
        return x + 1

    check_against_eager(f, {"a": x4(), "b": x4()}, x4(), frames=1)


def test_list_rotated_in_place():
    def f(xs):
        xs[:] = xs[1:] + xs[:1]
        return xs[0] * 2

    check_against_eager(f, [x4(), x4(), x4()], frames=1)


class Scope:
    """A context manager written in Python: both methods are inlined."""

    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


@dataclasses.dataclass
class WithFactory:
    x: torch.Tensor
    items: list = dataclasses.field(default_factory=list)


class Outer:
    def __init__(self, inner, items):
        self.inner = inner
        self.items = items


class MyLinear(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


MY_LINEAR = MyLinear(4, 4)


def p_user_context_managers(x, log):
    import contextlib

    with contextlib.nullcontext():
        y = x + 1
    with Scope(log) as scope:
        y = y * len(scope.log)
    return y


def p_namedtuple_replace_asdict(x):
    p = Pair(x, 1)
    return p._replace(b=x * 2), p._asdict()


def p_dataclass_default_factory(x):
    d = WithFactory(x)
    d.items.append(x * 2)
    return d


def p_nested_objects_out(x):
    return Outer(Vec(x * 2), [x, 3, Pair(x, x)])


def p_super_forward_of_torch_module(x):
    return MY_LINEAR(x)


MORE = [
    (p_user_context_managers, [x4, list]),
    (p_namedtuple_replace_asdict, [x4]),
    (p_dataclass_default_factory, [x4]),
    (p_nested_objects_out, [x4]),
    (p_super_forward_of_torch_module, [x4]),
]


@pytest.mark.parametrize(("fn", "makers"), MORE, ids=program_ids(MORE))
def test_more_programs(fn, makers):
    check_program(fn, makers)


def test_value_read_before_a_replayed_store_survives_a_graph_break(capsys):
    import ember

    def f(v, x):
        old = v.data
        v.data = x * 2
        print("graph break here")
        return old, v.data

    compiled = ember.compile(f, backend="eager")
    for _ in range(2):
        x = x4()
        v_eager, v_compiled = Vec(torch.ones(4)), Vec(torch.ones(4))
        from ember.testing import assert_same

        assert_same(compiled(v_compiled, x), f(v_eager, x))
        assert_same(v_compiled.data, v_eager.data)


class _Layers(collections.abc.Sequence):
    """A Sequence through the ABC's mixins only: iterating it steps self[i] until IndexError
    (transformers' per-layer config view)."""

    def __init__(self, scales):
        self.scales = scales

    def __len__(self):
        return len(self.scales)

    def __getitem__(self, i):
        if i >= len(self.scales):
            raise IndexError("list index out of range")
        return self.scales[i]


def test_sequence_mixin_iteration_is_captured_whole():
    layers = _Layers([1.0, 2.0, 3.0])

    def f(x):
        for s in layers:
            x = x * s + 1
        return x, list(reversed([s for s in layers]))

    check_program(f, [lambda: torch.randn(4)])


def test_environment_reads_are_captured_and_guarded(monkeypatch):
    """os.environ's `get` and `in` catch a missing variable's KeyError, which traced code
    cannot: the environment is read as a dict (transformers reads it in attention), guarded
    on its names and values, so setting a variable recompiles with the new answer."""
    import os

    import ember

    monkeypatch.delenv("EMBER_TEST_FLAG", raising=False)

    def f(x):
        if os.environ.get("EMBER_TEST_FLAG", "0") == "1" or "EMBER_TEST_OTHER" in os.environ:
            return x * 2
        return x + 1

    check_program(f, [lambda: torch.randn(4)])
    compiled = ember.compile(f, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), x + 1)
    monkeypatch.setenv("EMBER_TEST_FLAG", "1")
    torch.testing.assert_close(compiled(x), x * 2)
