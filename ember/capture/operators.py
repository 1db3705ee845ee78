"""Python operators (`+`, `<`, `in`, `is`, `-x`, ...) on symbolic values.

Any operand that is a tensor makes the operator a graph node (fx accepts `operator.add` as a
target, which gives seed 000's `add = matmul + g_bias_`). Constants fold. Containers combine
as Python would. User objects with dunder methods have them inlined.
"""

from __future__ import annotations

import collections.abc
import operator
from typing import TYPE_CHECKING, Any

from ember.capture.guards import GuardKind
from ember.capture.values.base import ConstantValue, FoldingRaised, Value, all_constant
from ember.capture.values.containers import (
    DictValue,
    IteratorValue,
    ListValue,
    SequenceValue,
    TupleValue,
)
from ember.capture.values.identity import compare_ids
from ember.capture.values.sets import DictViewValue, SetValue, set_operation
from ember.capture.values.tensor import TensorValue, tensor_op
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

_INPLACE_TO_PLAIN = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.imatmul: operator.matmul,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}

_INPLACE_NAMES = {fn: f"__{fn.__name__}__" for fn in _INPLACE_TO_PLAIN}
"""`operator.iadd` -> "__iadd__": the method an augmented assignment calls first."""

_DUNDERS = {
    operator.add: ("__add__", "__radd__"),
    operator.sub: ("__sub__", "__rsub__"),
    operator.mul: ("__mul__", "__rmul__"),
    operator.truediv: ("__truediv__", "__rtruediv__"),
    operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.eq: ("__eq__", "__eq__"),
    operator.ne: ("__ne__", "__ne__"),
    operator.lt: ("__lt__", "__gt__"),
    operator.gt: ("__gt__", "__lt__"),
    operator.le: ("__le__", "__ge__"),
    operator.ge: ("__ge__", "__le__"),
    operator.neg: ("__neg__", None),
    operator.getitem: ("__getitem__", None),
}


def apply(tx: Translator, fn: Any, args: list[Value]) -> Value:
    """`fn(*args)` for an operator function on symbolic values."""
    ids = compare_ids(tx, fn, args)
    if ids is not None:
        return ids
    if fn in (operator.is_, operator.is_not):
        return _identity(tx, fn, *args)
    if fn is operator.not_:
        return ConstantValue(not args[0].truth(tx))
    if fn is operator.truth:
        return ConstantValue(args[0].truth(tx))
    if fn is operator.contains:
        return _contains(tx, args[0], args[1])
    if fn is operator.getitem:
        return args[0].getitem(tx, index_key(tx, args[0], args[1]))
    if any(isinstance(a, TensorValue) for a in args) and not _object_operator(fn, args):
        if fn in _INPLACE_TO_PLAIN and args[0].python_type() in (int, float, bool, complex):
            # `n += t` for a number n: numbers have no in-place form, so Python runs n + t
            # (T5's `relative_buckets = 0; relative_buckets += ...`)
            fn = _INPLACE_TO_PLAIN[fn]
        return tensor_op(tx, "call_function", fn, args, {})
    if all_constant(args) and not any(
        isinstance(a, SequenceValue | DictValue | SetValue) for a in args
    ):
        try:
            return ConstantValue(fn(*(a.symbolic() for a in args)))
        except Exception as exc:
            raise FoldingRaised(
                exc, f"{fn.__name__} on constants raised {type(exc).__name__}: {exc}"
            ) from exc
    result = _containers(tx, fn, args)
    if result is not None:
        return result
    return _dunder(tx, fn, args)


def _object_operator(fn: Any, args: list[Value]) -> bool:
    """The left operand is an object whose class writes the operator in Python (`acc +=
    t` on an accumulator): its method runs, with the tensor as its argument."""
    from ember.capture.values.objects import UserObjectValue, python_override

    if not args or not isinstance(args[0], UserObjectValue):
        return False
    names = [_INPLACE_NAMES.get(fn), *(_DUNDERS.get(_INPLACE_TO_PLAIN.get(fn, fn)) or ())[:1]]
    return any(name and python_override(args[0].cls, name) is not None for name in names)


