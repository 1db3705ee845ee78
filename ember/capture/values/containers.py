"""Tuples, lists, dicts, sets, slices and iterators of symbolic values.

Lists and dicts are mutable: the same Python object is always the same Value (the builder
deduplicates by identity), so a mutation is seen by every alias. Mutating one that came from
outside (it has a source) is recorded in the side-effect ledger and replayed after the graph.
"""

from __future__ import annotations

import collections
import types
from typing import TYPE_CHECKING, Any

import torch

from ember.capture.values import hashed_keys
from ember.capture.values.base import (
    ConstantValue,
    FoldingRaised,
    MissingAttribute,
    Value,
    all_constant,
    from_class_statement,
    missing_key,
)
from ember.capture.values.hashed_keys import HashedKey, TupleKey
from ember.capture.values.identity import IdKey, IdValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


_DICT_WRITES = frozenset(
    ["update", "setdefault", "pop", "popitem", "clear", "move_to_end", "__setitem__"]
)


_DICT_DUNDERS = {"__getitem__": "getitem", "__setitem__": "setitem", "__delitem__": "delitem"}


def _flag(args: list[Value], kwargs: dict, index: int, name: str, default: bool) -> bool:
    if len(args) > index:
        return args[index].as_constant()
    return kwargs[name].as_constant() if name in kwargs else default


def _index(tx: Translator, key: Value) -> Any:
    if isinstance(key, SliceValue):
        return slice(*(p.as_constant() for p in key.parts))
    try:
        return key.as_constant()
    except Exception as exc:
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPERATOR, f"index {key.describe()} into a container"
        ) from exc


class SequenceValue(Value):
    def __init__(self, items: list[Value], source=None) -> None:
        self.items = list(items)
        self.source = source

    def is_constant(self) -> bool:
        return all_constant(self.items)

    def as_constant(self) -> Any:
        return self._rebuilt([v.as_constant() for v in self.items])

    def symbolic(self) -> Any:
        return self._rebuilt([v.symbolic() for v in self.items])

    def _rebuilt(self, values: list[Any]) -> Any:
        return self.python_type()(values)

    def truth(self, tx: Translator) -> bool:
        return bool(self.items)

    def length(self, tx: Translator) -> int:
        return len(self.items)

    def iterate(self, tx: Translator) -> list[Value]:
        return list(self.items)

    def getitem(self, tx: Translator, key: Value) -> Value:
        index = _index(tx, key)
        if isinstance(index, slice):
            return (
                type(self)(self.items[index])
                if not isinstance(self, TupleValue)
                else (TupleValue(self.items[index]))
            )
        try:
            return self.items[index]
        except (IndexError, TypeError) as exc:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, f"index {index!r} of {self.describe()}: {exc}"
            ) from exc

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        if name == "index" and all_constant(args) and self.is_constant():
            return ConstantValue(self.as_constant().index(*(a.as_constant() for a in args)))
        if name == "count" and all_constant(args) and self.is_constant():
            return ConstantValue(self.as_constant().count(args[0].as_constant()))
        if name in ("index", "count") and len(args) == 1 and not kwargs:
            return self._scan(tx, name, args[0])
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL, f"{self.python_type().__name__}.{name}() here"
        )

    def _scan(self, tx: Translator, name: str, item: Value) -> Value:
        """`index`/`count` of items that are not all constants: each item compared as
        CPython does (`el is item or el == item`, a class's own `__eq__` inlined), `index`
        stopping at the first match. A missing item is a break (CPython's ValueError)."""
        from ember.capture.operators import same_value

        if name == "count":
            return ConstantValue(sum(same_value(tx, v, item) for v in list(self.items)))
        for i, v in enumerate(list(self.items)):
            if same_value(tx, v, item):
                return ConstantValue(i)
        raise Unsupported(BreakReason.EXCEPTION_RAISED, f"ValueError: {name}() of a missing item")

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue
        from ember.capture.values.objects import _class_attribute

        cls = self.python_type()
        if cls not in (list, tuple) and _defined_in_python(cls, name):
            return _class_attribute(tx, self, cls, name, None)  # a subclass's own method
        if hasattr(cls, name):
            return MethodValue(self, name)
        raise MissingAttribute(f"{cls.__name__!r} object has no attribute {name!r}")


