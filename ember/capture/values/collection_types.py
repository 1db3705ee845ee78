"""The `collections` types and kin that CPython implements in C, or whose Python code relies
on C helpers or on catching KeyError: defaultdict (with its factory), deque, Counter's
counting helper, ChainMap lookups, `dict.fromkeys` and `types.MappingProxyType`.

OrderedDict's own methods (move_to_end, popitem(last=)) are on `DictValue`; Counter and
ChainMap are Python classes whose methods are inlined, except the one helper each that the
trace cannot follow (`_count_elements` is C; `ChainMap.__getitem__` catches KeyError).
"""

from __future__ import annotations

import collections
import operator
import types
from typing import TYPE_CHECKING, Any

from ember.capture.operators import apply
from ember.capture.values.base import ConstantValue, FoldingRaised, Value, missing_key
from ember.capture.values.builtins import handles
from ember.capture.values.containers import DictValue, ListValue, iterator_over
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


class DefaultDictValue(DictValue):
    """A collections.defaultdict: a missing key read with `[]` calls the factory (inlined)
    and stores what it returns, as `__missing__` does."""

    def __init__(self, items: dict, factory: Value, source: Any = None) -> None:
        super().__init__(items, source, dict_type=collections.defaultdict)
        self.factory = factory

    def getitem(self, tx: Translator, key: Value) -> Value:
        k = self._key(key, tx)
        if k in self.items:
            return self.items[k]
        if self.factory.is_constant() and self.factory.as_constant() is None:
            raise missing_key(key, tx)
        value = self.factory.call(tx, [], {})
        self.setitem(tx, key, value)
        return value

    def getattr(self, tx: Translator, name: str) -> Value:
        if name == "default_factory":
            return self.factory
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        if name == "copy":
            return DefaultDictValue(self.items, self.factory)
        if name == "__missing__":
            return self.getitem(tx, args[0])
        return super().call_method(tx, name, args, kwargs)

    def contained(self) -> list[Value]:
        return [self.factory]

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return Value.reconstruct(self, em)
        em.cg.load_const(collections.defaultdict, push_null=True)
        em.reconstruct(self.factory)
        plain = DictValue(self.items)
        em.reconstruct(plain)
        em.cg.call(2)


@handles(collections.defaultdict)
def _defaultdict(tx, args, kwargs):
    result = DefaultDictValue({}, args[0] if args else ConstantValue(None))
    if len(args) > 1 or kwargs:
        result.call_method(tx, "update", list(args[1:]), kwargs)
    return result


class DequeValue(ListValue):
    """A collections.deque: a list of values with a maximum length, which appending past
    drops from the other end."""

    def __init__(self, items: list[Value], maxlen: int | None, source: Any = None) -> None:
        super().__init__(items, source)
        self.maxlen = maxlen

    def describe(self) -> str:
        return f"deque of {len(self.items)}"

    def python_type(self) -> type:
        return collections.deque

    def getattr(self, tx: Translator, name: str) -> Value:
        if name == "maxlen":
            return ConstantValue(self.maxlen)
        return super().getattr(tx, name)

    def _trim(self, from_left: bool) -> None:
        while self.maxlen is not None and len(self.items) > self.maxlen:
            self.items.pop(0 if from_left else -1)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        items = self.items
        if name in ("append", "extend", "insert"):
            super().call_method(tx, name, args, kwargs)
            self._trim(from_left=True)
            return ConstantValue(None)
        if name in ("appendleft", "extendleft"):
            self._mutate(tx)
            new = [args[0]] if name == "appendleft" else args[0].iterate(tx)
            for value in new:
                items.insert(0, value)
            self._trim(from_left=False)
            return ConstantValue(None)
        if name in ("pop", "popleft"):
            if args:
                raise Unsupported(BreakReason.EXCEPTION_RAISED, f"deque.{name}() takes no index")
            if not items:
                raise FoldingRaised(
                    IndexError("pop from an empty deque"), "IndexError: empty deque"
                )
            self._mutate(tx)
            return items.pop(-1 if name == "pop" else 0)
        if name == "rotate":
            steps = args[0].as_constant() if args else 1
            if items:
                self._mutate(tx)
                steps %= len(items)
                items[:] = items[-steps:] + items[:-steps]
            return ConstantValue(None)
        if name == "copy":
            return DequeValue(list(items), self.maxlen)
        return super().call_method(tx, name, args, kwargs)

    def getitem(self, tx: Translator, key: Value) -> Value:
        if not isinstance(key.as_constant(), int):
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, "TypeError: deque indices must be integers"
            )
        return super().getitem(tx, key)

    def reconstruct(self, em: Emitter) -> None:
        if self.source is not None:
            return Value.reconstruct(self, em)
        em.cg.load_const(collections.deque, push_null=True)
        em.reconstruct(ListValue(self.items))
        em.cg.load_const(self.maxlen)
        em.cg.call(2)


@handles(collections.deque)
def _deque(tx, args, kwargs):
    items = iterator_over(tx, args[0]).iterate(tx) if args else []
    maxlen = (args[1] if len(args) > 1 else kwargs.get("maxlen", ConstantValue(None))).as_constant()
    result = DequeValue(list(items), maxlen)
    result._trim(from_left=True)
    return result


@handles(collections._count_elements)
def _count_elements(tx, args, kwargs):
    """Counter's C helper: `mapping[e] = mapping.get(e, 0) + 1` for each element."""
    mapping, iterable = args
    iterator = iterator_over(tx, iterable)
    while (element := iterator.next(tx)) is not None:
        current = mapping.getattr(tx, "get").call(tx, [element, ConstantValue(0)], {})
        mapping.setitem(tx, element, apply(tx, operator.add, [current, ConstantValue(1)]))
    return ConstantValue(None)


@handles(collections.ChainMap.__getitem__)
def _chain_map_getitem(tx, args, kwargs):
    """The first map that has the key (ChainMap's own code catches each KeyError)."""
    chain, key = args
    for mapping in chain.getattr(tx, "maps").iterate(tx):
        if apply(tx, operator.contains, [mapping, key]).as_constant():
            return mapping.getitem(tx, key)
    return chain.getattr(tx, "__missing__").call(tx, [key], {})


def _fromkeys(dict_type: type):
    def handler(tx, args, kwargs):
        value = args[1] if len(args) > 1 else ConstantValue(None)
        result = DictValue({}, dict_type=dict_type)
        for key in iterator_over(tx, args[0]).iterate(tx):
            result.items[result._key(key, tx)] = value
        return result

    return handler


for _type in (dict, collections.OrderedDict):
    handles(_type.fromkeys)(_fromkeys(_type))


@handles(types.MappingProxyType)
def _mapping_proxy(tx, args, kwargs):
    """A read-only view of a dict: it shares the dict's items, so it sees later changes."""
    target = args[0]
    if not isinstance(target, DictValue):
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"MappingProxyType({target.describe()})")
    proxy = DictValue({}, dict_type=types.MappingProxyType)
    proxy.items = target.items
    proxy.read_only = True
    return proxy
