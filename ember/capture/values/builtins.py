"""Builtins and special torch calls, keyed by the function object itself.

Each handler takes `(tx, args, kwargs)` of symbolic values and returns a symbolic value.
Pure functions not listed here (math, operator on constants, methods of immutable constants)
are folded when every argument is a constant; anything else is refused with its name.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import dataclasses
import functools
import heapq
import math
import operator
import sys
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ember import torch_compat
from ember.capture.guards import GuardKind
from ember.capture.shapes import is_symbolic
from ember.capture.values import compiler
from ember.capture.values.base import (
    ConstantValue,
    FoldingRaised,
    Value,
    all_constant,
    from_class_statement,
)
from ember.capture.values.containers import (
    DictValue,
    IteratorValue,
    ListValue,
    SliceValue,
    TupleValue,
    iter_of,
    iterator_over,
)
from ember.capture.values.exceptions import TracedRaise, raise_in_trace
from ember.capture.values.functions import PartialValue
from ember.capture.values.sets import SetValue
from ember.capture.values.tensor import TensorValue, tensor_op
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

Handler = Callable[["Translator", list[Value], dict[str, Value]], Value]
BUILTINS: dict[Any, Handler] = {}


def handles(*fns: Any) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for fn in fns:
            BUILTINS[fn] = handler
        return handler

    return register


def _nothing_handled(fn: Any) -> Handler:
    """`sys.exc_info()` / `sys.exception()` outside any handler, in the trace and in the
    caller (guarded: a call from an `except` block captures again): nothing is being
    handled (contextlib.ExitStack.__exit__ asks). Inside a handler the traceback is
    CPython's: a break."""

    def handler(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        from ember.capture.sources import HandledExceptionSource

        if args or kwargs or tx.ctx.handling is not None or sys.exc_info()[1] is not None:
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"sys.{fn.__name__}() while an exception is handled (CPython's to answer)",
            )
        tx.ctx.guards.add(GuardKind.NONE_MATCH, HandledExceptionSource(), None)
        if fn is sys.exc_info:
            return TupleValue([ConstantValue(None)] * 3)
        return ConstantValue(None)

    return handler


BUILTINS[sys.exc_info] = _nothing_handled(sys.exc_info)
if hasattr(sys, "exception"):  # 3.11+
    BUILTINS[sys.exception] = _nothing_handled(sys.exception)


