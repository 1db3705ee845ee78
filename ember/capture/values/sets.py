"""Sets, frozensets and dict views during capture.

A set is modelled by a real Python set of its members' keys (the constants themselves, or an
`IdentityKey` for an object that hashes by identity: a tensor, a module), beside the symbolic
value of each member. Every operation runs on that real set, so iteration order, equality,
subset tests, `1 == True` collisions and the errors Python raises are Python's own; only the
order among identity-hashed members (which depends on addresses in eager too) is ember's.

A dict view (`d.keys()`, `.values()`, `.items()`) holds its dict, not a copy: it sees every
later insertion and deletion, as in Python.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from ember.capture.values.base import ConstantValue, MissingAttribute, Value
from ember.capture.values.containers import (
    DictValue,
    IdentityKey,
    TupleValue,
    dict_key,
    key_value,
)
from ember.capture.values.hashed_keys import HashedKey, constant_key, find_key
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator

_MUTATORS = frozenset(
    [
        "add",
        "update",
        "discard",
        "remove",
        "pop",
        "clear",
        "intersection_update",
        "difference_update",
        "symmetric_difference_update",
    ]
)
_IN_PLACE = {operator.ior: "|=", operator.iand: "&=", operator.isub: "-=", operator.ixor: "^="}
_SET_OPERATORS = frozenset(
    [
        operator.or_,
        operator.and_,
        operator.sub,
        operator.xor,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        *_IN_PLACE,
    ]
)


class SetValue(Value):
    """A set or frozenset: of constants, or of objects that hash by identity (the `memo`
    sets of nn.Module's helpers, a set of tensors)."""

    def __init__(
        self,
        items: Any = (),
        values: list[Value] | None = None,
        source: Any = None,
        frozen: bool = False,
    ) -> None:
        self.source = source
        """Set for a set reached from outside: read-only here (the ledger has no set replay)."""
        self.frozen = frozen
        self.members: set[Any] = set(items)
        """The members' keys, in a real set that has seen the same operations as the user's."""
        self.entries: dict[Any, Value] = {k: ConstantValue(k) for k in self.members}
        """Key -> the member's symbolic value."""
        for value in values or []:
            self.add(value)

    def _insert(self, key: Any, value: Value) -> None:
        if key not in self.members:
            self.members.add(key)
            self.entries[key] = value

    def add(self, value: Value, tx: Translator | None = None) -> None:
        self._insert(self.key(value, tx), value)

    def key(self, value: Value, tx: Translator | None) -> Any:
        """The member `value` is (dict_key; with the translator, objects hashed in Python
        are matched against the members with their own `__eq__`, in the order they went in:
        the order CPython's probing meets members of one hash)."""
        return dict_key(value, tx, self.entries if tx is not None else ())

    def update(self, tx: Translator, iterable: Value) -> None:
        """`set.update(iterable)` as CPython runs it (a set or frozenset argument is merged
        table to table, which decides the iteration order of the result)."""
        operand = real_operand(tx, iterable, dict.fromkeys(self.entries))
        self.members.update(operand.real)
        self._sync(dict(self.entries), [operand])

    def describe(self) -> str:
        return f"{self.python_type().__name__} of {len(self.members)}"

    def python_type(self) -> type:
        return frozenset if self.frozen else set

    def is_constant(self) -> bool:
        return all(v.is_constant() for v in self.entries.values())

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return frozenset(self.members) if self.frozen else set(self.members)

    def truth(self, tx: Translator) -> bool:
        return bool(self.members)

    def length(self, tx: Translator) -> int:
        return len(self.members)

    def iterate(self, tx: Translator) -> list[Value]:
        return [self.entries[k] for k in self.members]

    def contained(self) -> list[Value]:
        return list(self.entries.values())

    def contains(self, tx: Translator, value: Value) -> bool:
        return self.key(value, tx) in self.members

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        if not hasattr(self.python_type(), name):
            raise MissingAttribute(f"{self.python_type().__name__!r} has no attribute {name!r}")
        return MethodValue(self, name)

    def _check_writable(self, what: str) -> None:
        if self.source is not None:
            raise Unsupported(
                BreakReason.SIDE_EFFECT, f"set.{what} on a set from outside the function"
            )

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        if kwargs:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"set.{name}() with keywords")
        if name == "__contains__":
            return ConstantValue(self.contains(tx, args[0]))
        if name in ("add", "discard", "remove"):  # one member, which may be unhashable
            args = [_Member(args[0], self.key(args[0], tx))]
        seen = dict.fromkeys(self.entries)
        operands = [real_operand(tx, a, seen) for a in args]
        if name in _MUTATORS:
            self._check_writable(f"{name}()")
            tx.ctx.effects.touch(self)
            before = dict(self.entries)
            result = getattr(self.members, name)(*(o.real for o in operands))
            self._sync(before, operands)
            if name == "pop":
                return before[result]
            return ConstantValue(None)
        result = getattr(self._real(), name)(*(o.real for o in operands))
        return _wrap_result(result, [self, *operands])

    def _real(self) -> set | frozenset:
        """The members as the user's object holds them (a copy: reads must not change ours)."""
        return frozenset(self.members) if self.frozen else set(self.members)

    def _sync(self, before: dict[Any, Value], operands: list[Any]) -> None:
        lookup = _lookup([before, *(o.entries for o in operands)])
        kept = [k for k in before if k in self.members]  # `entries` keeps insertion order
        self.entries = {k: lookup[k] for k in kept + [k for k in self.members if k not in before]}

    def in_place(self, tx: Translator, fn: Any, other: Value) -> Value:
        """`s |= t` and kin: a set changes in place and stays the same object; a frozenset
        makes a new one, as Python does."""
        operand = real_operand(tx, other, dict.fromkeys(self.entries))
        if self.frozen:
            result = fn(self._real(), operand.real)
            return _wrap_result(result, [self, operand])
        self._check_writable(_IN_PLACE[fn])
        tx.ctx.effects.touch(self)
        before = dict(self.entries)
        fn(self.members, operand.real)
        self._sync(before, [operand])
        return self

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return super().reconstruct(em)
        cg = em.cg
        if self.frozen:
            cg.load_const(frozenset, push_null=True)
        if self.is_constant():
            cg.load_const(tuple(self.members))  # in the order the trace saw
            cg.build("SET", 0)
            cg.swap(2)
            cg.emit("SET_UPDATE", 1)
        else:
            for key in self.members:
                em.reconstruct(self.entries[key])
            cg.build("SET", len(self.members))
        if self.frozen:
            cg.call(1)


