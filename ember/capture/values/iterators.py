"""Iterators that compute their items when they are pulled: `map`, `filter`, `zip`,
`enumerate`, generators (a generator expression, a function with `yield`) and the lazy
members of `itertools`.

Python runs a `map` callback, a `filter` predicate or a generator body only when the consumer
asks for the next item, interleaved with the consumer's own work; a callback with side effects
(appending to a list, counting) shows that order. These values do the same: each pull runs
the callback (inlined, as any call) at the moment the consumer pulls. What was pulled stays in
`items` (the protocol of `IteratorValue`), so a graph break can see what is left.

At a graph break an iterator that is still alive is run to its end first (`settle`), when
doing so has no side effect a user could see (only tensor work and pure Python); otherwise
break code makes it again lazily (frame.py), or, for a generator, whose frame cannot be made
again mid-way, the capture ends the graph where the generator is made.
"""

from __future__ import annotations

import itertools
import types
from typing import TYPE_CHECKING, Any

from ember.capture.output_graph import draws_random
from ember.capture.values.base import ConstantValue, FoldingRaised, Value
from ember.capture.values.containers import IteratorValue, TupleValue, iterator_over
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


class GeneratorSuspended(Exception):
    """Raised by YIELD_VALUE in a generator frame: the frame stops after the yield, with its
    state kept, until its consumer pulls again."""


class LazyIterator(IteratorValue):
    """An iterator that makes each item on demand (`pull`); `kind` is its Python type."""

    kind: type = object
    callbacks: frozenset[int] = frozenset()
    """The positions among `lazy_parts`' arguments of the functions it calls on items."""

    def __init__(self) -> None:
        super().__init__([])
        self.exhausted = False

    def describe(self) -> str:
        return f"{self.kind.__name__} iterator"

    def python_type(self) -> type:
        return self.kind

    def pull(self, tx: Translator) -> Value | None:
        """The next item, computed now; None at the end."""
        raise NotImplementedError

    def _produce(self, tx: Translator) -> Value | None:
        if self.exhausted:
            return None
        tx.ctx.effects.advance(self)  # state that a failed instruction could not put back
        item = self.pull(tx)
        if item is None:
            self.exhausted = True
            return None
        self.items.append(item)
        return item

    def next(self, tx: Translator) -> Value | None:
        if self.position < len(self.items) or self._produce(tx) is not None:
            self.position += 1
            return self.items[self.position - 1]
        return None

    def iterate(self, tx: Translator) -> list[Value]:
        rest = []
        while (item := self.next(tx)) is not None:
            rest.append(item)
        return rest

    def settle(self, tx: Translator) -> None:
        """Compute every remaining item now (not consuming them), for a graph break that
        must hand the rest to CPython. Refused when that would run a side effect early,
        random draws included (the code after the break may draw too: moving these ahead
        would give both other numbers)."""
        effects = tx.ctx.effects
        before = effects.version - effects.advances
        graph = tx.ctx.out.graph
        known = set(graph.nodes)
        while self._produce(tx) is not None:
            pass
        if effects.version - effects.advances != before:
            what = "has side effects"
        elif any(draws_random(n) for n in graph.nodes if n not in known):
            what = "draws random numbers"
        else:
            return
        raise Unsupported(
            BreakReason.SIDE_EFFECT,
            f"a {self.describe()} alive at the graph break {what} when pulled, "
            "so its items cannot be computed ahead of the code after the break",
        )

    def lazy_parts(self) -> tuple[Any, list[Value], dict[str, Value]] | None:
        """How CPython would make this iterator as it stands now, for break code to make
        it again (Dynamo's reconstruct): the maker, its arguments and keywords; None when
        it cannot be made again (a generator's frame, itertools state)."""
        return None

    def lazily_rebuildable(self) -> bool:
        """Whether break code can make this iterator again without computing its items:
        nothing pulled and not consumed, and its callbacks and sources rebuildable."""
        parts = self.lazy_parts()
        if parts is None or self.exhausted or self.position != len(self.items):
            return False
        return all(_rebuildable_part(v) for v in [*parts[1], *parts[2].values()])

    def contained(self) -> list[Value]:
        parts = None if self.exhausted else self.lazy_parts()
        if parts is None:
            return []
        return [*parts[1], *parts[2].values()]

    def reconstruct(self, em: Emitter) -> None:
        """A settled (or finished) iterator is an iterator over its items left; one not
        settled is made again, lazy, over its rebuilt sources: the callbacks run when
        CPython pulls, in order with the code after the break."""
        if self.exhausted:
            return self.rebuild_rest(em)
        if not self.lazily_rebuildable():
            return Value.reconstruct(self, em)
        maker, args, kwargs = self.lazy_parts()
        em.cg.load_const(maker, push_null=True)
        for i, part in enumerate([*args, *kwargs.values()]):
            if i in self.callbacks:  # called by CPython after the break: through ember
                em.reconstruct_callback(part)
            else:
                em.reconstruct(part)
        em.cg.call(len(args) + len(kwargs), tuple(kwargs))


