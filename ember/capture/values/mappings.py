"""Instances of dict subclasses: Hugging Face's `ModelOutput` (an OrderedDict subclass that
is also a dataclass), registries that override `get`, and the like.

Such an object is two things at once: a dict (its items, modelled by a `DictValue` in
`contents`) and a Python object (instance attributes, methods written in Python). Methods the
subclass defines in Python are inlined; the builtin dict methods it inherits act on
`contents` directly, which is what CPython's C implementation does (`dict.get` never calls
an overridden `__getitem__`). The few builtin methods that CPython implements by calling back
into the object (`OrderedDict.update` stores through `self[k] = v`) are refused when the
class overrides what they would call, rather than modelled half right.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any

from ember.capture.sources import ItemSource, Source
from ember.capture.values.base import ConstantValue, Value, from_class_statement, missing_key
from ember.capture.values.containers import DictValue, IteratorValue, key_value
from ember.capture.values.functions import UserFunctionValue
from ember.capture.values.objects import (
    ModuleValue,
    UserObjectValue,
    _class_attribute,
    python_override,
)
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator

_STORAGE_TYPES = (dict, collections.OrderedDict)
"""Builtin dict types a subclass may store its items in (others, such as defaultdict or
Counter, have C behaviour of their own that `DictValue` does not model)."""

_READS = frozenset(["keys", "values", "items", "get", "copy"])
_DIRECT_WRITES = frozenset(["__setitem__", "__delitem__"])
_CALLBACK_WRITES = frozenset(["update", "setdefault", "pop", "popitem", "clear", "__init__"])
"""Builtin methods that, on an OrderedDict subclass, store through the object's own
`__setitem__` / `__delitem__` (dict's C versions write the storage directly): modelled there
only when the class does not override those."""


def storage_type(cls: type, storages: tuple[type, ...] = _STORAGE_TYPES) -> type | None:
    """The builtin dict type (or other of `storages`) a class written in Python keeps its
    items in; None for anything else (a C subclass such as defaultdict, or no such base)."""
    for klass in cls.__mro__:
        if klass in storages:
            return klass
        if not from_class_statement(klass):
            return None
    return None


def rebuild_dict_object(cls: type, items: dict, attrs: dict) -> Any:
    """Run-time half of reconstructing a dict-subclass object made during capture: no
    `__init__` rerun, its effects are exactly these items and attributes. Items go in through
    the builtin base's `__setitem__`, bypassing any override, as the trace recorded them."""
    obj = cls.__new__(cls)
    store = storage_type(cls).__setitem__
    for key, value in items.items():
        store(obj, key, value)
    obj.__dict__.update(attrs)
    return obj


class DictObjectValue(UserObjectValue):
    """An instance of a dict subclass: made during capture (source None) or reached from
    the frame, where `contents` holds its items as read (guarded) at capture."""

    def __init__(
        self, cls: type, source: Source | None = None, obj: Any = None, contents=None
    ) -> None:
        super().__init__(cls, source, obj)
        self.contents: DictValue | None = contents if source is not None else DictValue({})

    def describe(self) -> str:
        return f"{self.cls.__name__} (dict subclass) object"

    def _items(self) -> DictValue:
        if self.contents is None:
            raise Unsupported(
                BreakReason.UNSUPPORTED_OBJECT,
                f"items of {self.describe()}, whose class overrides how they are read",
            )
        return self.contents

    def _writable(self, tx: Translator) -> DictValue:
        if self.source is not None:
            raise Unsupported(
                BreakReason.SIDE_EFFECT,
                f"changing the items of {self.describe()} from outside the function",
            )
        tx.ctx.effects.touch(self)
        return self._items()

    # the dunder protocol: Python looks these up on the type
    def _dunder(self, tx: Translator, name: str, args: list[Value]) -> Value:
        return _class_attribute(tx, self, self.cls, name, self.source).call(tx, args, {})

    def getitem(self, tx: Translator, key: Value) -> Value:
        return self._dunder(tx, "__getitem__", [key])

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        self._dunder(tx, "__setitem__", [key, value])

    def delitem(self, tx: Translator, key: Value) -> None:
        self._dunder(tx, "__delitem__", [key])

    def length(self, tx: Translator) -> int:
        return self._dunder(tx, "__len__", []).as_constant()

    def iterate(self, tx: Translator) -> list[Value]:
        if python_override(self.cls, "__iter__") is None:
            return self._items().iterate(tx)
        result = self._dunder(tx, "__iter__", [])
        return result.iterate(tx)

    def truth(self, tx: Translator) -> bool:
        if python_override(self.cls, "__bool__") is not None:
            return self._dunder(tx, "__bool__", []).truth(tx)
        return self.length(tx) > 0

    def contains(self, tx: Translator, item: Value) -> Value:
        return self._dunder(tx, "__contains__", [item])

    def builtin_method(
        self, tx: Translator, descriptor: Any, args: list[Value], kwargs: dict[str, Value]
    ) -> Value:
        """A builtin dict method of the base class (found on the class, or through
        `super()`), applied to the items."""
        name = descriptor.__name__
        owner = getattr(descriptor, "__objclass__", None)
        if owner not in _STORAGE_TYPES and owner is not object:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"builtin method {descriptor!r}")
        if name == "__getitem__":
            return self._get(tx, args[0])
        if name == "__len__":
            return ConstantValue(self._items().length(tx))
        if name == "__contains__":
            return ConstantValue(self._items().contains(args[0], tx))
        if name == "__iter__":
            return IteratorValue(self._items().iterate(tx))
        if name in _READS and name != "copy":
            return self._items().call_method(tx, name, args, kwargs)
        if name in _DIRECT_WRITES:
            items = self._writable(tx)
            if name == "__setitem__":
                items.setitem(tx, args[0], args[1])
            else:
                items.delitem(tx, args[0])
            return ConstantValue(None)
        if name in _CALLBACK_WRITES:
            if not args and not kwargs and name in ("__init__", "update"):
                return ConstantValue(None)
            if storage_type(self.cls) is not dict and any(
                python_override(self.cls, n) for n in _DIRECT_WRITES
            ):
                raise Unsupported(
                    BreakReason.UNSUPPORTED_CALL,
                    f"{owner.__name__}.{name} on {self.describe()}, whose class overrides "
                    "__setitem__/__delitem__",
                )
            items = self._writable(tx)
            if name == "__init__":
                name = "update"
            return items.call_method(tx, name, args, kwargs)
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, f"{owner.__name__}.{name} on {self.describe()}"
        )

    def _get(self, tx: Translator, key: Value) -> Value:
        """`dict.__getitem__`: the item, else the class's `__missing__` (Python only)."""
        items = self._items()
        if items.contains(key, tx):
            return items.items[items._key(key, tx)]
        missing = python_override(self.cls, "__missing__")
        if missing is not None:
            return UserFunctionValue(missing).call(tx, [self, key], {})
        raise missing_key(key, tx)

    def reconstruct(self, em: Emitter) -> None:
        if not self.is_new:
            return Value.reconstruct(self, em)
        em.cg.load_const(rebuild_dict_object, push_null=True)
        em.cg.load_const(self.cls)
        for key, value in self._items().items.items():
            em.reconstruct(key_value(key))
            em.reconstruct(value)
        em.cg.build("MAP", len(self._items().items))
        em.attribute_map(self.attrs)
        em.cg.call(3)