def index_key(tx: Translator, container: Value, key: Value) -> Value:
    """The key a sequence, a tensor or a size is indexed with, where the key is an object
    whose class writes `__index__` in Python: CPython and torch call it, so the trace
    inlines it (the int it gives). A dict or an object's own `__getitem__` gets the object."""
    indexed = isinstance(container, TensorValue | SequenceValue) or (
        isinstance(container, ConstantValue)
        and isinstance(container.value, tuple | list | str | range)
    )
    number = index_of(tx, key) if indexed else None
    return key if number is None else number


def index_of(tx: Translator, value: Value) -> Value | None:
    """`operator.index(value)` for an object whose class writes `__index__` in Python (its
    method inlined; the int it gives); None for any other value."""
    from ember.capture.values.objects import UserObjectValue, python_override

    if not isinstance(value, UserObjectValue) or python_override(value.cls, "__index__") is None:
        return None
    result = value.type_method(tx, "__index__").call(tx, [], {})
    if not (result.is_constant() and type(result.as_constant()) is int):
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPERATOR, f"__index__ of {value.describe()} gave no int"
        )
    return result


def same_value(tx: Translator, a: Value, b: Value) -> bool:
    """`a == b` as a Python bool, identity first (what containers and groupby compare)."""
    return a is b or apply(tx, operator.eq, [a, b]).truth(tx)


def less_than(tx: Translator, a: Value, b: Value) -> bool:
    """`a < b` as a Python bool, the way sorting asks: sequences compare item by item up
    to the first that differs, so only the items that decide are compared."""
    if a.is_constant() and b.is_constant():
        return apply(tx, operator.lt, [a, b]).as_constant()
    if isinstance(a, SequenceValue) and isinstance(b, SequenceValue):
        for x, y in zip(a.items, b.items):
            if not same_value(tx, x, y):
                return less_than(tx, x, y)
        return len(a.items) < len(b.items)
    return apply(tx, operator.lt, [a, b]).truth(tx)


def _identity(tx: Translator, fn: Any, a: Value, b: Value) -> Value:
    if a.is_constant() and b.is_constant() and not isinstance(a, SequenceValue | DictValue):
        same = a.as_constant() is b.as_constant()
    elif a.is_constant() != b.is_constant():
        same = _is_the_constant(tx, *((a, b) if b.is_constant() else (b, a)))
    else:
        same = a is b  # one object reached twice is one value (the builder's SAME_OBJECT)
        if not same and _from_outside(tx, a) and _from_outside(tx, b):
            tx.ctx.guards.add(GuardKind.DISTINCT_OBJECTS, a.source, b.source)
    return ConstantValue(same if fn is operator.is_ else not same)


def _from_outside(tx: Translator, value: Value) -> bool:
    return value.source is not None and tx.ctx.builder.real_object(value) is not None


def _is_the_constant(tx: Translator, value: Value, constant: Value) -> bool:
    """`value is constant` where only one side is a constant: an attribute of a constant
    (`field.kw_only is MISSING`, dataclasses' own test) holds the very object a global or
    argument is. Where the types alone do not decide it, the answer pins the outside object's
    identity (an ID_MATCH guard)."""
    if isinstance(constant, SequenceValue | DictValue):
        return False
    real = tx.ctx.builder.real_object(value)
    if real is None or value.source is None:
        return False
    target = constant.as_constant()
    if real is target or type(real) is type(target):  # else the type guard decides it
        tx.ctx.guards.add(GuardKind.ID_MATCH, value.source, real)
    return real is target


_NUMBERS_AND_STRINGS = (int, float, complex, bool, str, bytes, type(None))


