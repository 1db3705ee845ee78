"""Dict keys and set members of classes whose `__hash__` is written in Python.

CPython files such a key by calling its `__hash__`, and finds it again by comparing with
`__eq__` the stored keys whose hash is equal (identity first). The trace does the same with
the user's methods inlined: the hash is the int the inlined `__hash__` gave, and a lookup
compares the new key with each stored key of that hash through the trace's `==`. The key it
finds equal is the one used, so once a key is in a container's table, keys compare by
identity there (`HashedKey`) and the real Python dict or set that models the container sees
exactly the collisions and matches the user's program saw.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ember.capture.values.base import ConstantValue, Value
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator


class HashedKey:
    """A stored key whose hash the trace computed with the class's own `__hash__`. Equal
    keys were merged when they were looked up (`find_key`), so two HashedKeys are equal
    exactly when they hold the same value."""

    __slots__ = ("value", "hash")

    def __init__(self, value: Value, hash_: int) -> None:
        self.value = value
        self.hash = hash_

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashedKey) and other.value is self.value

    def __repr__(self) -> str:
        return f"<key {self.value.describe()} hash {self.hash}>"


def python_hash_method(cls: type) -> Any:
    """The `__hash__` CPython would call for instances of `cls`: the first in the MRO
    (None where a class that defines `__eq__` only made them unhashable)."""
    return next((k.__dict__["__hash__"] for k in cls.__mro__ if "__hash__" in k.__dict__), None)


def user_hash(tx: Translator, value: Value) -> int:
    """`hash(value)` computed in the trace by the class's own Python `__hash__`: reduced as
    `hash()` reduces what it returns; the TypeError of an unhashable class is raised in the
    trace (to a handler of the user's, or a break)."""
    from ember.capture.values.builtins import _hash

    result = _hash(tx, [value], {})
    if not (result.is_constant() and type(result.as_constant()) is int):
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPERATOR,
            f"hash of {value.describe()} is not a Python int known while capturing",
        )
    return result.as_constant()


def hashes_in_python(cls: type) -> bool:
    """Instances are filed by a `__hash__` written in Python (or are unhashable by a class
    statement: the trace raises the TypeError)."""
    method = python_hash_method(cls)
    return method is None or isinstance(method, types.FunctionType)


def find_key(tx: Translator, value: Value, hash_: int, keys: Iterable[Any]) -> Any:
    """The stored key among `keys` that Python would take `value` for: the same hash, then
    the same object or the stored key `==` the new one (CPython compares `stored == new`).
    None if there is none."""
    from ember.capture.operators import same_value
    from ember.capture.values.containers import IdentityKey

    for stored in keys:
        if isinstance(stored, HashedKey):
            if stored.hash != hash_:
                continue
            other = stored.value
        elif isinstance(stored, IdentityKey):
            continue
        else:
            try:
                if hash(stored) != hash_:
                    continue
            except TypeError:
                continue
            other = ConstantValue(stored)
        if other is value or same_value(tx, other, value):
            return stored
    return None


def hashed_key(tx: Translator, value: Value, keys: Iterable[Any]) -> Any:
    """The key `value` is filed under in a table holding `keys`: an equal stored key, or a
    new HashedKey."""
    hash_ = user_hash(tx, value)
    found = find_key(tx, value, hash_, keys)
    return found if found is not None else HashedKey(value, hash_)


def constant_key(tx: Translator, constant: Any, keys: Iterable[Any]) -> Any:
    """The key a constant is filed under where the table holds HashedKeys: a stored object
    whose `__eq__` says it equals the constant (same hash), else the constant itself."""
    try:
        hash_ = hash(constant)
    except TypeError:
        return constant
    hashed = [k for k in keys if isinstance(k, HashedKey) and k.hash == hash_]
    if not hashed:
        return constant
    found = find_key(tx, ConstantValue(constant), hash_, hashed)
    return found if found is not None else constant


class TupleKey:
    """A tuple key with items that are not all constants (`d[(name, t)]`, a set of pairs
    holding tensors): Python hashes and compares a tuple by its items, so the key is the
    tuple of the items' own keys."""

    __slots__ = ("value", "parts")

    def __init__(self, value: Value, parts: tuple) -> None:
        self.value = value
        self.parts = parts

    def __hash__(self) -> int:
        return hash(self.parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TupleKey) and other.parts == self.parts