@dataclasses.dataclass(frozen=True, slots=True)
class StorageKeysSource(Source):
    """`list(OrderedDict.keys(obj))`: the keys of a dict-subclass object as its builtin
    storage holds them, whatever the class does to `keys` or `__iter__`."""

    base: Source
    storage: type

    def name(self) -> str:
        return f"{self.storage.__name__}.keys({self.base.name()})"

    def expr(self, scope: Any) -> str:
        keys = scope.const(self.storage.keys, "keys")
        return scope.bind(self, f"list({keys}({self.base.expr(scope)}))")

    def emit(self, cg: Any) -> None:
        raise NotImplementedError("only guarded, never reloaded")


@dataclasses.dataclass(frozen=True, slots=True)
class StorageItemSource(Source):
    """`dict.__getitem__(obj, key)`: an item of a dict-subclass object, read past the
    class's own `__getitem__` (the key guard has made sure it is present)."""

    base: Source
    storage: type
    key: Any

    def name(self) -> str:
        return f"{self.base.name()}[{self.key!r}]"

    def expr(self, scope: Any) -> str:
        get = scope.const(self.storage.__getitem__, "getitem")
        return scope.bind(self, f"{get}({self.base.expr(scope)}, {self.key!r})")

    def emit(self, cg: Any) -> None:
        cg.load_const(self.storage.__getitem__, push_null=True)
        self.base.emit(cg)
        cg.load_const(self.key)
        cg.call(2)