def _compared_by_identity(args: list[Value]) -> bool:
    """`a == b` is `a is b` when neither side's class defines `__eq__` (object's answers
    NotImplemented for other objects, both ways, and Python falls back to identity):
    sentinel objects such as dataclasses' field kinds (`f._field_type in (_FIELD, ...)`).
    A number or string on one side answers NotImplemented for a foreign object too."""
    from ember.capture.values.objects import UserObjectValue

    if len(args) != 2 or not any(isinstance(a, UserObjectValue) for a in args):
        return False
    for value in args:
        if isinstance(value, UserObjectValue):
            if value.cls.__eq__ is not object.__eq__ or value.cls.__ne__ is not object.__ne__:
                return False
        elif not (value.is_constant() and type(value.as_constant()) in _NUMBERS_AND_STRINGS):
            return False
    return True


def _contains(tx: Translator, container: Value, item: Value) -> Value:
    from ember.capture.values.mappings import DictObjectValue, InstanceDictValue
    from ember.capture.values.objects import UserObjectValue

    if isinstance(container, DictObjectValue):
        return ConstantValue(container.contains(tx, item).truth(tx))
    if isinstance(container, InstanceDictValue):
        return ConstantValue(container.contains(tx, item))
    if isinstance(container, UserObjectValue) and _own_contains(container.cls):
        method = container.type_method(tx, "__contains__")
        return ConstantValue(method.call(tx, [item], {}).truth(tx))
    if isinstance(container, SetValue | DictViewValue):
        return ConstantValue(container.contains(tx, item))
    if isinstance(container, DictValue):
        return ConstantValue(container._key(item, tx) in container.items)
    if isinstance(container, TensorValue):
        raise Unsupported(BreakReason.DATA_DEPENDENT_BRANCH, "`in` on a tensor")
    if isinstance(container, IteratorValue):  # pulls up to the first match, as Python does
        while (v := container.next(tx)) is not None:
            if same_value(tx, v, item):
                return ConstantValue(True)
        return ConstantValue(False)
    if container.is_constant() and item.is_constant():
        return ConstantValue(item.as_constant() in container.as_constant())
    return ConstantValue(any(same_value(tx, v, item) for v in container.iterate(tx)))


def _own_contains(cls: type) -> bool:
    """The class defines `in` itself. The abc mixins' `__contains__` (Mapping: `self[key]`
    caught KeyError; Sequence: a scan) agree with iterating by the ABC's contract, and the
    scan below needs no exception handling, so those are left to it."""
    for klass in cls.__mro__:
        if "__contains__" in klass.__dict__:
            return klass not in (collections.abc.Mapping, collections.abc.Sequence, object)
    return False


def _containers(tx: Translator, fn: Any, args: list[Value]) -> Value | None:
    plain = _INPLACE_TO_PLAIN.get(fn, fn)
    if len(args) != 2:
        return None
    a, b = args
    combined = set_operation(tx, fn, a, b)
    if combined is not None:
        return combined
    if isinstance(a, SequenceValue) and isinstance(b, SequenceValue) and plain is operator.add:
        if fn is operator.iadd and isinstance(a, ListValue):
            a.call_method(tx, "extend", [b], {})
            return a
        if a.python_type() is b.python_type() or fn is operator.iadd:
            return (
                type(a)(a.items + b.items)
                if isinstance(a, ListValue)
                else TupleValue(a.items + b.items)
            )
    if isinstance(a, DictValue) and isinstance(b, DictValue) and plain is operator.or_:
        # `d |= m` updates d itself (3.13's ChainMap.__iter__ does it); `d | m`, a copy
        merged = a if fn is operator.ior else a.call_method(tx, "copy", [], {})
        merged.call_method(tx, "update", [b], {})
        return merged
    if isinstance(a, SequenceValue) and b.is_constant() and plain is operator.mul:
        items = a.items * b.as_constant()
        return ListValue(items) if isinstance(a, ListValue) else TupleValue(items)
    if (
        isinstance(a, SequenceValue)
        and isinstance(b, SequenceValue)
        and fn in (operator.eq, operator.ne)
    ):
        equal = len(a.items) == len(b.items) and all(
            same_value(tx, x, y) for x, y in zip(a.items, b.items)
        )
        return ConstantValue(equal if fn is operator.eq else not equal)
    if a.is_constant() and b.is_constant():
        try:
            result = fn(a.symbolic(), b.symbolic())
        except Exception as exc:
            raise FoldingRaised(exc, f"{fn.__name__}: {exc}") from exc
        if isinstance(result, list):
            return ListValue([ConstantValue(v) for v in result])
        if isinstance(result, tuple) and type(result) is tuple:  # a torch.Size stays one
            return TupleValue([ConstantValue(v) for v in result])
        if isinstance(result, set):
            return SetValue(result)
        return ConstantValue(result)
    if fn in (operator.eq, operator.ne) and type(a) is not type(b) and not _user_objects(a, b):
        if a.python_type() is not b.python_type() and not _numeric(a, b) and not _sets(a, b):
            return ConstantValue(fn is operator.ne)
    return None


