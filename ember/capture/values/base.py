"""The symbolic value protocol (Dynamo's VariableTracker) and Python constants.

A `Value` stands for one Python value during capture. Operations the interpreter performs on
it (attribute reads, calls, iteration, truth tests, indexing) are methods here; each subclass
implements what it can model and raises `Unsupported` with a reason for the rest. A value knows
its `source` when it came from outside the frame; values made during capture have none and are
rebuilt by `reconstruct` in the replacement bytecode.
"""

from __future__ import annotations

import itertools
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.shapes import PYTHON_TYPES
from ember.capture.sources import Source
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


def from_class_statement(cls: type) -> bool:
    """Whether a class statement (or `type(...)`) made `cls`, rather than C. A C type can be
    a heap type too when its module makes it at import (functools.partial, re.Pattern; on
    3.13 also deque, defaultdict, itertools' types, Decimal), but those are immutable, and a
    class made in Python never is."""
    flags = cls.__flags__
    return bool(flags & _HEAPTYPE) and not flags & _IMMUTABLETYPE


_HEAPTYPE, _IMMUTABLETYPE = 1 << 9, 1 << 8  # Py_TPFLAGS_HEAPTYPE, Py_TPFLAGS_IMMUTABLETYPE


class NotConstant(Unsupported):
    """Raised by `as_constant` when a value is not known while tracing: an Unsupported, so
    a construct that needs a Python value (range(n), a dict key) ends the capture cleanly."""

    def __init__(self, description: str, reason: BreakReason = BreakReason.UNSUPPORTED_OBJECT):
        super().__init__(reason, f"{description} is needed as a Python value here")


class MissingAttribute(Unsupported):
    """An AttributeError in the traced code (a missing attribute, or an AttributeError a
    property or `__getattr__` raises). `hasattr` and `getattr` with a default catch exactly
    this; any other exception inside them propagates, as in Python."""

    def __init__(self, detail: str, missing_on: type | None = None) -> None:
        super().__init__(BreakReason.EXCEPTION_RAISED, f"AttributeError: {detail}")
        self.missing_on = missing_on
        """The class whose instance lookup found nothing (raised by the lookup itself)."""
        self.guarded = False
        """The absence that raised this is guarded (where it was found): whoever catches it
        needs no guard of its own."""
        self.lookup: tuple[Value, str] | None = None
        """The innermost `obj.name` of the traced code that raised it (LOAD_ATTR, getattr)."""


def attribute(tx: Translator, obj: Value, name: str) -> Value:
    """`obj.name` for the traced code; a MissingAttribute raised says which lookup found
    nothing (the innermost one), for the guard of a handler that catches it."""
    try:
        return obj.getattr(tx, name)
    except MissingAttribute as exc:
        if exc.lookup is None:
            exc.lookup = (obj, name)
        raise


class FoldingRaised(Unsupported):
    """Python raised `error` while the trace computed the user's operation on constants
    (`1 / 0`, `"a" + 1`, a pure function): a handler of the trace catches it as it is;
    otherwise it ends the capture, and CPython raises it at the graph break."""

    def __init__(self, error: Exception, detail: str) -> None:
        super().__init__(BreakReason.EXCEPTION_RAISED, detail)
        self.error = error


def missing_key(key: Value, tx: Translator | None = None) -> Exception:
    """The KeyError of a lookup of `key` that is not there: Python's own when the key is a
    constant (the interpreter hands it to a handler of the trace, or to CPython at a graph
    break); for another key (an object hashed by its own `__hash__`), a KeyError of the
    trace holding that key where traced code handles it; else a refusal that names it."""
    if key.is_constant():
        error = KeyError(key.as_constant())
        return FoldingRaised(error, f"KeyError: {error}")
    if tx is not None and tx.handled_in_trace():
        from ember.capture.values.exceptions import TracedRaise, construct_exception

        return TracedRaise(construct_exception(tx, KeyError, [key], {}))
    return Unsupported(BreakReason.EXCEPTION_RAISED, f"KeyError: {key.describe()}")


_serials = itertools.count()


def next_serial() -> int:
    """The serial the next value made will be at least."""
    return next(_serials)