@handles(builtins.__build_class__)
def _class_statement(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A class statement: its body runs in CPython at a break (as under torch.compile), and
    the class it makes is an ordinary user class to the capture after the statement."""
    raise Unsupported(
        BreakReason.UNSUPPORTED_CALL,
        "class statement (the class body runs in CPython)",
        hint="define the class outside the compiled function to keep one graph",
    )


@handles(torch.autograd.profiler.record_function)
def _profiler_range(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A profiler range opened in traced code (every optimizer step opens one) is a
    `contextlib.nullcontext()`: compiled code has no per-op ranges to mark, and torch.compile
    drops them too. A range entered outside the compiled function is untouched."""
    return tx.ctx.builder.wrap_const(contextlib.nullcontext).call(tx, [], {})


def _foreach_scaled_by_a_tensor(fn: Any, combine: Any, inplace: bool) -> Handler:
    """`torch._foreach_addcdiv_(xs, as, bs, scales)` with a tensor of scales, one per tensor
    (torch.optim's foreach Adam while compiling): the op wants that tensor on the CPU, which
    meta tensors are not, so it is written as `xs += as / bs * scales[i]` with foreach ops
    (the scales indexed in the graph), as for `addcdiv_(value=t)`."""

    def handler(tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if len(args) != 4 or kwargs or not isinstance(args[3], TensorValue):
            return tensor_op(tx, "call_function", fn, args, kwargs)
        xs, left, right, scales = args
        count = len(xs.iterate(tx))
        each = [
            tensor_op(tx, "call_function", operator.getitem, [scales, ConstantValue(i)], {})
            for i in range(count)
        ]
        combined = tensor_op(tx, "call_function", combine, [left, right], {})
        terms = tensor_op(tx, "call_function", torch._foreach_mul, [combined, ListValue(each)], {})
        add = torch._foreach_add_ if inplace else torch._foreach_add
        return tensor_op(tx, "call_function", add, [xs, terms], {})

    return handler


for _fn, _combine in (
    (torch._foreach_addcdiv_, torch._foreach_div),
    (torch._foreach_addcdiv, torch._foreach_div),
    (torch._foreach_addcmul_, torch._foreach_mul),
    (torch._foreach_addcmul, torch._foreach_mul),
):
    BUILTINS[_fn] = _foreach_scaled_by_a_tensor(_fn, _combine, _fn.__name__.endswith("_"))


_PURE_BUILTINS = {
    abs,
    all,
    any,
    ascii,
    bin,
    bool,
    chr,
    divmod,
    float,
    format,
    hash,
    hex,
    int,
    len,
    max,
    min,
    oct,
    ord,
    pow,
    repr,
    round,
    sorted,
    str,
    sum,
    tuple,
    frozenset,
    complex,
    isinstance,
    issubclass,
    callable,
    sys.intern,
}


def is_pure(fn: Any) -> bool:
    """Safe to call at trace time on constants: no side effects, result fixed by arguments."""
    if fn in _PURE_BUILTINS:
        return True
    module = getattr(fn, "__module__", None)
    if module in ("math", "operator", "_operator", "cmath"):
        return True
    if is_numpy_ufunc(fn):  # np.sqrt(2.0): folded only when every argument is a constant
        return True
    owner = getattr(fn, "__self__", None)
    return isinstance(
        owner,
        (
            str,
            int,
            float,
            bytes,
            tuple,
            frozenset,
            complex,
            range,
            slice,
            torch.dtype,
            torch.device,
            torch.Size,
            types.MappingProxyType,
        ),
    )


def is_numpy_ufunc(fn: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(fn, numpy.ufunc)


def _const(tx: Translator, value: Any) -> Value:
    return tx.ctx.builder.wrap_const(value)


@handles(len)
def _len(tx, args, kwargs):
    return ConstantValue(args[0].length(tx))


@handles(hash)
def _hash(tx, args, kwargs):
    """`hash(obj)` of a class written in Python: its `__hash__` inlined (the int it gives,
    reduced as hash() reduces it), or the TypeError of a class that set it to None (one
    that defines `__eq__` only). Constants fold; other objects break as before."""
    from ember.capture.values.exceptions import ExceptionValue
    from ember.capture.values.functions import BuiltinValue
    from ember.capture.values.objects import UserObjectValue

    obj = args[0] if len(args) == 1 and not kwargs else None
    if isinstance(obj, UserObjectValue) and not isinstance(obj, ExceptionValue):
        method = next(
            (k.__dict__["__hash__"] for k in obj.cls.__mro__ if "__hash__" in k.__dict__), None
        )
        if method is None:
            message = f"unhashable type: '{obj.cls.__name__}'"
            raise_in_trace(tx, TypeError, [ConstantValue(message)], f"TypeError: {message}")
        if isinstance(method, types.FunctionType):
            result = obj.type_method(tx, "__hash__").call(tx, [], {})
            if result.is_constant() and type(result.as_constant()) is int:
                return ConstantValue(hash(result.as_constant()))
    return BuiltinValue(hash).call_unlisted(tx, args, kwargs)


@handles(isinstance)
def _isinstance(tx, args, kwargs):
    cls = _class_operand(tx, args[1])
    buffer = getattr(torch.nn, "Buffer", None)
    if buffer is not None and isinstance(args[0], TensorValue) and buffer in _flat_classes(cls):
        # nn.Buffer's metaclass: a tensor marked `_is_buffer` is one (tensor.py)
        if args[0].is_buffer_marked(tx):
            return ConstantValue(True)
    try:
        return ConstantValue(issubclass(args[0].python_type(), cls))
    except TypeError as exc:  # a subscripted generic: eager's isinstance raises the same
        raise FoldingRaised(exc, f"TypeError: {exc}") from None


def _flat_classes(cls: Any) -> list[Any]:
    """The classes an isinstance operand names (a class, or nested tuples of them)."""
    if isinstance(cls, tuple):
        return [c for part in cls for c in _flat_classes(part)]
    return [cls]


@handles(issubclass)
def _issubclass(tx, args, kwargs):
    return ConstantValue(issubclass(args[0].as_constant(), _class_operand(tx, args[1])))


def _class_operand(tx: Translator, value: Value) -> Any:
    """The class (or tuple of them) `isinstance`/`issubclass` test against. A typing alias
    from outside (`typing.Sequence`, `typing.Dict`) is one too: its `__subclasscheck__`
    asks its origin class (pinned by an identity guard, as a global may be rebound)."""
    from ember.capture.guards import GuardKind

    real = tx.ctx.builder.real_object(value) if value.source is not None else None
    if real is not None and type(real).__module__ == "typing" and hasattr(real, "__origin__"):
        tx.ctx.guards.add(GuardKind.ID_MATCH, value.source, real)
        return real
    return value.as_constant()


@handles(callable)
def _callable(tx, args, kwargs):
    # an object is callable when its type defines __call__ (a class is: `type` defines it)
    kind = args[0].python_type()
    return ConstantValue(any("__call__" in k.__dict__ for k in kind.__mro__))


@handles(type)
def _type(tx, args, kwargs):
    if len(args) == 3 and not kwargs:
        from ember.capture.values.made_classes import make_type

        return make_type(tx, args)
    if len(args) != 1:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "type() with three arguments")
    return _const(tx, args[0].python_type())


@handles(id)
def _id(tx, args, kwargs):
    """The address of an object from outside, which the guard then pins (the entry is
    dropped if it dies). Objects the trace makes, and tensors (a new one every call), have
    no address known while tracing: an IdValue (values/identity.py)."""
    from ember.capture.guards import GuardKind
    from ember.capture.values.identity import IdValue

    value = args[0]
    real = tx.ctx.builder.real_object(value)
    if real is None or value.source is None or isinstance(value, TensorValue):
        return IdValue(value)
    tx.ctx.guards.add(GuardKind.ID_MATCH, value.source, real)
    return ConstantValue(id(real))


@handles(range)
def _range(tx, args, kwargs):
    return ConstantValue(range(*(a.as_constant() for a in args)))


@handles(reversed)
def _reversed(tx, args, kwargs):
    return IteratorValue(list(reversed(args[0].iterate(tx))))


@handles(iter)
def _iter(tx, args, kwargs):
    from ember.capture.values.iterators import ObjectIterator

    it = iter_of(tx, args[0])
    return it.obj if isinstance(it, ObjectIterator) else it  # `iter(obj) is obj`


@handles(next)
def _next(tx, args, kwargs):
    from ember.capture.values.exceptions import ExceptionValue
    from ember.capture.values.objects import UserObjectValue

    it = args[0]
    if isinstance(it, UserObjectValue) and not isinstance(it, ExceptionValue):
        return _next_of_object(tx, it, args[1:])
    if not isinstance(it, IteratorValue):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"next() on {it.describe()}")
    value = it.next(tx)
    if value is None:
        if len(args) > 1:
            return args[1]
        raise_in_trace(tx, StopIteration, it.stop_arguments(), "StopIteration from next()")
    return value


def _next_of_object(tx, obj, default: list) -> Value:
    """`next(obj)` of a class written in Python: its `__next__`, inlined; a StopIteration
    it raises gives the default, if there is one."""
    from ember.capture.values.objects import python_override

    method = obj.type_method(tx, "__next__")
    if method is None or not isinstance(python_override(obj.cls, "__next__"), types.FunctionType):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"next() on {obj.describe()}")
    if not default:
        return method.call(tx, [], {})
    try:
        return method.call(tx, [], {})
    except TracedRaise as raised:
        if issubclass(raised.value.cls, StopIteration):
            return default[0]
        raise