def _rebuildable_part(value: Value) -> bool:
    """A callback or source of an iterator made again at a break: an iterator must itself
    be made again (or be a plain one); anything else is rebuilt as any value."""
    if isinstance(value, LazyIterator):
        return value.lazily_rebuildable()
    return True


class MapIterator(LazyIterator):
    kind = map
    callbacks = frozenset({0})

    def __init__(self, fn: Value, sources: list[IteratorValue]) -> None:
        super().__init__()
        self.fn = fn
        self.sources = sources

    def pull(self, tx: Translator) -> Value | None:
        row = []
        for source in self.sources:
            item = source.next(tx)
            if item is None:
                return None
            row.append(item)
        return self.fn.call(tx, row, {})

    def lazy_parts(self) -> tuple[Any, list[Value], dict[str, Value]] | None:
        return self.kind, [self.fn, *self.sources], {}


class StarmapIterator(MapIterator):
    kind = itertools.starmap

    def pull(self, tx: Translator) -> Value | None:
        item = self.sources[0].next(tx)
        return None if item is None else self.fn.call(tx, item.iterate(tx), {})


class FilterIterator(LazyIterator):
    kind = filter
    callbacks = frozenset({0})

    def __init__(self, fn: Value | None, source: IteratorValue, keep_if: bool = True) -> None:
        super().__init__()
        self.fn = fn
        self.inner = source
        self.keep_if = keep_if
        """False for itertools.filterfalse."""

    def pull(self, tx: Translator) -> Value | None:
        while (item := self.inner.next(tx)) is not None:
            verdict = item if self.fn is None else self.fn.call(tx, [item], {})
            if verdict.truth(tx) is self.keep_if:
                return item
        return None

    def lazy_parts(self) -> tuple[Any, list[Value], dict[str, Value]] | None:
        fn = ConstantValue(None) if self.fn is None else self.fn
        return (filter if self.keep_if else itertools.filterfalse), [fn, self.inner], {}


class ZipIterator(LazyIterator):
    kind = zip

    def __init__(self, sources: list[IteratorValue], strict: bool = False) -> None:
        super().__init__()
        self.sources = sources
        self.strict = strict

    def pull(self, tx: Translator) -> Value | None:
        if not self.sources:
            return None
        row = []
        for i, source in enumerate(self.sources):
            item = source.next(tx)
            if item is None:
                if self.strict:
                    self._check_lengths(tx, i)
                return None
            row.append(item)
        return TupleValue(row)

    def lazy_parts(self) -> tuple[Any, list[Value], dict[str, Value]] | None:
        strict = {"strict": ConstantValue(True)} if self.strict else {}
        return zip, list(self.sources), strict

    def _check_lengths(self, tx: Translator, ended: int) -> None:
        """zip(strict=True): the first source to end must end them all (CPython pulls once
        more from each of the later ones to see)."""
        if ended > 0:
            raise _zip_mismatch(ended + 1, "shorter")
        for i, source in enumerate(self.sources[1:], start=2):
            if source.next(tx) is not None:
                raise _zip_mismatch(i, "longer")