def _defined_in_python(cls: type, name: str) -> bool:
    """`name` comes from a class statement (a subclass of a builtin), not from C."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return from_class_statement(klass)
    return False


class TupleValue(SequenceValue):
    made_class: Value | None = None
    """The class value of a namedtuple whose class the trace made (values/made_classes.py):
    the instance is rebuilt with that class made again, not the one made while capturing."""

    def __init__(self, items: list[Value], source=None, struct_type: type | None = None):
        super().__init__(items, source)
        self.struct_type = struct_type

    def describe(self) -> str:
        return f"tuple of {len(self.items)}"

    def python_type(self) -> type:
        return self.struct_type or tuple

    def _rebuilt(self, values: list[Any]) -> Any:
        if self.struct_type is not None and hasattr(self.struct_type, "_make"):
            return self.struct_type._make(values)
        return tuple(values)

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        fields = getattr(self.struct_type, "_fields", None) or _return_type_fields(self.struct_type)
        if fields and name in fields:
            return self.items[fields.index(name)]
        if fields and name in ("_replace", "_asdict"):  # modelled in call_method
            return MethodValue(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        fields = getattr(self.struct_type, "_fields", None)
        if fields and name == "_replace":
            values = dict(zip(fields, self.items))
            unknown = set(kwargs) - set(fields)
            if unknown:
                raise Unsupported(BreakReason.EXCEPTION_RAISED, f"unexpected fields {unknown}")
            values.update(kwargs)
            result = TupleValue([values[f] for f in fields], struct_type=self.struct_type)
            result.made_class = self.made_class
            return result
        if fields and name == "_asdict":
            return DictValue(dict(zip(fields, self.items)))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return super().reconstruct(em)
        if self.made_class is not None:
            with em.cg.callee():
                em.reconstruct(self.made_class)
            for item in self.items:
                em.reconstruct(item)
            em.cg.call(len(self.items))
            return
        if self.struct_type is not None and hasattr(self.struct_type, "_make"):
            em.cg.load_const(self.struct_type, push_null=True)
            for item in self.items:
                em.reconstruct(item)
            em.cg.call(len(self.items))
            return
        if self.struct_type is not None:  # torch.return_types: built from one tuple
            em.cg.load_const(self.struct_type, push_null=True)
        for item in self.items:
            em.reconstruct(item)
        em.cg.build("TUPLE", len(self.items))
        if self.struct_type is not None:
            em.cg.call(1)


def _return_type_fields(struct: type | None) -> tuple[str, ...] | None:
    """The field names by position of a structseq (torch.return_types' max, sort, ...;
    os.stat_result): its `__match_args__`, where every position has a name (stat_result's
    unnamed integer times have none: its fields are not modelled)."""
    names = getattr(struct, "__match_args__", None)
    if names is None or len(names) != getattr(struct, "n_sequence_fields", -1):
        return None
    return names


class ListValue(SequenceValue):
    list_type: type = list
    """A subclass of list that keeps list's construction (its Python methods are inlined)."""

    def describe(self) -> str:
        return f"list of {len(self.items)}"

    def python_type(self) -> type:
        return self.list_type

    def _mutate(self, tx: Translator, stored: list[Value] = ()) -> None:
        tx.ctx.effects.mutated(self)
        if stored:
            _note_cycle(tx, self, list(stored))

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        items = self.items
        if name == "append":
            self._mutate(tx, args[:1])
            items.append(args[0])
        elif name == "extend":
            added = args[0].iterate(tx)
            self._mutate(tx, added)
            items.extend(added)
        elif name == "insert":
            self._mutate(tx, args[1:2])
            items.insert(args[0].as_constant(), args[1])
        elif name == "pop":
            self._mutate(tx)
            return items.pop(*(a.as_constant() for a in args))
        elif name == "remove":
            from ember.capture.operators import same_value

            for i, item in enumerate(items):  # `==` on each up to the match, as list does
                if same_value(tx, item, args[0]):
                    self._mutate(tx)
                    del items[i]
                    break
            else:
                raise Unsupported(BreakReason.EXCEPTION_RAISED, "list.remove(x): x not in list")
        elif name == "clear":
            self._mutate(tx)
            items.clear()
        elif name == "reverse":
            self._mutate(tx)
            items.reverse()
        elif name == "copy":
            return ListValue(items)  # list.copy makes a plain list, also for a subclass
        elif name == "sort":  # as sorted() orders (key called once per item), in place
            from ember.capture.values.builtins import sorted_items

            ordered = sorted_items(tx, list(items), kwargs)
            self._mutate(tx)
            items[:] = ordered
        else:
            return super().call_method(tx, name, args, kwargs)
        return ConstantValue(None)

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        index = _index(tx, key)
        stored = value.iterate(tx) if isinstance(index, slice) else [value]
        self._mutate(tx, stored)
        if isinstance(index, slice):
            self.items[index] = stored
        else:
            self.items[index] = value

    def delitem(self, tx: Translator, key: Value) -> None:
        self._mutate(tx)
        del self.items[_index(tx, key)]

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return super().reconstruct(em)
        if self.list_type is not list:
            em.cg.load_const(self.list_type, push_null=True)
        for item in self.items:
            em.reconstruct(item)
        em.cg.build("LIST", len(self.items))
        if self.list_type is not list:
            em.cg.call(1)