class _Member:
    """One value given to `add`/`discard`/`remove`."""

    def __init__(self, value: Value, key: Any) -> None:
        self.value = value
        self.key = key


class _Operand:
    """An operand of a set operation in real form, with the values of its members."""

    def __init__(self, real: Any, entries: dict[Any, Value]) -> None:
        self.real = real
        self.entries = entries


def real_operand(tx: Translator, value: Any, seen: dict | None = None) -> _Operand:
    """`value` as the real object a set method would receive: a set of member keys for sets
    and key views, a key view of a real dict for `d.keys()`, a list of keys otherwise."""
    if isinstance(value, _Member):
        return _Operand(value.key, {value.key: value.value})
    operand = _real_operand(tx, value)
    return _merge_hashed(tx, operand, seen) if seen is not None else operand


def _real_operand(tx: Translator, value: Any) -> _Operand:
    if isinstance(value, SetValue):
        return _Operand(value._real(), value.entries)
    if isinstance(value, ConstantValue) and isinstance(value.value, (set, frozenset)):
        return _Operand(value.value, {k: ConstantValue(k) for k in value.value})
    if isinstance(value, DictViewValue) and value.kind == "keys":
        keys = list(value.mapping.items)
        return _Operand(dict.fromkeys(keys).keys(), {k: key_value(k) for k in keys})
    items = value.iterate(tx)
    keys = [dict_key(v, tx) for v in items]
    if isinstance(value, DictViewValue):  # `d.items()`: set-like, as a keys view of its pairs
        try:
            return _Operand(dict.fromkeys(keys).keys(), dict(zip(keys, items)))
        except TypeError as exc:  # an unhashable value: CPython decides when it raises
            raise Unsupported(BreakReason.UNSUPPORTED_OPERATOR, f"set algebra: {exc}") from None
    return _Operand(keys, dict(zip(keys, items)))


def _merge_hashed(tx: Translator, operand: _Operand, seen: dict) -> _Operand:
    """`operand` with each key hashed in Python replaced by an equal key met before (in
    `seen`: the earlier operands' keys, then this one's): equal objects are merged only
    within one table, and set algebra runs on the real sets of keys. `seen` is updated."""
    keys = list(operand.entries)
    if not any(isinstance(k, HashedKey) for k in [*keys, *seen]):
        seen.update(dict.fromkeys(keys))
        return operand
    mapping = {}
    for key in keys:
        mapping[key] = _equal_seen(tx, key, seen)
        seen.setdefault(mapping[key])
    entries: dict[Any, Value] = {}
    for key, value in operand.entries.items():
        entries.setdefault(mapping[key], value)  # the first of equal members stays
    real = operand.real
    if isinstance(real, (set, frozenset, list)):
        real = type(real)(mapping[k] for k in real)
    else:  # a dict's keys view
        real = dict.fromkeys(mapping[k] for k in real).keys()
    return _Operand(real, entries)


