"""Instances of list subclasses reached from the frame (`class Items(list): pass`, an
argument or a global): list's C methods on their items.

Such an object is a list (its items) and a Python object (instance attributes, methods
written in Python). A method the class writes in Python is inlined as for any object; one
it inherits from list resolves, on the class, to list's own descriptor, which lands here
(`builtin_method`) and acts on `contents`: a `ListValue` of the items read at capture,
guarded as a plain list's (type, length, each item), through list's own `list.__len__(obj)`
and `list.__getitem__(obj, i)`, so a class's override of `len` or `[]` (inlined where the
code uses it) is not what the guards see. Lists made in the trace of such a class are plain
`ListValue`s with `list_type` (classes.py).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING, Any

from ember.capture.sources import Source
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import IteratorValue, ListValue
from ember.capture.values.mappings import StorageItemSource, storage_type
from ember.capture.values.objects import UserObjectValue, _class_attribute, python_override
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

_OPERATORS = {
    "__add__": operator.add,
    "__mul__": operator.mul,
    "__rmul__": operator.mul,
    "__eq__": operator.eq,
    "__ne__": operator.ne,
    "__lt__": operator.lt,
    "__le__": operator.le,
    "__gt__": operator.gt,
    "__ge__": operator.ge,
    "__iadd__": operator.iadd,
    "copy": None,
    "__reversed__": None,
}
_COMPARISONS = frozenset(["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"])
_READS = frozenset(["__getitem__", "__len__", "__contains__", "__iter__", "index", "count"])
_WRITES = frozenset(
    ["__setitem__", "__delitem__", "append", "extend", "insert", "pop", "remove", "clear"]
    + ["reverse", "sort"]
)


def is_list_object(cls: type) -> bool:
    """`cls` is list below classes written in Python only (no C subclass in between, whose
    own behaviour ListValue would not model)."""
    return cls is not list and storage_type(cls, (list,)) is list


class ListObjectValue(UserObjectValue):
    """A list-subclass object from outside; `contents` holds its items (see the module)."""

    def __init__(self, cls: type, source: Source, obj: Any) -> None:
        super().__init__(cls, source, obj)
        self.contents = ListValue([], source)
        self.contents.store_past_class = True  # changes replayed by list.__setitem__(obj, :)

    def describe(self) -> str:
        return f"{self.cls.__name__} (list subclass) object"

    def _dunder(self, tx: Translator, name: str, args: list[Value]) -> Value:
        return _class_attribute(tx, self, self.cls, name, self.source).call(tx, args, {})

    def truth(self, tx: Translator) -> bool:
        if python_override(self.cls, "__bool__") is not None:
            return self._dunder(tx, "__bool__", []).truth(tx)
        return self.length(tx) > 0

    def iterate(self, tx: Translator) -> list[Value]:
        if python_override(self.cls, "__iter__") is None:
            return self.contents.iterate(tx)
        return super().iterate(tx)

    def contains(self, tx: Translator, item: Value) -> Value:
        return self._dunder(tx, "__contains__", [item])

    def builtin_method(
        self, tx: Translator, descriptor: Any, args: list[Value], kwargs: dict[str, Value]
    ) -> Value:
        """A method of list found on the class (or through `super()`), on the items."""
        from ember.capture.operators import same_value

        name = getattr(descriptor, "__name__", "")
        if getattr(descriptor, "__objclass__", None) is not list or kwargs and name != "sort":
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"builtin method {descriptor!r}")
        if name in _READS:
            items = self.contents
            if name == "__getitem__":
                return items.getitem(tx, args[0])
            if name == "__len__":
                return ConstantValue(items.length(tx))
            if name == "__iter__":
                return IteratorValue(items.iterate(tx))
            if name == "__contains__":
                return ConstantValue(any(same_value(tx, v, args[0]) for v in items.iterate(tx)))
            return items.call_method(tx, name, args, kwargs)
        if name in _WRITES:
            items = self.contents
            if name == "__setitem__":
                items.setitem(tx, args[0], args[1])
            elif name == "__delitem__":
                items.delitem(tx, args[0])
            else:
                return items.call_method(tx, name, args, kwargs)
            return ConstantValue(None)
        if name in _OPERATORS:
            return self._operator(tx, name, args)
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"list.{name} on {self.describe()}")

    def _operator(self, tx: Translator, name: str, args: list[Value]) -> Value:
        """`+`, `*`, comparisons, `+=`, `copy()`, `reversed()`: list's, on a plain list of
        the items (what list's C code makes: `Items(..) + [1]` is a list). A comparison
        with something that is not a list is NotImplemented, as list's; the other side
        then decides."""
        from ember.capture.operators import apply

        items = self.contents
        if name == "copy":
            return ListValue(list(items.items))
        if name == "__reversed__":
            return IteratorValue(list(reversed(items.items)))
        other = args[0]
        if isinstance(other, ListObjectValue):
            other = other.contents
        if name == "__iadd__":  # list's extend, and the object itself
            items.call_method(tx, "extend", [other], {})
            return self
        if name in _COMPARISONS and not issubclass(other.python_type(), list):
            return ConstantValue(NotImplemented)
        return apply(tx, _OPERATORS[name], [ListValue(list(items.items)), other])


def wrap_list_object(builder: Any, value: list, source: Source) -> ListObjectValue:
    """A list-subclass object reached from the frame: type guarded; its items read and
    guarded as a plain list's (length, then each item), through list's own methods."""
    from ember.capture.guards import GuardKind

    cls = type(value)
    builder.ctx.guards.add(GuardKind.TYPE_MATCH, source, cls)
    result = builder._early(value, ListObjectValue(cls, source, value))  # it may hold itself
    builder.ctx.guards.add(GuardKind.EQUALS_MATCH, StorageLenSource(source), len(value))
    result.contents.items = [
        builder.wrap(v, StorageItemSource(source, list, i)) for i, v in enumerate(value)
    ]
    return result


@dataclasses.dataclass(frozen=True, slots=True)
class StorageLenSource(Source):
    """`list.__len__(obj)`: how many items a list-subclass object holds, past any `__len__`
    of its class (only guarded)."""

    base: Source

    def name(self) -> str:
        return f"list.__len__({self.base.name()})"

    def expr(self, scope: Any) -> str:
        length = scope.const(list.__len__, "len")
        return scope.bind(self, f"{length}({self.base.expr(scope)})")

    def emit(self, cg: Any) -> None:
        raise NotImplementedError("only guarded, never reloaded")