def _zip_mismatch(position: int, how: str) -> FoldingRaised:
    """CPython's ValueError of zip(strict=True) (a handler of the trace may catch it)."""
    before = "argument 1" if position == 2 else f"arguments 1-{position - 1}"
    error = ValueError(f"zip() argument {position} is {how} than {before}")
    return FoldingRaised(error, f"ValueError: {error}")


class ZipLongestIterator(LazyIterator):
    kind = itertools.zip_longest

    def __init__(self, sources: list[IteratorValue], fill: Value) -> None:
        super().__init__()
        self.sources = sources
        self.fill = fill
        self.done = [False] * len(sources)

    def pull(self, tx: Translator) -> Value | None:
        row = []
        for i, source in enumerate(self.sources):
            item = None if self.done[i] else source.next(tx)
            if item is None:
                self.done[i] = True
                if all(self.done):
                    return None
                item = self.fill
            row.append(item)
        return TupleValue(row) if row else None


class EnumerateIterator(LazyIterator):
    kind = enumerate

    def __init__(self, source: IteratorValue, start: int) -> None:
        super().__init__()
        self.inner = source
        self.count = start

    def pull(self, tx: Translator) -> Value | None:
        item = self.inner.next(tx)
        if item is None:
            return None
        self.count += 1
        return TupleValue([ConstantValue(self.count - 1), item])

    def lazy_parts(self) -> tuple[Any, list[Value], dict[str, Value]] | None:
        if not isinstance(self.count, int):
            return None
        return enumerate, [self.inner, ConstantValue(self.count)], {}


class OutsideEnumerate(EnumerateIterator):
    """An enumerate object from outside (an argument; one break code made again lazily
    and handed to a resume function), pulled in the trace over its `__reduce__` parts: the
    iterator it wraps (a list or tuple iterator, or a map/filter/zip over them) and its
    count. Its count cannot be set, so the ledger pulls the real object as many times as
    the trace did (`advance_enumerate`, before the wrapped iterator's own position is put
    back: pulling those has no side effect). It stays the caller's object at a break."""

    def __init__(self, source_iterator: IteratorValue, start: int, source: Any) -> None:
        super().__init__(source_iterator, start)
        self.source = source
        self.pulls = 0

    def describe(self) -> str:
        return "enumerate from outside"

    def pull(self, tx: Translator) -> Value | None:
        tx.ctx.effects.moved(self)  # first: its replay runs before the wrapped iterator's
        self.pulls += 1
        return super().pull(tx)

    def settle(self, tx: Translator) -> None:
        """Nothing to compute ahead: break code hands on the caller's object, moved."""

    def lazily_rebuildable(self) -> bool:
        return False

    def reconstruct(self, em: Emitter) -> None:
        self.source.emit(em.cg)

    def replay_position(self, em: Emitter) -> None:
        em.cg.load_const(advance_enumerate, push_null=True)
        self.source.emit(em.cg)
        em.cg.load_const(self.pulls)
        em.cg.call(2)
        em.cg.pop_top()


def advance_enumerate(it: Any, pulls: int) -> None:
    """Pull a real enumerate object `pulls` times (the trace pulled its model so often)."""
    for _ in range(pulls):
        next(it, None)