@handles(list)
def _list(tx, args, kwargs):
    return ListValue(args[0].iterate(tx) if args else [])


@handles(tuple)
def _tuple(tx, args, kwargs):
    return TupleValue(args[0].iterate(tx) if args else [])


@handles(dict)
def _dict(tx, args, kwargs):
    result = DictValue({})
    if args:
        result.call_method(tx, "update", args, {})
    for k, v in kwargs.items():
        result.items[k] = v
    return result


@handles(set, frozenset)
def _set(tx, args, kwargs):
    result = SetValue()
    if args:
        result.update(tx, args[0])
    return result


@handles(frozenset)
def _frozenset(tx, args, kwargs):
    if args and isinstance(args[0], SetValue) and args[0].frozen:
        return args[0]  # frozenset(f) is f
    result = _set(tx, args, kwargs)
    result.frozen = True
    return result


@handles(slice)
def _slice(tx, args, kwargs):
    return SliceValue(list(args))


def _fold_or_tensor(fn: Any, tensor_fn: Any) -> Handler:
    def handler(tx, args, kwargs):
        if args and isinstance(args[0], TensorValue):
            return tensor_op(tx, "call_function", tensor_fn, args, kwargs)
        return ConstantValue(fn(*(a.as_constant() for a in args)))

    return handler