def _user_objects(*values: Value) -> bool:
    """Some operand is an object of a Python class: its `__eq__`/`__ne__` decides (an
    object may equal a number), in `_dunder`."""
    from ember.capture.values.objects import UserObjectValue

    return any(isinstance(v, UserObjectValue) for v in values)


_SET_TYPES = (set, frozenset, type({}.keys()), type({}.items()))


def _sets(a: Value, b: Value) -> bool:
    """Both sides are sets or dict views, which compare equal across their types
    (`d.keys() == {"a"}`): not decided by the types."""
    return all(issubclass(v.python_type(), _SET_TYPES) for v in (a, b))


def _numeric(a: Value, b: Value) -> bool:
    return all(v.python_type() in (int, float, bool, complex) for v in (a, b))


def _dunder(tx: Translator, fn: Any, args: list[Value]) -> Value:
    from ember.capture.values.objects import UserObjectValue

    plain = _INPLACE_TO_PLAIN.get(fn, fn)
    names = _DUNDERS.get(plain)
    if plain in (operator.eq, operator.ne) and _compared_by_identity(args):
        return _identity(tx, operator.is_ if plain is operator.eq else operator.is_not, *args)
    if plain is operator.ne and isinstance(args[0], UserObjectValue) and _default_ne(args[0].cls):
        # object's `__ne__` inverts the class's own `__eq__` (dataclasses define only that)
        equal = _dunder(tx, operator.eq, args)
        if not (equal.is_constant() and equal.as_constant() is NotImplemented):
            return ConstantValue(not equal.truth(tx))
    inplace = _INPLACE_NAMES.get(fn)
    if inplace and isinstance(args[0], UserObjectValue):
        method = args[0].type_method(tx, inplace)  # `x += y` tries `__iadd__` first
        if method is not None:
            result = method.call(tx, args[1:], {})
            if not _not_implemented(result):
                return result
    if names and isinstance(args[0], UserObjectValue):
        result = args[0].getattr(tx, names[0]).call(tx, args[1:], {})
        if not (plain in (operator.eq, operator.ne) and _not_implemented(result)):
            return result
    if names and names[1] and len(args) == 2 and isinstance(args[1], UserObjectValue):
        result = args[1].getattr(tx, names[1]).call(tx, [args[0]], {})
        if not (plain in (operator.eq, operator.ne) and _not_implemented(result)):
            return result
    if plain in (operator.eq, operator.ne) and len(args) == 2 and not _own_eq(args):
        same = args[0] is args[1]  # object's `==`: identity
        return ConstantValue(same if plain is operator.eq else not same)
    kinds = ", ".join(a.describe() for a in args)
    raise Unsupported(BreakReason.UNSUPPORTED_OPERATOR, f"{fn.__name__} on {kinds}")


def _own_eq(args: list[Value]) -> bool:
    """An object ember cannot look into whose C class defines `==` (a dict view, a numpy
    array): its answer is not identity, and only CPython knows it."""
    from ember.capture.values.builder import OpaqueValue

    return any(isinstance(v, OpaqueValue) and v.cls.__eq__ is not object.__eq__ for v in args)


def _not_implemented(result: Value) -> bool:
    return result.is_constant() and result.as_constant() is NotImplemented


def _default_ne(cls: type) -> bool:
    """`!=` on instances of `cls` is object's: no class before object defines `__ne__`."""
    return next(k for k in cls.__mro__ if "__ne__" in k.__dict__) is object