class IdentityKey:
    """A dict key that hashes by identity (an nn.Module, a plain user object, a tensor): the
    symbolic value stands in the key slot. The builder gives every outside object exactly one
    Value and objects made during capture are their Value, so the Value's identity is the
    object's and two keys are equal exactly when Python would find them equal."""

    __slots__ = ("value",)

    def __init__(self, value: Value) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdentityKey) and other.value is self.value

    def __repr__(self) -> str:
        return f"<key {self.value.describe()}>"


def hashes_by_identity(cls: type) -> bool:
    return cls.__hash__ in (object.__hash__, torch.Tensor.__hash__) and cls.__eq__ in (
        object.__eq__,
        torch.Tensor.__eq__,
    )


def dict_key(value: Value, tx: Translator | None = None, keys: Any = ()) -> Any:
    """The key under which `value` is stored in a DictValue or SetValue holding `keys`: its
    constant, an IdentityKey for objects whose hash and equality are their identity, or
    (given the translator) the stored key or new HashedKey of an object whose class hashes
    in Python (values/hashed_keys.py). `keys` need only be given where it may hold
    HashedKeys: constants are then matched against them too."""
    if value.is_constant():
        constant = value.as_constant()
        return hashed_keys.constant_key(tx, constant, keys) if tx is not None else constant
    try:
        kind = value.python_type()
    except Unsupported:
        kind = None
    if kind is not None and (kind is torch.Tensor or issubclass(kind, torch.nn.Module)):
        return IdentityKey(value)  # Module and Tensor hash by id (Tensor.__eq__ is elementwise)
    if kind is not None and hashes_by_identity(kind):
        return IdentityKey(value)
    if isinstance(value, IdValue):
        return IdKey(value)
    if isinstance(value, TupleValue):
        parts = tuple(dict_key(item, tx) for item in value.items)
        if any(isinstance(p, HashedKey) for p in parts):  # merged only at the top level
            raise Unsupported(
                BreakReason.UNSUPPORTED_OPERATOR,
                f"dict key {value.describe()} holding objects whose class hashes in Python",
            )
        return TupleKey(value, parts)
    if tx is not None and kind is not None and _user_object(value):
        if hashed_keys.hashes_in_python(kind):
            return hashed_keys.hashed_key(tx, value, keys)
    raise Unsupported(BreakReason.UNSUPPORTED_OPERATOR, f"dict key {value.describe()}")


def _symbolic_key(key: Any) -> bool:
    """A stored key that stands for a symbolic value (not a constant)."""
    return isinstance(key, IdentityKey | HashedKey | IdKey | TupleKey)


def _user_object(value: Value) -> bool:
    from ember.capture.values.exceptions import ExceptionValue
    from ember.capture.values.objects import UserObjectValue

    return isinstance(value, UserObjectValue) and not isinstance(value, ExceptionValue)


def key_value(key: Any) -> Value:
    """The symbolic value of a stored key."""
    return key.value if _symbolic_key(key) else ConstantValue(key)


