"""`match` statements: the MATCH_* instructions test a subject's type, keys and attributes.

All of it is known while tracing: a subject's Python type is guarded where it came from, a
mapping's keys are the trace's, and attributes are read as `getattr` would read them. Tensor
values only enter through guards (`case _ if t.sum() > 0`), which branch as an `if` does.
The tests CPython makes are reproduced exactly: the type flags behind MATCH_MAPPING and
MATCH_SEQUENCE, `subject.get(key, marker)` for MATCH_KEYS, and for MATCH_CLASS the
`__match_args__` lookup with the builtin types that match themselves positionally.
"""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.values.attribute_builtins import guard_missing
from ember.capture.values.base import ConstantValue, MissingAttribute, Value
from ember.capture.values.containers import TupleValue
from ember.errors import BreakReason, Unsupported

_MAPPING_FLAG = 1 << 6  # Py_TPFLAGS_MAPPING: dict, Mapping subclasses and registrations
_SEQUENCE_FLAG = 1 << 5  # Py_TPFLAGS_SEQUENCE: list, tuple, range, Sequence (not str/bytes)
_SELF_MATCHING = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)
"""Builtin classes whose one positional sub-pattern is matched against the subject itself."""


@handler(Op.MATCH_MAPPING)
def match_mapping(tx, inst):
    tx.push(ConstantValue(bool(tx.peek().python_type().__flags__ & _MAPPING_FLAG)))


@handler(Op.MATCH_SEQUENCE)
def match_sequence(tx, inst):
    tx.push(ConstantValue(bool(tx.peek().python_type().__flags__ & _SEQUENCE_FLAG)))


@handler(Op.MATCH_KEYS)
def match_keys(tx, inst):
    keys, subject = tx.peek(), tx.peek(2)
    get = subject.getattr(tx, "get")
    marker = ConstantValue(object())
    values = []
    for key in keys.iterate(tx):
        value = get.call(tx, [key, marker], {})
        if value is marker:
            tx.push(ConstantValue(None))
            return
        values.append(value)
    tx.push(TupleValue(values))


@handler(Op.MATCH_CLASS)
def match_class(tx, inst):
    names = tx.pop().as_constant()
    cls_value = tx.pop()
    subject = tx.pop()
    if not cls_value.is_constant() or not isinstance(cls_value.as_constant(), type):
        raise Unsupported(
            BreakReason.UNSUPPORTED_OBJECT, f"class pattern on {cls_value.describe()}"
        )
    cls = cls_value.as_constant()
    if not issubclass(subject.python_type(), cls):
        tx.push(ConstantValue(None))
        return
    attributes = _positional_names(cls, inst.arg) + list(names)
    if len(set(attributes)) != len(attributes):
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED,
            f"TypeError: {cls.__name__}() got multiple sub-patterns for one attribute",
        )
    values: list[Value] = []
    for name in attributes:
        if name is None:  # `case int(x)`: the subject itself
            values.append(subject)
            continue
        try:
            values.append(subject.getattr(tx, name))
        except MissingAttribute as exc:  # the pattern fails: it must go on failing
            guard_missing(tx, subject, name, exc)
            tx.push(ConstantValue(None))
            return
    tx.push(TupleValue(values))


def _positional_names(cls: type, count: int) -> list:
    """The attributes `count` positional sub-patterns read: from `__match_args__`, or the
    subject itself (None) for one sub-pattern of a self-matching builtin."""
    if count == 0:
        return []
    match_args = getattr(cls, "__match_args__", None)
    if match_args is None and count == 1 and issubclass(cls, _SELF_MATCHING):
        return [None]
    if match_args is None:
        match_args = ()
    if not isinstance(match_args, tuple) or count > len(match_args):
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED,
            f"TypeError: {cls.__name__}() accepts {len(match_args)} positional sub-patterns "
            f"({count} given)",
        )
    return list(match_args[:count])