BUILTINS[abs] = _fold_or_tensor(abs, abs)
BUILTINS[round] = _fold_or_tensor(round, torch.round)


def _to_python(fn: Any) -> Handler:
    def handler(tx, args, kwargs):
        from ember.capture.values.objects import ModuleValue, UserObjectValue

        if args and isinstance(args[0], TensorValue):
            args[0].call_method(tx, "item", [], {})  # raises TENSOR_TO_PYTHON
        texts = (UserObjectValue, ModuleValue)
        if fn in (str, repr, format) and args and isinstance(args[0], texts):
            spec = args[1].as_constant() if len(args) > 1 else ""
            text = args[0].text(tx, fn, spec)
            if text is not None:
                return text
        return ConstantValue(fn(*(a.as_constant() for a in args)))

    return handler


for _fn in (int, float, complex, str, repr, format):
    BUILTINS[_fn] = _to_python(_fn)


@handles(bool)
def _bool(tx, args, kwargs):
    return ConstantValue(args[0].truth(tx) if args else False)


def _reduce_items(tx: Translator, args: list[Value]) -> list[Value]:
    return args[0].iterate(tx) if len(args) == 1 else list(args)


_INTS = (int, torch.SymInt)


def _min_max_for(fn: Any) -> Handler:
    def handler(tx, args, kwargs):
        items = _reduce_items(tx, args)
        if "key" in kwargs and set(kwargs) <= {"key", "default"}:
            return _extreme_by_key(tx, fn, items, kwargs)
        if set(kwargs) == {"default"} and len(args) == 1:
            if not items:
                return kwargs["default"]
            kwargs = {}
        if all_constant(items) and not kwargs:
            values = [v.symbolic() for v in items]
            if any(map(is_symbolic, values)) and all(type(v) in _INTS for v in values):
                # a size symbol: torch.sym_max/sym_min keep it one, with no guard
                pick = torch.sym_max if fn is max else torch.sym_min
                return ConstantValue(functools.reduce(pick, values))
            return ConstantValue(fn(v.as_constant() for v in items))
        raise Unsupported(
            BreakReason.DATA_DEPENDENT_BRANCH,
            f"{fn.__name__}() over non-constant values compares them in Python",
            hint=f"use torch.{'minimum' if fn is min else 'maximum'} for tensors",
        )

    return handler


def _extreme_by_key(tx: Translator, fn: Any, items: list[Value], kwargs: dict) -> Value:
    """`max(items, key=f)` / `min(...)`: the first item whose key no later key beats, the
    keys compared as `sorted` compares them (`default=` for no items)."""
    from ember.capture.operators import less_than

    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        try:
            fn([])
        except ValueError as error:  # the running Python's own message
            raise_in_trace(tx, ValueError, [ConstantValue(str(error))], str(error))
    keys = _keys(tx, items, kwargs["key"])
    best = 0
    for i in range(1, len(items)):
        if less_than(tx, *((keys[best], keys[i]) if fn is max else (keys[i], keys[best]))):
            best = i
    return items[best]


BUILTINS[min] = _min_max_for(min)
BUILTINS[max] = _min_max_for(max)