def wrap_dict_object(tx_builder: Any, value: dict, source: Source) -> DictObjectValue:
    """A dict-subclass object reached from the frame. Its items are read from the builtin
    storage (past any override) and their keys guarded, when the keys are strings or ints;
    otherwise they are out of reach and using them is refused."""
    from ember.capture.guards import GuardKind

    cls = type(value)
    storage = storage_type(cls)
    guards = tx_builder.ctx.guards
    guards.add(GuardKind.TYPE_MATCH, source, cls)
    contents = None
    keys = list(storage.keys(value))
    if all(type(k) in (str, int) for k in keys):
        guards.add(GuardKind.EQUALS_MATCH, StorageKeysSource(source, storage), keys)
        contents = DictValue(
            {
                k: tx_builder.wrap(
                    storage.__getitem__(value, k), StorageItemSource(source, storage, k)
                )
                for k in keys
            },
            source,
        )
    return DictObjectValue(cls, source, value, contents)


class InstanceDictValue(Value):
    """`obj.__dict__` of an object from outside the function. Reading one entry (`get`,
    `[]`, `in`: transformers' configs do so on every attribute read) sees the trace's own
    attribute writes first, else guards only that entry and whether its key is present.
    Anything else (iteration, len, keys()) reads the whole dict, every entry guarded: only
    before the trace writes attributes of the object, and it refuses such writes after."""

    def __init__(self, owner: UserObjectValue | ModuleValue, source: Source) -> None:
        self.owner = owner
        self.real = (owner.module if isinstance(owner, ModuleValue) else owner.obj).__dict__
        self.source = source
        self._whole: Value | None = None

    def describe(self) -> str:
        return "instance __dict__"

    def python_type(self) -> type:
        return dict

    def _lookup(self, tx: Translator, key: Value) -> Value | None:
        """The entry for `key`, or None when it is absent."""
        from ember.capture.guards import GuardKind

        k = key.as_constant()
        if type(k) is not str:
            raise Unsupported(BreakReason.UNSUPPORTED_OPERATOR, f"__dict__ key {k!r}")
        pending = tx.ctx.effects.load_attr(self.owner, k)
        if pending is not None:
            return pending
        if tx.ctx.effects.is_deleted(self.owner, k):
            return None
        present = k in self.real
        tx.ctx.guards.add(GuardKind.DICT_CONTAINS, self.source, (k, present))
        if not present:
            return None
        return tx.ctx.builder.wrap(self.real[k], ItemSource(self.source, k))

    def whole(self, tx: Translator) -> Value:
        if self._whole is None:
            if tx.ctx.effects.has_attr_writes(self.owner):
                raise Unsupported(
                    BreakReason.SIDE_EFFECT,
                    f"reading all of __dict__ of {self.owner.describe()} after the trace set "
                    "attributes on it",
                )
            self.owner.dict_read = True
            self._whole = tx.ctx.builder.wrap(self.real, self.source)
        return self._whole

    def getitem(self, tx: Translator, key: Value) -> Value:
        entry = self._lookup(tx, key)
        if entry is None:
            raise missing_key(key)
        return entry

    def contains(self, tx: Translator, key: Value) -> bool:
        return self._lookup(tx, key) is not None

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        if hasattr(dict, name):
            return MethodValue(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        if name == "get" and args and not kwargs:
            entry = self._lookup(tx, args[0])
            if entry is not None:
                return entry
            return args[1] if len(args) > 1 else ConstantValue(None)
        if name == "__contains__":
            return ConstantValue(self.contains(tx, args[0]))
        if name in ("keys", "values", "items", "copy", "__len__"):
            return self.whole(tx).call_method(tx, name, args, kwargs)
        raise Unsupported(BreakReason.SIDE_EFFECT, f"{name}() on {self.describe()}")

    def truth(self, tx: Translator) -> bool:
        return self.whole(tx).truth(tx)

    def length(self, tx: Translator) -> int:
        return self.whole(tx).length(tx)

    def iterate(self, tx: Translator) -> list[Value]:
        return self.whole(tx).iterate(tx)
