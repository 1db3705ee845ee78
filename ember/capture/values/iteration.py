"""Builtins and itertools functions that make iterators, registered in the builtins table.

Each takes its iterables with `iter()` when called, as CPython does, and returns a lazy
iterator (values/iterators.py) whose items are computed as they are pulled. `product`,
`combinations` and `permutations` read their inputs whole when called (so does CPython) and
build only tuples, which have no side effects, so their results are made up front.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.builtins import handles
from ember.capture.values.containers import IteratorValue, TupleValue, iterator_over
from ember.capture.values.iterators import (
    AccumulateIterator,
    ChainIterator,
    CountIterator,
    CycleIterator,
    EnumerateIterator,
    FilterIterator,
    GroupByIterator,
    IsliceIterator,
    MapIterator,
    PairwiseIterator,
    RepeatIterator,
    StarmapIterator,
    WhileIterator,
    ZipIterator,
    ZipLongestIterator,
)
from ember.errors import BreakReason, Unsupported


def _option(args: list[Value], kwargs: dict[str, Value], index: int, name: str, default: Any):
    """An argument given by position or keyword, as a constant."""
    if len(args) > index:
        return args[index].as_constant()
    if name in kwargs:
        return kwargs[name].as_constant()
    return default


def _optional_fn(value: Value | None) -> Value | None:
    """A callable argument where None means "the identity" (filter, groupby, accumulate)."""
    if value is None or (value.is_constant() and value.as_constant() is None):
        return None
    return value


def _iterators(tx, values: list[Value]) -> list[IteratorValue]:
    return [iterator_over(tx, v) for v in values]


@handles(map)
def _map(tx, args, kwargs):
    if len(args) < 2:
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "map() must have at least two arguments")
    return MapIterator(args[0], _iterators(tx, args[1:]))


@handles(filter)
def _filter(tx, args, kwargs):
    return FilterIterator(_optional_fn(args[0]), iterator_over(tx, args[1]))


@handles(itertools.filterfalse)
def _filterfalse(tx, args, kwargs):
    return FilterIterator(_optional_fn(args[0]), iterator_over(tx, args[1]), keep_if=False)


@handles(zip)
def _zip(tx, args, kwargs):
    strict = kwargs.get("strict", ConstantValue(False)).as_constant()
    return ZipIterator(_iterators(tx, args), strict)


@handles(enumerate)
def _enumerate(tx, args, kwargs):
    return EnumerateIterator(iterator_over(tx, args[0]), _option(args, kwargs, 1, "start", 0))


@handles(itertools.chain)
def _chain(tx, args, kwargs):
    return ChainIterator(IteratorValue(list(args)))


@handles(itertools.chain.from_iterable)
def _chain_from_iterable(tx, args, kwargs):
    return ChainIterator(iterator_over(tx, args[0]))


@handles(itertools.islice)
def _islice(tx, args, kwargs):
    bounds = [a.as_constant() for a in args[1:]]
    window = slice(*bounds)
    start, step = window.start or 0, 1 if window.step is None else window.step
    if start < 0 or step < 1 or (window.stop is not None and window.stop < 0):
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "islice() arguments out of range")
    return IsliceIterator(iterator_over(tx, args[0]), start, window.stop, step)


@handles(itertools.accumulate)
def _accumulate(tx, args, kwargs):
    fn = _optional_fn(args[1] if len(args) > 1 else kwargs.get("func"))
    initial = _optional_fn(kwargs.get("initial"))
    return AccumulateIterator(iterator_over(tx, args[0]), fn, initial)


@handles(itertools.count)
def _count(tx, args, kwargs):
    return CountIterator(_option(args, kwargs, 0, "start", 0), _option(args, kwargs, 1, "step", 1))


@handles(itertools.repeat)
def _repeat(tx, args, kwargs):
    times = _option(args, kwargs, 1, "times", None)
    return RepeatIterator(args[0] if args else kwargs["object"], times)


@handles(itertools.zip_longest)
def _zip_longest(tx, args, kwargs):
    fill = kwargs.get("fillvalue", ConstantValue(None))
    return ZipLongestIterator(_iterators(tx, args), fill)


@handles(itertools.groupby)
def _groupby(tx, args, kwargs):
    key = _optional_fn(args[1] if len(args) > 1 else kwargs.get("key"))
    return GroupByIterator(iterator_over(tx, args[0]), key)


@handles(itertools.pairwise)
def _pairwise(tx, args, kwargs):
    return PairwiseIterator(iterator_over(tx, args[0]))


@handles(itertools.starmap)
def _starmap(tx, args, kwargs):
    return StarmapIterator(args[0], [iterator_over(tx, args[1])])


def _while_for(kind: type):
    def handler(tx, args, kwargs):
        return WhileIterator(kind, args[0], iterator_over(tx, args[1]))

    return handler


for _kind in (itertools.takewhile, itertools.dropwhile):
    handles(_kind)(_while_for(_kind))


@handles(itertools.cycle)
def _cycle(tx, args, kwargs):
    return CycleIterator(iterator_over(tx, args[0]))


def _pool(tx, value: Value) -> list[Value]:
    return iterator_over(tx, value).iterate(tx)


def _tuples(rows: Any) -> IteratorValue:
    return IteratorValue([TupleValue(list(row)) for row in rows])


@handles(itertools.product)
def _product(tx, args, kwargs):
    repeat = kwargs.get("repeat", ConstantValue(1)).as_constant()
    return _tuples(itertools.product(*(_pool(tx, a) for a in args), repeat=repeat))


def _choices_for(make: Any):
    """combinations / permutations: index tuples over the pool, made up front."""

    def handler(tx, args, kwargs):
        return _tuples(make(_pool(tx, args[0]), _option(args, kwargs, 1, "r", None)))

    return handler


for _make in (
    itertools.combinations,
    itertools.combinations_with_replacement,
    itertools.permutations,
):
    handles(_make)(_choices_for(_make))


@handles(contextlib._GeneratorContextManager.__exit__)
def _generator_context_exit(tx, args, kwargs):
    """Leaving a `@contextlib.contextmanager` block normally: the generator runs on from
    its yield and must end (contextlib's own code catches the StopIteration)."""
    manager, exc_type = args[0], args[1] if len(args) > 1 else ConstantValue(None)
    if not (exc_type.is_constant() and exc_type.as_constant() is None):
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "an exception leaving a contextmanager")
    if iterator_over(tx, manager.getattr(tx, "gen")).next(tx) is not None:
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "RuntimeError: generator didn't stop")
    return ConstantValue(False)