@handles(sum)
def _sum(tx, args, kwargs):
    from ember.capture.operators import apply

    items = args[0].iterate(tx)
    total = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    for item in items:
        total = apply(tx, operator.add, [total, item])
    return total


def _any_all(fn: Any) -> Handler:
    def handler(tx, args, kwargs):  # stops at the first deciding item, as Python does
        iterator = iterator_over(tx, args[0])  # a generator CPython made: a break
        return ConstantValue(fn(v.truth(tx) for v in iter(lambda: iterator.next(tx), None)))

    return handler


BUILTINS[any] = _any_all(any)
BUILTINS[all] = _any_all(all)


@handles(sorted)
def _sorted(tx, args, kwargs):
    return ListValue(sorted_items(tx, iterator_over(tx, args[0]).iterate(tx), kwargs))


def _keys(tx: Translator, items: list[Value], key_fn: Value | None) -> list[Value]:
    """The `key=` function's result for each item, called once per item as Python does."""
    if key_fn is None or (key_fn.is_constant() and key_fn.as_constant() is None):
        return items
    return [key_fn.call(tx, [item], {}) for item in items]


def sorted_items(tx: Translator, items: list[Value], kwargs: dict[str, Value]) -> list[Value]:
    """Python's own sort over the keys, each `<` decided on the values (a tuple key compares
    as far as its first differing item: `(1, tensor) < (2, tensor)` needs no tensor);
    `sorted()` and `list.sort()`."""
    from ember.capture.operators import less_than

    keys = _keys(tx, items, kwargs.get("key"))
    reverse = kwargs.get("reverse", ConstantValue(False)).as_constant()
    order = sorted(
        range(len(items)),
        key=functools.cmp_to_key(lambda i, j: -1 if less_than(tx, keys[i], keys[j]) else 0),
        reverse=reverse,
    )
    return [items[i] for i in order]


def _n_extremes(largest: bool) -> Handler:
    """heapq.nlargest / nsmallest, documented as `sorted(iterable, key=key,
    reverse=largest)[:n]` (their C heap helpers aside)."""

    def handler(tx, args, kwargs):
        n = args[0].as_constant()
        ordered = _sorted(tx, [args[1]], {**kwargs, "reverse": ConstantValue(largest)})
        return ListValue(ordered.items[:n])

    return handler


BUILTINS[heapq.nlargest] = _n_extremes(True)
BUILTINS[heapq.nsmallest] = _n_extremes(False)


@handles(pow)
def _pow(tx, args, kwargs):
    from ember.capture.operators import apply

    if len(args) == 3:  # modular power: integers only
        if not all_constant(args):
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, "pow() with a modulus on tensors")
        return ConstantValue(pow(*(a.as_constant() for a in args)))
    return apply(tx, operator.pow, list(args))


def _fold_constructor(cls: type) -> Handler:
    """Constructors of immutable torch descriptions, folded (`torch.finfo(x.dtype).min`)."""

    def handler(tx, args, kwargs):
        if not all_constant(args) or not all_constant(list(kwargs.values())):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL, f"{cls.__name__} built from non-constant values"
            )
        kw = {k: v.as_constant() for k, v in kwargs.items()}
        return ConstantValue(cls(*(a.as_constant() for a in args), **kw))

    return handler


for _cls in (torch.finfo, torch.iinfo, torch.Size, torch.device):
    BUILTINS[_cls] = _fold_constructor(_cls)


def _numpy_constructors() -> list[Any]:
    """numpy's dtype queries and scalar types, when numpy is there (torch loads it)."""
    np = sys.modules.get("numpy")
    if np is None:
        return []
    return [np.finfo, np.iinfo, np.dtype, *sorted(set(np.sctypeDict.values()), key=str)]


for _cls in _numpy_constructors():
    BUILTINS[_cls] = _fold_constructor(_cls)


@handles(functools.reduce)
def _reduce(tx, args, kwargs):
    fn, items = args[0], args[1].iterate(tx)
    if len(args) > 2:
        total, rest = args[2], items
    elif items:
        total, rest = items[0], items[1:]
    else:
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "reduce() of an empty sequence")
    for item in rest:
        total = fn.call(tx, [total, item], {})
    return total