class DictValue(Value):
    """A dict whose keys are constants or identity-hashed objects (see IdentityKey)."""

    def __init__(self, items: dict[Any, Value], source=None, dict_type: type = dict) -> None:
        self.items = dict(items)
        self.source = source
        self.dict_type = dict_type
        self.read_only = False
        self.holds_hashed = any(isinstance(k, HashedKey) for k in items)
        """Some key is a HashedKey: constants are then looked up among the stored keys too."""
        """A types.MappingProxyType: items are read, never written."""
        self.attrs: dict[str, Value] = {}
        """Attributes set in the trace on an OrderedDict (or other dict type with an instance
        dict) it made: `state_dict()` keeps `_metadata` so."""

    def describe(self) -> str:
        return f"dict of {len(self.items)}"

    def python_type(self) -> type:
        return self.dict_type

    def is_constant(self) -> bool:
        return all_constant(list(self.items.values())) and not any(
            _symbolic_key(k) for k in self.items
        )

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return self.dict_type((k, v.as_constant()) for k, v in self.items.items())

    def truth(self, tx: Translator) -> bool:
        return bool(self.items)

    def length(self, tx: Translator) -> int:
        return len(self.items)

    def iterate(self, tx: Translator) -> list[Value]:
        return [key_value(k) for k in self.items]

    def _key(self, key: Value, tx: Translator | None = None) -> Any:
        """The stored key `key` finds. Given the translator, an object whose class hashes in
        Python is looked up as CPython does (its `__hash__` and `__eq__` inlined); the
        stored keys are searched for a constant only once the dict holds such objects."""
        keys = self.items if self.holds_hashed or not key.is_constant() else ()
        k = dict_key(key, tx, keys)
        if isinstance(k, HashedKey):
            self.holds_hashed = True
        return k

    def getitem(self, tx: Translator, key: Value) -> Value:
        k = self._key(key, tx)
        if k not in self.items:
            raise missing_key(key, tx)
        return self.items[k]

    def contains(self, key: Value, tx: Translator | None = None) -> bool:
        return self._key(key, tx) in self.items

    def setitem(self, tx: Translator, key: Value, value: Value) -> None:
        self._writable()
        k = self._key(key, tx)
        tx.ctx.effects.mutated(self)
        _note_cycle(tx, self, [value])
        self.items[k] = value

    def delitem(self, tx: Translator, key: Value) -> None:
        self._writable()
        k = self._key(key, tx)
        tx.ctx.effects.mutated(self)
        del self.items[k]

    def _writable(self) -> None:
        if self.read_only:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED,
                f"TypeError: {self.dict_type.__name__!r} object does not support item assignment",
            )

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        if name in self.attrs:
            return self.attrs[name]
        if hasattr(self.dict_type, name):
            return MethodValue(self, name)
        return super().getattr(tx, name)

    def setattr(self, tx: Translator, name: str, value: Value) -> None:
        if self.source is not None or self.dict_type.__dictoffset__ == 0:
            return super().setattr(tx, name, value)
        if hasattr(self.dict_type, name):  # a method, or a descriptor of the class
            return super().setattr(tx, name, value)
        self.attrs[name] = value

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        from ember.capture.values.sets import DictViewValue

        items = self.items
        if name in ("keys", "values", "items"):
            return DictViewValue(self, name)
        if self.read_only and name in _DICT_WRITES:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED,
                f"AttributeError: {self.dict_type.__name__!r} object has no attribute {name!r}",
            )
        if name == "get":
            default = args[1] if len(args) > 1 else ConstantValue(None)
            return items.get(self._key(args[0], tx), default)
        if name == "__contains__":
            return ConstantValue(self._key(args[0], tx) in items)
        if name == "copy":
            return DictValue(items, dict_type=self.dict_type)
        if name in _DICT_DUNDERS:  # `d.__setitem__` bound and called (a hook's recorder)
            result = getattr(self, _DICT_DUNDERS[name])(tx, *args)
            return ConstantValue(None) if result is None else result
        tx.ctx.effects.mutated(self)
        if name == "update":
            if args:
                for k, v in _pairs(tx, args[0]):
                    _note_cycle(tx, self, [v])
                    items[k if not isinstance(k, Value) else self._key(k, tx)] = v
            _note_cycle(tx, self, list(kwargs.values()))
            items.update(kwargs)
            return ConstantValue(None)
        if name == "setdefault":
            default = args[1] if len(args) > 1 else ConstantValue(None)
            _note_cycle(tx, self, [default])
            return items.setdefault(self._key(args[0], tx), default)
        if name == "pop":
            k = self._key(args[0], tx)
            if k in items:
                return items.pop(k)
            if len(args) > 1:
                return args[1]
            raise missing_key(args[0], tx)
        if name == "clear":
            items.clear()
            return ConstantValue(None)
        if name == "popitem":
            return self._popitem(_flag(args, kwargs, 0, "last", True))
        if name == "move_to_end" and issubclass(self.dict_type, collections.OrderedDict):
            self._move_to_end(self._key(args[0], tx), _flag(args, kwargs, 1, "last", True))
            return ConstantValue(None)
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"dict.{name}()")

    def _popitem(self, last: bool) -> Value:
        if not self.items:
            error = KeyError("popitem(): dictionary is empty")
            raise FoldingRaised(error, f"KeyError: {error}")
        key = next(reversed(self.items)) if last else next(iter(self.items))
        return TupleValue([key_value(key), self.items.pop(key)])

    def _move_to_end(self, key: Any, last: bool) -> None:
        if key not in self.items:
            raise Unsupported(BreakReason.EXCEPTION_RAISED, f"KeyError: {key!r}")
        value = self.items.pop(key)
        if last:
            self.items[key] = value
            return
        rest = dict(self.items)  # the same dict object, reordered in place
        self.items.clear()
        self.items[key] = value
        self.items.update(rest)

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return super().reconstruct(em)
        if self.attrs:
            em.cg.load_const(_with_attributes, push_null=True)
        if self.dict_type is not dict:
            em.cg.load_const(self.dict_type, push_null=True)
        for k, v in self.items.items():
            em.reconstruct(key_value(k))
            em.reconstruct(v)
        em.cg.build("MAP", len(self.items))
        if self.dict_type is not dict:
            em.cg.call(1)
        if self.attrs:
            em.attribute_map(self.attrs)
            em.cg.call(2)


