"""`id(obj)` of an object whose address is not known while tracing: a tensor (every call
passes a new one) or an object the trace made.

Dynamo answers the first with the example's address and an identity guard (a recompile
for every new tensor), the second with a made-up int. ember keeps the question instead: an
`IdValue` stands for the int, two of them compare as their objects' identities do, it can
key a dict or sit in a set (a memo of objects seen), and where the int itself leaves the
trace it is computed again from the object: `id(<the object rebuilt>)`, the real address.
What needs the number itself (arithmetic, ordering, formatting) is a graph break.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from ember.capture.values.base import ConstantValue, Value
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


_NOT_NUMERIC = frozenset([operator.contains, operator.getitem, operator.not_, operator.truth])
"""Operators that do not need the number: a container's lookup (by IdKey), a truth."""


class IdValue(Value):
    """`id(of)`: an int only the running program knows."""

    def __init__(self, of: Value) -> None:
        self.of = of

    def describe(self) -> str:
        return f"id() of {self.of.describe()}"

    def python_type(self) -> type:
        return int

    def truth(self, tx: Translator) -> bool:
        return True  # no object lives at address 0

    def contained(self) -> list[Value]:
        return [self.of]

    def reconstruct(self, em: Emitter) -> None:
        em.cg.load_const(id, push_null=True)
        em.reconstruct(self.of)
        em.cg.call(1)


class IdKey:
    """The dict key (or set member) of an IdValue: ids are equal exactly when the objects
    are one, so it hashes and compares by the object's value (the builder gives each
    outside object one Value)."""

    __slots__ = ("value",)

    def __init__(self, value: IdValue) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value.of)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdKey) and other.value.of is self.value.of


def compare_ids(tx: Translator, fn: Any, args: list[Value]) -> Value | None:
    """`id(a) == id(b)` and `!=` between IdValues: the identity of the objects (with the
    guard `is` takes for two outside objects). None where no IdValue is involved; a break
    for anything that needs the number."""
    from ember.capture.operators import apply

    if fn in _NOT_NUMERIC or not any(isinstance(a, IdValue) for a in args):
        return None
    if fn in (operator.eq, operator.ne) and all(isinstance(a, IdValue) for a in args):
        same = apply(tx, operator.is_, [args[0].of, args[1].of]).as_constant()
        return ConstantValue(same if fn is operator.eq else not same)
    if fn in (operator.is_, operator.is_not):
        same = args[0] is args[1]
        return ConstantValue(same if fn is operator.is_ else not same)
    kinds = ", ".join(a.describe() for a in args)
    raise Unsupported(
        BreakReason.UNSUPPORTED_OPERATOR,
        f"{getattr(fn, '__name__', fn)} on {kinds}: the address is known only at run time",
    )