class GeneratorIterator(LazyIterator):
    """A generator object: its frame (a child translator) runs up to the next yield each
    time the consumer pulls, and keeps its state in between."""

    kind = types.GeneratorType

    def __init__(self, frame: Translator, made_at: int | None = None) -> None:
        super().__init__()
        self.frame = frame
        self.made_at = made_at
        """The step (ctx.steps) of the instruction that made it: where the graph ends when
        it cannot be computed ahead at a break (frame.py `_BreakAtCreation`)."""
        frame.yielded = []  # marks the frame as a generator for RETURN_GENERATOR / YIELD_VALUE

    def describe(self) -> str:
        return f"generator {self.frame.code.co_qualname}"

    def reconstruct(self, em: Emitter) -> None:
        """A generator that outlives the graph with its frame part-way (returned, held by
        an object, alive at a break) cannot be made again: frame.py ends the graph where
        it is made instead (GeneratorNotRebuilt)."""
        if self.exhausted:
            return super().reconstruct(em)
        raise GeneratorNotRebuilt(self)

    def getattr(self, tx: Translator, name: str) -> Value:
        from ember.capture.values.functions import MethodValue

        if name in ("send", "throw", "close"):
            return MethodValue(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Translator, name: str, args: list[Value], kwargs: dict) -> Value:
        """`gen.send(value)`: the frame resumes with `value` as what its `yield` evaluates
        to (YIELD_VALUE left None there), and runs to its next yield."""
        from ember.capture.values import generator_methods
        from ember.capture.values.exceptions import raise_in_trace

        if self.position < len(self.items):
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"{name}() on a generator pulled ahead")
        if name == "throw" and 1 <= len(args) <= 3 and not kwargs:
            exc = generator_methods.thrown_exception(tx, args)
            return generator_methods.throw(tx, self, exc)
        if name == "close" and not args and not kwargs:
            return generator_methods.close(tx, self)
        if name != "send" or len(args) != 1 or kwargs:
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"generator.{name}() here")
        (value,) = args
        started = bool(self.items)
        if not started and not (value.is_constant() and value.as_constant() is None):
            message = "can't send non-None value to a just-started generator"
            raise_in_trace(tx, TypeError, [ConstantValue(message)], f"TypeError: {message}")
        if started and not self.exhausted:
            self.frame.stack[-1] = value
        item = self.next(tx)
        if item is None:
            raise_in_trace(
                tx, StopIteration, self.stop_arguments(), "StopIteration from generator.send()"
            )
        return item

    def pull(self, tx: Translator) -> Value | None:
        try:
            self.returned = self.frame.run()
        except GeneratorSuspended:
            return self.frame.yielded.pop()
        except Exception:  # raised out of its frame: a finished generator, as in Python
            self.exhausted = True
            raise
        return None


class ChainIterator(LazyIterator):
    """itertools.chain: each iterable is made an iterator only when the one before ends."""

    kind = itertools.chain

    def __init__(self, iterables: IteratorValue) -> None:
        super().__init__()
        self.iterables = iterables
        self.current: IteratorValue | None = None

    def pull(self, tx: Translator) -> Value | None:
        while True:
            if self.current is None:
                iterable = self.iterables.next(tx)
                if iterable is None:
                    return None
                self.current = iterator_over(tx, iterable)
            item = self.current.next(tx)
            if item is not None:
                return item
            self.current = None


class IsliceIterator(LazyIterator):
    """itertools.islice, pulling exactly what CPython's pulls: skipped items are pulled,
    and nothing past `stop`."""

    kind = itertools.islice

    def __init__(self, source: IteratorValue, start: int, stop: int | None, step: int) -> None:
        super().__init__()
        self.inner = source
        self.wanted = start
        self.stop = stop
        self.step = step
        self.count = 0

    def pull(self, tx: Translator) -> Value | None:
        while self.count < self.wanted:
            if self.inner.next(tx) is None:
                return None
            self.count += 1
        if self.stop is not None and self.count >= self.stop:
            return None
        item = self.inner.next(tx)
        if item is None:
            return None
        self.count += 1
        self.wanted += self.step
        if self.stop is not None and self.wanted > self.stop:
            self.wanted = self.stop
        return item


class AccumulateIterator(LazyIterator):
    kind = itertools.accumulate

    def __init__(self, source: IteratorValue, fn: Value | None, initial: Value | None) -> None:
        super().__init__()
        self.inner = source
        self.fn = fn
        self.total = initial

    def pull(self, tx: Translator) -> Value | None:
        from ember.capture.operators import apply

        if self.total is not None and not self.items:
            return self.total  # the initial value comes first
        item = self.inner.next(tx)
        if item is None:
            return None
        if self.total is None:
            self.total = item
        elif self.fn is None:
            self.total = apply(tx, _add, [self.total, item])
        else:
            self.total = self.fn.call(tx, [self.total, item], {})
        return self.total