def _with_attributes(obj: Any, attrs: dict[str, Any]) -> Any:
    """`obj` with these attributes set (break code rebuilding an OrderedDict the trace
    made and gave attributes)."""
    for name, value in attrs.items():
        setattr(obj, name, value)
    return obj


def _pairs(tx: Translator, other: Value) -> Any:
    """What `dict.update(other)` reads: a dict's items (also of a dict subclass that leaves
    iteration alone, which CPython copies directly), a mapping's keys and `[]`, or pairs."""
    from ember.capture.values.mappings import DictObjectValue
    from ember.capture.values.objects import python_override

    if isinstance(other, DictValue):
        return other.items.items()
    if isinstance(other, DictObjectValue) and python_override(other.cls, "__iter__") is None:
        return other._items().items.items()
    try:
        is_mapping = hasattr(other.python_type(), "keys")
    except Unsupported:
        is_mapping = False
    if is_mapping:
        keys = other.getattr(tx, "keys").call(tx, [], {}).iterate(tx)
        return [(k, other.getitem(tx, k)) for k in keys]
    return [tuple(p.iterate(tx)) for p in other.iterate(tx)]


class SliceValue(Value):
    def __init__(self, parts: list[Value]) -> None:
        self.parts = parts

    def getattr(self, tx: Translator, name: str) -> Value:
        if name in ("start", "stop", "step"):
            full = list(self.parts) if len(self.parts) != 1 else [ConstantValue(None), *self.parts]
            full += [ConstantValue(None)] * (3 - len(full))
            return full[("start", "stop", "step").index(name)]
        if self.is_constant():  # `indices()`
            return ConstantValue(self.as_constant()).getattr(tx, name)
        return super().getattr(tx, name)

    def python_type(self) -> type:
        return slice

    def reconstruct(self, em: Emitter) -> None:
        for part in self.parts:
            em.reconstruct(part)
        em.cg.build("SLICE", len(self.parts))

    def is_constant(self) -> bool:
        return all_constant(self.parts)

    def as_constant(self) -> Any:
        return slice(*(p.as_constant() for p in self.parts))


class IteratorValue(Value):
    """An iterator over a list of values (a list's own item list, or a snapshot). Iterators
    that compute their items when pulled (map, filter, zip, generators, itertools) are in
    values/iterators.py; all share this protocol: `next(tx)` is the next item or None at the
    end, `iterate(tx)` pulls the rest, and `items[position:]` is what is left once pulled."""

    def __init__(self, items: list[Value], returned: Value | None = None) -> None:
        self.items = items
        self.position = 0
        self.returned = returned
        """What a generator returned after its last yield (the value of `yield from`)."""
        self.of_list: ListValue | None = None
        """The list this iterator walks (it reads the list itself: items appended later
        are visited)."""

    def describe(self) -> str:
        return "iterator"

    def stop_arguments(self) -> list[Value]:
        """The arguments of the StopIteration that reports this iterator's end: a
        generator's return value (`e.value`) the first time, nothing after that nor for
        other iterators, as CPython raises it."""
        returned, self.returned = self.returned, None
        if returned is None or (returned.is_constant() and returned.as_constant() is None):
            return []
        return [returned]

    def truth(self, tx: Translator) -> bool:
        return True  # no __len__ or __bool__: always true

    def next(self, tx: Translator) -> Value | None:
        if self.position >= len(self.items):
            return None
        self.position += 1
        return self.items[self.position - 1]

    def iterate(self, tx: Translator) -> list[Value]:
        rest = self.items[self.position :]
        self.position = len(self.items)
        return rest

    def reconstruct(self, em: Emitter) -> None:
        """After a graph break: a list's iterator is an iterator of the rebuilt list moved
        to where this one is (appends after the break are still visited); any other, an
        iterator over the items left."""
        if self.source is not None:
            return super().reconstruct(em)
        self.rebuild_rest(em)

    def rebuild_rest(self, em: Emitter) -> None:
        if self.of_list is not None:
            em.cg.load_const(list_iterator_at, push_null=True)
            em.reconstruct(self.of_list)
            em.cg.load_const(self.position)
            em.cg.call(2)
            return
        em.cg.load_const(iter, push_null=True)
        em.reconstruct(TupleValue(self.items[self.position :]))
        em.cg.call(1)


