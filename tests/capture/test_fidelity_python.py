"""Issue 12's "what to model": functools, collections, C-implemented callables with
arguments, namedtuples and tuple/list subclasses, enums, dataclasses, context managers from
generators, class attributes and descriptors, and default arguments. Each program runs
eagerly, under ember and under torch.compile, and must capture whole (no graph break) where
Dynamo does (see fidelity_harness)."""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import operator
import sys
import types
import typing

import numpy as np
import pytest
import torch
from fidelity_harness import check, tensors

import ember

# functools


def _scale(x, factor, *, bias=0.0):
    """Scales x."""
    return x * factor + bias


SCALE_BY_2 = functools.partial(_scale, factor=2.0)
ADD_ONE = functools.partial(_scale, factor=1.0, bias=1.0)


def p_partial_attributes(x):
    return (
        SCALE_BY_2.func is _scale,
        SCALE_BY_2.args,
        dict(SCALE_BY_2.keywords),
        SCALE_BY_2.func.__name__,
        SCALE_BY_2.func.__doc__,
        hasattr(SCALE_BY_2, "func"),
        hasattr(SCALE_BY_2, "nope"),
        SCALE_BY_2(x),
        ADD_ONE(x),
    )


def p_partial_made_in_trace(x):
    p = functools.partial(_scale, x, bias=3.0)
    return p(2.0), p.args[0] is x, p.keywords["bias"], p.func is _scale


@functools.lru_cache(maxsize=8)
def _cached_table(n):
    return tuple(range(n))


@functools.cache
def _cached_scale(k):
    return k * 10


def p_lru_cache_inlines_the_wrapped_function(x):
    return x * sum(_cached_table(4)) + _cached_scale(2)


def _logged(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **kwargs) + 1

    return inner


@_logged
def _decorated(x):
    """Doc of the decorated."""
    return x * 2


def p_wraps_and_reduce(x):
    total = functools.reduce(operator.add, [x, x * 2, x * 3])
    product = functools.reduce(lambda a, b: a * b, [1, 2, 3, 4], 1)
    return total, product, _decorated(x), _decorated.__name__, _decorated.__wrapped__(x)


# collections


def p_defaultdict_with_factory(x):
    groups = collections.defaultdict(list)
    for i, name in enumerate(["a", "b", "a"]):
        groups[name].append(x * i)
    counts = collections.defaultdict(int)
    counts["z"] += 1
    return dict(groups), dict(counts), type(groups).__name__, "c" in groups


def p_deque(x):
    d = collections.deque([x, x + 1], maxlen=3)
    d.append(x + 2)
    d.append(x + 3)
    d.appendleft(x - 1)
    left = d.popleft()
    d.rotate(1)
    return list(d), left, len(d), d.maxlen


def p_ordered_dict_methods(x):
    od = collections.OrderedDict(a=x, b=x * 2, c=x * 3)
    od.move_to_end("a")
    od.move_to_end("c", last=False)
    last = od.popitem()
    first = od.popitem(last=False)
    return list(od), last, first


def p_counter(x):
    c = collections.Counter(["a", "b", "a", "c", "a"])
    c.update(["b"])
    return dict(c), c.most_common(2), c["zzz"], x * c["a"]


def p_chain_map_and_fromkeys(x):
    defaults = {"scale": 2.0, "shift": 0.0}
    cm = collections.ChainMap({"shift": 1.0}, defaults)
    keys = dict.fromkeys(["p", "q"], 0)
    return x * cm["scale"] + cm["shift"], len(cm), sorted(cm), keys


CONFIG = types.MappingProxyType({"depth": 2, "act": "relu"})


def p_mapping_proxy(x):
    return x * CONFIG["depth"], CONFIG.get("act"), "depth" in CONFIG, len(CONFIG)


# C-implemented callables with arguments


class _Box:
    def __init__(self, value):
        self.value = value

    def scaled(self, k):
        return self.value * k


def p_operator_getters(x):
    first = operator.itemgetter(0)
    pair = operator.itemgetter(1, 0)
    value = operator.attrgetter("value")
    scaled = operator.methodcaller("scaled", 3)
    box = _Box(x)
    rows = [(x, 1), (x * 2, 0)]
    return first(rows[0]), pair(rows[1]), value(box), scaled(box), sorted(rows, key=pair)[0][1]


def p_numpy_dtype_queries(x):
    info = np.finfo(np.float32)
    ints = np.iinfo(np.int8)
    dtype = np.dtype("float32")
    return x * float(info.eps) + ints.max, dtype.itemsize, str(dtype), np.float32(2.0) * 2