def _add(a: Any, b: Any) -> Any:
    return a + b


class CountIterator(LazyIterator):
    """itertools.count / itertools.repeat: constants, made one at a time."""

    kind = itertools.count

    def __init__(self, start: Any, step: Any) -> None:
        super().__init__()
        self.value = start
        self.step = step

    def pull(self, tx: Translator) -> Value | None:
        self.value += self.step
        return ConstantValue(self.value - self.step)


class RepeatIterator(LazyIterator):
    kind = itertools.repeat

    def __init__(self, value: Value, times: int | None) -> None:
        super().__init__()
        self.value = value
        self.left = times

    def pull(self, tx: Translator) -> Value | None:
        if self.left is not None:
            if self.left <= 0:
                return None
            self.left -= 1
        return self.value


class PairwiseIterator(LazyIterator):
    kind = itertools.pairwise

    def __init__(self, source: IteratorValue) -> None:
        super().__init__()
        self.inner = source
        self.last: Value | None = None

    def pull(self, tx: Translator) -> Value | None:
        if self.last is None:
            self.last = self.inner.next(tx)
            if self.last is None:
                return None
        item = self.inner.next(tx)
        if item is None:
            return None
        pair, self.last = TupleValue([self.last, item]), item
        return pair


class WhileIterator(LazyIterator):
    """itertools.takewhile (stop at the first item failing the predicate) and dropwhile
    (skip items until the first that fails it)."""

    def __init__(self, kind: type, fn: Value, source: IteratorValue) -> None:
        super().__init__()
        self.kind = kind
        self.fn = fn
        self.inner = source
        self.switched = False

    def pull(self, tx: Translator) -> Value | None:
        if self.kind is itertools.takewhile:
            item = None if self.switched else self.inner.next(tx)
            if item is None or self.fn.call(tx, [item], {}).truth(tx):
                return item
            self.switched = True
            return None
        while (item := self.inner.next(tx)) is not None:
            if self.switched or not self.fn.call(tx, [item], {}).truth(tx):
                self.switched = True
                return item
        return None


class CycleIterator(LazyIterator):
    kind = itertools.cycle

    def __init__(self, source: IteratorValue) -> None:
        super().__init__()
        self.inner = source
        self.saved: list[Value] = []
        self.index = 0

    def pull(self, tx: Translator) -> Value | None:
        item = self.inner.next(tx)
        if item is not None:
            self.saved.append(item)
            return item
        if not self.saved:
            return None
        item = self.saved[self.index % len(self.saved)]
        self.index += 1
        return item


class GroupByIterator(LazyIterator):
    """itertools.groupby: (key, group) pairs whose groups pull from the shared source, so
    a group left half-read is skipped over when the next key is asked for, as in CPython."""

    kind = itertools.groupby

    def __init__(self, source: IteratorValue, key_fn: Value | None) -> None:
        super().__init__()
        self.inner = source
        self.key_fn = key_fn
        self.current: tuple[Value, Value] | None = None
        """The (key, item) last pulled from the source and not yet handed out."""
        self.target: Value | None = None
        """The key of the group handed out last."""
        self.group: _Group | None = None

    def key_of(self, tx: Translator, item: Value) -> Value:
        return item if self.key_fn is None else self.key_fn.call(tx, [item], {})

    def advance(self, tx: Translator) -> bool:
        item = self.inner.next(tx)
        if item is None:
            self.current = None
            return False
        self.current = (self.key_of(tx, item), item)
        return True

    def pull(self, tx: Translator) -> Value | None:
        from ember.capture.operators import same_value

        self.group = None  # a group handed out before stops yielding
        while True:
            if self.current is not None and (
                self.target is None or not same_value(tx, self.target, self.current[0])
            ):
                break
            if not self.advance(tx):
                return None
        self.target = self.current[0]
        self.group = _Group(self, self.target)
        return TupleValue([self.target, self.group])