class Value:
    source: Source | None = None
    cycle_at: int | None = None
    """The step of the instruction at which this value, made in the trace, came to refer to
    itself (values/reachability.py `note_cycle`): where a capture run again breaks when
    break code would have to make it (a cycle cannot be rebuilt)."""
    in_cycle: bool = False
    """It may be a member of a cycle: break code makes it in two steps where it can."""
    serial: int
    """When the value was made, in capture order: a higher-order op's body may change
    only values made after it began (side_effects.SideEffects.fence)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Value:
        value = super().__new__(cls)
        value.serial = next(_serials)
        return value

    def python_type(self) -> type:
        raise Unsupported(BreakReason.UNSUPPORTED_OBJECT, f"type of {self.describe()} is not known")

    def describe(self) -> str:
        return type(self).__name__

    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        raise NotConstant(self.describe())

    def symbolic(self) -> Any:
        """The constant, symbolic sizes kept (see ConstantValue.as_constant)."""
        return self.as_constant()

    def truth(self, tx: Translator) -> bool:
        raise Unsupported(BreakReason.DYNAMIC_CONTROL_FLOW, f"truth value of {self.describe()}")

    def getattr(self, tx: Translator, name: str) -> Value:
        raise Unsupported(
            BreakReason.UNSUPPORTED_ATTRIBUTE, f"attribute {name!r} of {self.describe()}"
        )

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        raise Unsupported(
            BreakReason.SIDE_EFFECT, f"setting attribute {name!r} on {self.describe()}"
        )

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"calling {self.describe()}")

    def iterate(self, tx: Translator) -> list[Value]:
        raise Unsupported(BreakReason.DYNAMIC_CONTROL_FLOW, f"iterating over {self.describe()}")

    def getitem(self, tx: Translator, key: Value) -> Value:
        raise Unsupported(BreakReason.UNSUPPORTED_OPERATOR, f"indexing {self.describe()}")

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        raise Unsupported(BreakReason.SIDE_EFFECT, f"item assignment on {self.describe()}")

    def delitem(self, tx: Translator, key: Value) -> None:
        raise Unsupported(BreakReason.SIDE_EFFECT, f"item deletion on {self.describe()}")

    def length(self, tx: Translator) -> int:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"len() of {self.describe()}")

    def contained(self) -> list[Value]:
        """The values this one holds and rebuilds with itself (a set's members, a view's
        dict): their tensors must be outputs of the graph."""
        return []

    def reconstruct(self, em: Emitter) -> None:
        """Emit bytecode that pushes this value at run time."""
        if self.source is not None:
            self.source.emit(em.cg)
            return
        raise Unsupported(
            BreakReason.UNSUPPORTED_OBJECT,
            f"{self.describe()} made during capture cannot be rebuilt after the graph",
        )


class ConstantValue(Value):
    """A Python value known while tracing: numbers, strings, None, dtypes, devices, ..."""

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"constant {self.value!r}"

    def python_type(self) -> type:
        kind = type(self.value)
        return PYTHON_TYPES.get(kind, kind)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        """The value. A symbolic size (capture/shapes.py) is made a number here, with a
        guard: code that reads a constant (str, range, dict keys, ...) must see the int; the
        paths that keep sizes symbolic (operators, tensor arguments) read `symbolic()`."""
        value = self.value
        kind = type(value)
        if kind in PYTHON_TYPES:
            return PYTHON_TYPES[kind](value)
        if (kind is torch.Size or kind is tuple) and any(type(v) in PYTHON_TYPES for v in value):
            return kind([PYTHON_TYPES.get(type(v), _same)(v) for v in value])
        return value

    def symbolic(self) -> Any:
        """The value, symbolic sizes kept as SymInts."""
        return self.value

    def truth(self, tx: Translator) -> bool:
        return bool(self.value)

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import BuiltinValue

        try:
            attr = getattr(self.value, name)
        except AttributeError as exc:
            raise MissingAttribute(f"{self.describe()} has no attribute {name!r}") from exc
        if callable(attr) and not isinstance(attr, type):
            return BuiltinValue(attr)
        return ConstantValue(attr)

    def length(self, tx: Translator) -> int:
        try:
            return len(self.value)
        except TypeError as exc:  # `len(None)`: Python's error, for the trace's handlers
            raise FoldingRaised(exc, f"TypeError: {exc}") from None

    def iterate(self, tx: Translator) -> list[Value]:
        if isinstance(self.value, (str, bytes, range, frozenset, tuple, types.MappingProxyType)):
            return [ConstantValue(v) for v in self.value]
        return super().iterate(tx)

    def getitem(self, tx: Translator, key: Value) -> Value:
        k = key.as_constant()
        try:
            return ConstantValue(self.value[k])
        except (TypeError, IndexError, KeyError) as exc:  # `None["b"]`, `"ab"[5]`
            raise FoldingRaised(exc, f"{type(exc).__name__}: {exc}") from None

    def reconstruct(self, em: Emitter) -> None:
        em.load_number(self.value)


def _same(value: Any) -> Any:
    return value


class NullValue(Value):
    """The NULL that 3.11+ pushes below a callable."""

    def describe(self) -> str:
        return "NULL"


NULL = NullValue()


def constants(values: list[Value]) -> list[Any]:
    """The constants of a list of values, or NotConstant."""
    return [v.as_constant() for v in values]


def all_constant(values: list[Value] | tuple[Value, ...]) -> bool:
    return all(v.is_constant() for v in values)