# namedtuples and tuple / list subclasses


Point = collections.namedtuple("Point", ["x", "y"], defaults=[0.0])


class Pair(typing.NamedTuple):
    left: torch.Tensor
    right: float = 1.0


class Shape(tuple):
    def area(self):
        return self[0] * self[1]


class Stack(list):
    def top(self):
        return self[-1]


def p_namedtuples(x):
    p = Point(x, 2.0)
    q = p._replace(y=3.0)
    pair = Pair(x)
    return p, q, Point._fields, q._asdict(), pair, pair.right, Pair._fields, Point(1)


def p_tuple_and_list_subclasses(x):
    s = Shape((2, 3))
    st = Stack([x, x + 1])
    st.append(x + 2)
    return s.area(), type(s).__name__, st.top(), len(st), type(st).__name__


def p_trivial_builtins(x):
    return sys.intern("name") == "name", x * len(sys.intern("ab")), isinstance(sys.intern("a"), str)


# enums, dataclasses, context managers


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def p_enums(x, mode=Mode.TRAIN):
    out = x * 2 if mode is Mode.TRAIN else x
    return (
        out,
        mode.value,
        mode.name,
        [m.name for m in Mode],
        Mode("eval") is Mode.EVAL,
        Mode["TRAIN"] == mode,
        Level.HIGH > Level.LOW,
        Level.HIGH + 1,
    )


@dataclasses.dataclass
class Settings:
    scale: float = 2.0
    names: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: int = 5


def p_dataclasses(x):
    s = Settings()
    s.names.append("first")
    t = dataclasses.replace(s, scale=3.0)
    f = Frozen(1)
    return (
        x * t.scale,
        [fl.name for fl in dataclasses.fields(Settings)],
        dataclasses.asdict(s),
        f,
        dataclasses.replace(f, b=7),
        dataclasses.is_dataclass(f),
    )


LOG: list = []


@contextlib.contextmanager
def _scope(tag):
    LOG.append(("enter", tag))
    try:
        yield tag * 2
    finally:
        LOG.append(("exit", tag))


def p_contextmanager(x):
    with _scope(3) as doubled:
        y = x * doubled
    with contextlib.nullcontext(), _scope(1):
        y = y + 1
    return y


# classes: class attributes, __getattr__ / __setattr__, descriptors


class Counter:
    calls = 0


class Lazy:
    def __init__(self):
        self.__dict__["store"] = {}

    def __getattr__(self, name):
        return self.store.get(name, 0)

    def __setattr__(self, name, value):
        self.store[name] = value


class Positive:
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, owner=None):
        return getattr(obj, self.name) if obj is not None else self

    def __set__(self, obj, value):
        setattr(obj, self.name, abs(value))


class WithDescriptor:
    size = Positive()

    def __init__(self, size):
        self.size = size


def p_class_attribute_set(x):
    Counter.calls += 1
    return x * Counter.calls


def p_getattr_setattr_descriptors(x):
    lazy = Lazy()
    lazy.width = 3
    d = WithDescriptor(-4)
    return x * lazy.width + lazy.height, d.size, d._size


def _with_default(x, k=2):
    return x * k


def p_default_argument(x):
    return _with_default(x)