@handles(collections.OrderedDict)
def _ordered_dict(tx, args, kwargs):
    result = _dict(tx, args, kwargs)
    result.dict_type = collections.OrderedDict
    return result


@handles(weakref.ref)
def _weakref(tx, args, kwargs):
    from ember.capture.values.builder import WeakRefValue

    if len(args) != 1 or kwargs:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "weakref.ref with a callback")
    return WeakRefValue(None, None, referent=args[0])


@handles(dataclasses.fields)
def _fields(tx, args, kwargs):
    target = args[0]
    is_class = target.is_constant() and isinstance(target.as_constant(), type)
    fields = dataclasses.fields(target.as_constant() if is_class else target.python_type())
    return TupleValue([ConstantValue(f) for f in fields])


@handles(functools.partial)
def _partial(tx, args, kwargs):
    return PartialValue(args[0], list(args[1:]), dict(kwargs))


@handles(print)
def _print(tx, args, kwargs):
    raise Unsupported(
        BreakReason.UNSUPPORTED_CALL,
        "call to print (output must happen in Python, in order)",
        hint="remove the print from the compiled function, or let the graph break there",
    )


def _operator_handler(fn: Any) -> Handler:
    def handler(tx, args, kwargs):
        from ember.capture.operators import apply

        return apply(tx, fn, list(args))

    return handler


for _name in dir(operator):
    _op = getattr(operator, _name)
    if callable(_op) and not _name.startswith("_") and not isinstance(_op, type):
        if _name not in ("attrgetter", "itemgetter", "methodcaller", "call", "length_hint"):
            BUILTINS[_op] = _operator_handler(_op)


def _math_fold(fn: Any) -> Handler:
    def handler(tx, args, kwargs):
        if not all_constant(args):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"math.{fn.__name__} on a tensor needs its value in Python",
                hint=f"use torch.{fn.__name__}",
            )
        return ConstantValue(fn(*(a.as_constant() for a in args)))

    return handler


for _fn in (
    math.sqrt,
    math.exp,
    math.log,
    math.cos,
    math.sin,
    math.tanh,
    math.ceil,
    math.floor,
    math.prod,
    math.log2,
    math.erf,
    math.isqrt,
):
    BUILTINS[_fn] = _math_fold(_fn)


def _constant_answer(value: Any) -> Handler:
    def handler(tx, args, kwargs):
        return ConstantValue(value)

    return handler


# Code that asks whether it is being compiled takes the compiled path, as under Dynamo:
# libraries use these checks to skip work a graph cannot hold (contextvars, registries,
# warnings). Code that runs eagerly at a graph break still sees False.
for _fn in (
    torch.compiler.is_compiling,
    torch.compiler.is_dynamo_compiling,
    torch_compat.is_compiling_flag,
):
    BUILTINS[_fn] = _constant_answer(True)
for _fn in (torch.compiler.is_exporting, torch.jit.is_scripting, torch.jit.is_tracing):
    BUILTINS[_fn] = _constant_answer(False)


@handles(object.__new__)
def _object_new(tx, args, kwargs):
    """`object.__new__(cls)` (`cls.__new__(cls)` of a plain class): an instance whose
    `__init__` has not run. Builtin bases with state of their own are refused."""
    from ember.capture.values.classes import plain_new
    from ember.capture.values.objects import UserObjectValue

    cls = args[0].as_constant() if args else None
    if (
        not isinstance(cls, type)
        or len(args) != 1
        or kwargs
        or issubclass(cls, torch.nn.Module)
        or not plain_new(cls)
        or not hasattr(cls, "__dict__")
    ):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "object.__new__ with these arguments")
    if cls.__mro__[1:] and any(
        not from_class_statement(k) and k is not object for k in cls.__mro__
    ):  # a builtin base (dict, list, ...) is not modelled here
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"object.__new__({cls.__qualname__})")
    return UserObjectValue(cls)


compiler.register(BUILTINS)

from ember.capture.values import (  # noqa: E402, F401  (they register their handlers)
    attribute_builtins,
    callables,
    classes,
    collection_types,
    functorch,
    higher_order,
    iteration,
)