class OutsideIterator(IteratorValue):
    """A list or tuple iterator from outside (an argument; what break code hands a resume
    function for an iterator alive at the break): its sequence is wrapped as any list or
    tuple, from where the iterator stands. Pulling it is a change to an outside object: the
    ledger moves the real iterator to where the trace left it (`__setstate__`), or runs
    it out if the trace did."""

    def __init__(self, items: list[Value], source: Any, start: int, kind: type) -> None:
        super().__init__(items)
        self.source = source
        self.position = start
        self.kind = kind
        self.ran_out = False

    def describe(self) -> str:
        return f"{self.kind.__name__} from outside"

    def python_type(self) -> type:
        return self.kind

    def next(self, tx: Translator) -> Value | None:
        tx.ctx.effects.moved(self)
        item = super().next(tx)
        self.ran_out = item is None
        return item

    def iterate(self, tx: Translator) -> list[Value]:
        tx.ctx.effects.moved(self)
        self.ran_out = True
        return super().iterate(tx)

    def replay_position(self, em: Emitter) -> None:
        """Bring the real iterator to where the trace left it."""
        if self.ran_out:
            em.cg.load_const(run_out, push_null=True)
            self.source.emit(em.cg)
            em.cg.call(1)
        else:
            self.source.emit(em.cg)
            em.cg.load_method("__setstate__")
            em.cg.load_const(self.position)
            em.cg.call(1)
        em.cg.pop_top()


def run_out(it: Any) -> None:
    """Pull an iterator to its end (a list's iterator then forgets its list, as after a
    loop over it)."""
    for _ in it:
        pass


def list_iterator_at(items: list, position: int) -> Any:
    """`iter(items)` advanced by `position` items."""
    it = iter(items)
    for _ in range(position):
        next(it, None)
    return it


def iter_of(tx: Translator, value: Value) -> Value:
    """`iter(value)` for GET_ITER and the `iter()` builtin: as `iterator_over`, but a
    generator from outside is itself (each pull is then a break of FOR_ITER or next())."""
    if _is_opaque_generator(value):
        return value
    return iterator_over(tx, value)


def iterator_over(tx: Translator, value: Value) -> IteratorValue:
    """`iter(value)` for consumers that pull in the trace (zip, islice, sorted, ...). A
    list's iterator reads the list itself, as CPython's does, so items appended while
    looping are visited (a work queue); other iterables are snapshots. A generator from
    outside cannot be pulled in the trace: a break where it is consumed."""
    if isinstance(value, IteratorValue):
        return value
    if _is_opaque_generator(value):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"consuming {value.describe()}, a generator made outside the trace",
        )
    if isinstance(value, ListValue):
        it = IteratorValue(value.items)
        it.of_list = value
        return it
    own = getattr(value, "iterator", None)  # a class with a Python __iter__
    iterator = own(tx) if own is not None else None
    if iterator is not None:
        return iterator_over(tx, iterator)
    return IteratorValue(value.iterate(tx))


def _is_opaque_generator(value: Value) -> bool:
    """A generator from outside the trace (made by CPython at a break, or passed in), held
    as an object ember cannot look into."""
    from ember.capture.values.builder import OpaqueValue

    return isinstance(value, OpaqueValue) and value.cls is types.GeneratorType


def _note_cycle(tx: Translator, owner: Value, stored: list[Value]) -> None:
    """values/reachability.py `note_cycle` (imported late: it imports the iterators, which
    import this module)."""
    from ember.capture.values.reachability import note_cycle

    note_cycle(tx, owner, stored)