@pytest.mark.parametrize(
    "fn",
    [
        p_partial_attributes,
        p_partial_made_in_trace,
        p_lru_cache_inlines_the_wrapped_function,
        p_wraps_and_reduce,
        p_defaultdict_with_factory,
        p_deque,
        p_ordered_dict_methods,
        p_counter,
        p_chain_map_and_fromkeys,
        p_mapping_proxy,
        p_operator_getters,
        p_numpy_dtype_queries,
        p_namedtuples,
        p_tuple_and_list_subclasses,
        p_trivial_builtins,
        p_enums,
        p_dataclasses,
        p_contextmanager,
        p_getattr_setattr_descriptors,
    ],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_python_models(fn):
    counts = check(fn, tensors((2,)), state=lambda: list(LOG), reset=LOG.clear)
    assert counts.breaks == 0, counts


def test_class_attribute_write_is_replayed():
    Counter.calls = 0
    check(
        p_class_attribute_set,
        tensors((2,)),
        state=lambda: Counter.calls,
        reset=lambda: setattr(Counter, "calls", 0),
    )


def test_changed_default_argument_is_guarded():
    import ember
    from ember.testing import CompileCounter

    counter = CompileCounter()
    compiled = ember.compile(p_default_argument, backend=counter)
    x = torch.ones(2)
    assert compiled(x).tolist() == [2.0, 2.0]
    saved = _with_default.__defaults__
    _with_default.__defaults__ = (5,)
    try:
        assert compiled(x).tolist() == [5.0, 5.0]
    finally:
        _with_default.__defaults__ = saved
    assert compiled(x).tolist() == [2.0, 2.0]
    assert counter.frame_count == 2


# introspection of functions and objects from outside


def _chunk(hidden, mask=None):
    return hidden * 2


class _Layer:
    def ff(self, hidden):
        return hidden + 1


LAYER = _Layer()
VALIDATORS = {typing.Union: "union", list: "list", None: "none"}
OPTIONAL_INT = typing.Union[int, None]  # noqa: UP007  (a typing form, as libraries use)


def p_signature_id_and_identity_keys(x):
    plain = len(inspect.signature(_chunk).parameters)
    bound = list(inspect.signature(LAYER.ff).parameters)
    same = id(LAYER) == id(LAYER) and id(_chunk) != id(LAYER)
    kind = VALIDATORS.get(typing.get_origin(OPTIONAL_INT))
    return x * plain, bound, same, kind, VALIDATORS.get(list)


def test_signature_id_and_identity_keyed_dicts():
    counts = check(p_signature_id_and_identity_keys, tensors((2,)))
    assert counts.breaks == 0


class _Config:
    def __init__(self):
        self.sizes = [1, 2]
        self.name = "base"
        self.extra = {"k": [3]}


CONFIG_OBJ = _Config()


def p_copy_and_deepcopy(x):
    shallow = copy.copy(CONFIG_OBJ)
    deep = copy.deepcopy(CONFIG_OBJ)
    deep.sizes.append(3)
    deep.extra["k"].append(4)
    delattr(deep, "name")
    nested = copy.deepcopy({"a": [1, [2]], "b": (3, [4])})
    return (
        x * len(deep.sizes),
        CONFIG_OBJ.sizes,
        shallow.sizes is CONFIG_OBJ.sizes,
        deep.sizes is CONFIG_OBJ.sizes,
        hasattr(deep, "name"),
        nested,
        deep.extra,
    )


def test_copy_and_deepcopy_of_plain_data():
    counts = check(p_copy_and_deepcopy, tensors((2,)))
    assert counts.breaks == 0


# sorting and picking with key functions, and imports that fail (session 11 probes)


def p_list_sort_with_key(x):
    lst = [3, 1, 2]
    lst.sort(key=lambda v: -v)
    names = ["bb", "a", "ccc"]
    names.sort(key=len, reverse=True)
    return x * lst[0], max(lst, key=lambda v: (v % 2, v)), min(names, key=len), names


def p_max_by_key_over_tensors(x):
    ts = [x, x * 2, x + 1]
    sizes = [(t.shape[0], i) for i, t in enumerate(ts)]
    best = max(range(3), key=lambda i: sizes[i])
    return ts[best], max([], key=len, default=None), min([5, 3, 3], key=lambda v: v)


def p_sort_tensors_by_shape(x):
    ts = [x[:2], x, x[:1]]
    ts.sort(key=lambda t: t.shape[0])
    return [t.sum() for t in ts]


def p_max_of_nothing_raises(x):
    try:
        max([], key=len)
    except ValueError as e:  # the running Python's own message
        return x * len(str(e))


def p_optional_import(x):
    try:
        import not_a_module_ember_probe  # noqa: F401
    except ImportError as e:
        return x * len(e.name), type(e).__name__


@pytest.mark.parametrize(
    "fn",
    [
        p_list_sort_with_key,
        p_max_by_key_over_tensors,
        p_sort_tensors_by_shape,
        p_max_of_nothing_raises,
        p_optional_import,
    ],
)
def test_keys_and_imports(fn):
    """`list.sort(key=)` and `max/min(key=)` broke ("needs the function as a Python value",
    "compares them in Python"); a failed import inside `try` escaped ember as an exception
    of the capture itself (ModuleNotFoundError from the trace)."""
    counts = check(fn, tensors((4, 3)))
    assert counts.breaks == 0


def test_arguments_that_do_not_fit_raise_cpythons_error():
    """A compiled function (or a module's forward reached through break code) called with
    arguments that do not fit raises CPython's TypeError, not inspect's wording ("too many
    positional arguments"); nothing of the function runs."""
    ran = []

    def two(x, y, *, scale=1):
        ran.append(1)
        return x * y * scale

    def module_with_two_inputs(x):
        return torch.nn.Linear(3, 2)(x, x)

    compiled = ember.compile(two)
    for args, kwargs in [((1, 2, 3), {}), ((1,), {}), ((1, 2), {"shift": 1})]:
        with pytest.raises(TypeError) as eager:
            two(*args, **kwargs)
        with pytest.raises(TypeError) as ours:
            compiled(*args, **kwargs)
        assert str(ours.value) == str(eager.value)
    assert not ran
    compiled(torch.ones(2), torch.ones(2))  # with an entry, the guard meets them first
    for args, kwargs in [((1, 2, 3), {}), ((1,), {}), ((1, 2), {"shift": 1})]:
        with pytest.raises(TypeError) as eager:
            two(*args, **kwargs)
        with pytest.raises(TypeError) as ours:
            compiled(*args, **kwargs)
        assert str(ours.value) == str(eager.value)  # said `___guard() takes ...`
    with pytest.raises(TypeError) as eager:
        module_with_two_inputs(torch.randn(2, 3))
    with pytest.raises(TypeError) as ours:
        ember.compile(module_with_two_inputs)(torch.randn(2, 3))
    assert str(ours.value) == str(eager.value)


# numpy scalars (np.finfo(...).eps, np.float64 sizes and data) in tensor ops


def p_numpy_scalar_constants(x):
    return x * np.finfo(np.float32).eps + np.iinfo(np.int8).max, np.dtype("float32").itemsize


def p_numpy_ufuncs_on_constants(x):
    return x * np.sqrt(2.0) + np.pi, float(np.float32(1.5)), x.half() * np.float64(2.5)


def p_numpy_sizes_and_fill(x):
    return x.view(np.int64(4), -1), torch.full((2,), np.float64(1.5)), torch.zeros(np.int64(3))


def p_numpy_data_decides_dtype(x):
    made = torch.tensor(np.float64(2.0)), torch.tensor([np.float32(1.0), 2.0])
    return x + made[0], made, [t.dtype for t in made], torch.as_tensor(np.int16(3)).dtype


@pytest.mark.parametrize(
    "fn",
    [
        p_numpy_scalar_constants,
        p_numpy_ufuncs_on_constants,
        p_numpy_sizes_and_fill,
        p_numpy_data_decides_dtype,
    ],
)
@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_numpy_scalars_in_tensor_ops(fn, backend):
    """A numpy scalar in a graph was written into its code as `np.float32(...)`, which the
    graph module could not resolve (NameError under the eager backend), and made ember's
    aot stage fail (BackendCompilerFailed). It reaches the graph as the Python number torch
    takes it for; where its dtype decides a new tensor's (torch.tensor), that dtype is
    passed explicitly."""
    counts = check(fn, tensors((4, 6)), backend=backend)
    assert counts.breaks == 0


# objects with __slots__ (their attributes live in member descriptors, not a __dict__)


class _Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = 2


SLOTTED = _Slotted()


def _reset_slotted():
    SLOTTED.a = 2
    if hasattr(SLOTTED, "b"):
        del SLOTTED.b


@dataclasses.dataclass(slots=True)
class _SlotsConfig:
    k: int = 3
    t: torch.Tensor | None = None


def p_slot_read(x):
    return x * SLOTTED.a, hasattr(SLOTTED, "b"), getattr(SLOTTED, "b", 7)


def p_slot_write(x):
    SLOTTED.a = SLOTTED.a + 1
    return x * SLOTTED.a


def p_slots_dataclass(x, config):
    return x * config.k + config.t


def test_slots_are_read_and_written():
    """Slots broke ("an object ember cannot look into", "goes through a member_descriptor
    descriptor"); now read through the descriptor, guarded, and written via the ledger."""
    for fn in (p_slot_read, p_slot_write):
        counts = check(fn, tensors((3,)), state=lambda: SLOTTED.a, reset=_reset_slotted)
        assert counts.breaks == 0
    made = lambda: (*tensors((3,))(), _SlotsConfig(3, torch.ones(3)))  # noqa: E731
    assert check(p_slots_dataclass, made, compare_args=False).breaks == 0
    compiled = ember.compile(lambda x: x * SLOTTED.a)
    for value in (2, 5, 2):
        SLOTTED.a = value
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), float(value)))
    _reset_slotted()