def _equal_seen(tx: Translator, key: Any, seen: dict) -> Any:
    if isinstance(key, HashedKey):
        found = find_key(tx, key.value, key.hash, seen)
    elif isinstance(key, IdentityKey):
        found = None
    else:
        found = constant_key(tx, key, seen)
    return key if found is None else found


def _lookup(tables: list[dict[Any, Value]]) -> dict[Any, Value]:
    merged: dict[Any, Value] = {}
    for table in tables:
        for key, value in table.items():
            merged.setdefault(key, value)
    return merged


def _wrap_result(result: Any, operands: list[Any]) -> Value:
    if isinstance(result, (set, frozenset)):
        lookup = _lookup([o.entries for o in operands])
        out = SetValue(frozen=isinstance(result, frozenset))
        out.members = result  # the real result itself: Python's order
        out.entries = {key: lookup[key] for key in out.members}
        return out
    return ConstantValue(result)


def is_set_like(value: Value) -> bool:
    return (
        isinstance(value, SetValue)
        or isinstance(value, DictViewValue)
        and value.kind in ("keys", "items")
        or isinstance(value, ConstantValue)
        and isinstance(value.value, (set, frozenset))
    )


def set_operation(tx: Translator, fn: Any, a: Value, b: Value) -> Value | None:
    """`|`, `&`, `-`, `^`, comparisons and their in-place forms where both sides are sets,
    frozensets or key views: Python's own operator on the real forms. None otherwise. A
    dict view takes any iterable on the other side (`d.keys() | other_dict`)."""
    if fn not in _SET_OPERATORS:
        return None
    if not (is_set_like(a) and is_set_like(b)) and not _view_with_iterable(fn, a, b):
        return None
    if fn in _IN_PLACE and isinstance(a, SetValue):
        return a.in_place(tx, fn, b)
    seen: dict = {}
    left, right = real_operand(tx, a, seen), real_operand(tx, b, seen)
    return _wrap_result(fn(left.real, right.real), [left, right])


_ALGEBRA = frozenset([operator.or_, operator.and_, operator.sub, operator.xor])


def _view_with_iterable(fn: Any, a: Value, b: Value) -> bool:
    """`view | iterable` and the reflected forms: dict_keys/dict_items accept any iterable."""
    return fn in _ALGEBRA and any(
        isinstance(v, DictViewValue) and v.kind in ("keys", "items") for v in (a, b)
    )


class DictViewValue(Value):
    """`d.keys()`, `d.values()` or `d.items()`: a live view of the dict's current items."""

    def __init__(self, mapping: DictValue, kind: str) -> None:
        self.mapping = mapping
        self.kind = kind

    def describe(self) -> str:
        return f"dict_{self.kind} view"

    def python_type(self) -> type:
        return type(getattr({}, self.kind)())

    def iterate(self, tx: Translator) -> list[Value]:
        items = self.mapping.items
        if self.kind == "keys":
            return [key_value(k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [TupleValue([key_value(k), v]) for k, v in items.items()]

    def length(self, tx: Translator) -> int:
        return len(self.mapping.items)

    def truth(self, tx: Translator) -> bool:
        return bool(self.mapping.items)

    def contained(self) -> list[Value]:
        return [self.mapping]

    def contains(self, tx: Translator, item: Value) -> bool:
        from ember.capture.operators import same_value

        if self.kind == "keys":
            return self.mapping.contains(item, tx)
        if self.kind == "items":
            pair = item.iterate(tx) if isinstance(item, TupleValue) else None
            if pair is None or len(pair) != 2 or not self.mapping.contains(pair[0], tx):
                return False
            return same_value(tx, self.mapping.getitem(tx, pair[0]), pair[1])
        return any(same_value(tx, v, item) for v in self.iterate(tx))

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        if name == "isdisjoint" and self.kind == "keys":
            return MethodValue(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        seen: dict = {}
        left, right = real_operand(tx, self, seen), real_operand(tx, args[0], seen)
        return ConstantValue(left.real.isdisjoint(right.real))

    def reconstruct(self, em: Emitter) -> None:
        em.reconstruct(self.mapping)
        em.cg.load_method(self.kind)
        em.cg.call(0)