class _Group(LazyIterator):
    kind = type(next(iter(itertools.groupby([0])))[1])

    def __init__(self, parent: GroupByIterator, key: Value) -> None:
        super().__init__()
        self.parent = parent
        self.key = key

    def pull(self, tx: Translator) -> Value | None:
        from ember.capture.operators import same_value

        parent = self.parent
        if parent.group is not self:
            return None
        if parent.current is None and not parent.advance(tx):
            return None
        if not same_value(tx, self.key, parent.current[0]):
            return None
        item = parent.current[1]
        parent.current = None
        return item


class GeneratorNotRebuilt(Unsupported):
    """Generated code would have to make a generator of the trace again, mid-way."""

    def __init__(self, value: GeneratorIterator) -> None:
        super().__init__(
            BreakReason.UNSUPPORTED_OBJECT,
            f"{value.describe()} made during capture cannot be rebuilt after the graph",
        )
        self.value = value


class SettleFailed(Unsupported):
    """Settling the `index`-th lazy iterator among the values failed; `lazily` says whether
    break code could have made it again lazily instead (checked before settling it)."""

    def __init__(
        self, cause: Unsupported, index: int, lazily: bool, value: Value, inner: str
    ) -> None:
        super().__init__(
            cause.reason,
            cause.detail,
            location=cause.location,
            source_line=cause.source_line,
            hint=cause.hint,
        )
        self.index = index
        self.lazily = lazily
        self.value = value
        self.inner = inner
        """Why settling it failed, in the pull's own words."""


def settle_iterators(tx: Translator, values: list[Value], lazy: frozenset[int]) -> None:
    """Compute the rest of every lazy iterator among `values` (see LazyIterator.settle),
    but for those whose position among them is in `lazy`: break code makes those again
    lazily (see frame.py)."""
    iterators = [v for v in values if isinstance(v, LazyIterator)]
    for index, value in enumerate(iterators):
        lazily = value.lazily_rebuildable()
        if lazily and index in lazy:
            continue
        try:
            value.settle(tx)
        except Unsupported as exc:
            inner = exc.detail
            if "alive at the graph break" not in exc.detail:  # a pull that itself broke
                exc.detail = (
                    f"a {value.describe()} alive at the graph break cannot be computed "
                    f"ahead, nor made again ({exc.detail})"
                )
            raise SettleFailed(exc, index, lazily, value, inner) from exc


class ObjectIterator(LazyIterator):
    """An object of a class written in Python that is its own iterator (`__iter__` returns
    self): each pull calls its `__next__` (inlined) when the consumer pulls, a StopIteration
    raised there ending it. The real iterator is the object itself, so at a graph break it
    is handed on as that object (its attribute writes replayed), not computed ahead.
    `by_index`: a class with `__getitem__` and no `__iter__` (the old sequence protocol):
    `obj[0]`, `obj[1]`, ... until one raises IndexError."""

    def __init__(self, obj: Value, by_index: bool = False) -> None:
        super().__init__()
        self.obj = obj
        self.index: int | None = 0 if by_index else None

    def describe(self) -> str:
        return f"iterator {self.obj.describe()}"

    def python_type(self) -> type:
        return self.obj.python_type()

    def pull(self, tx: Translator) -> Value | None:
        from ember.capture.values.exceptions import TracedRaise

        if self.index is None:
            method, args, ends = self.obj.type_method(tx, "__next__"), [], StopIteration
        else:
            method, args, ends = self.obj.type_method(tx, "__getitem__"), [], IndexError
            args, self.index = [ConstantValue(self.index)], self.index + 1
        try:
            return method.call(tx, args, {})
        except TracedRaise as raised:
            if issubclass(raised.value.cls, ends):
                return None
            raise

    def settle(self, tx: Translator) -> None:
        """Nothing to compute ahead: break code hands on the object itself (an index
        iterator cannot be: it is computed ahead as other iterators are)."""
        if self.index is not None:
            super().settle(tx)

    def lazily_rebuildable(self) -> bool:
        return False

    def contained(self) -> list[Value]:
        return [self.obj]

    def reconstruct(self, em: Emitter) -> None:
        if self.index is not None:
            return super().reconstruct(em)
        em.reconstruct(self.obj)
