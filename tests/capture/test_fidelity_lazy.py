"""Issue 12: map, filter, zip, enumerate, generators and itertools are lazy. A callback with
side effects runs when the consumer pulls, interleaved with the consumer's own work, and not
at all for items never pulled (`break`, `any`, `next`, a shorter zip partner). Each program
records its order of events in LOG, which must match eager's, and is compared with Dynamo's
capture (see fidelity_harness)."""

from __future__ import annotations

import itertools

import pytest
import torch
from fidelity_harness import check, tensors

LOG: list = []


def note(tag, value=None):
    LOG.append(tag)
    return value


def _state():
    return list(LOG)


def _reset():
    LOG.clear()


def p_map_interleaves_with_loop(x):
    out = x
    for v in map(lambda i: note(("map", i), x * i), range(3)):
        note("body")
        out = out + v
    return out


def p_filter_stops_at_break(x):
    out = x
    for v in filter(lambda i: note(("keep?", i), i % 2 == 0), range(10)):
        if v > 2:
            break
        out = out + v
    return out


def p_zip_pulls_first_then_second(x):
    first = map(lambda i: note(("a", i), i), range(5))
    second = map(lambda i: note(("b", i), i), range(2))
    pairs = list(zip(first, second))
    rest = list(first)  # the item zip pulled from `first` before `second` ran out is gone
    return x * len(pairs), pairs, rest


def p_genexpr_short_circuits_any(x):
    found = any(note(("check", i), i == 2) for i in range(5))
    return x + 1 if found else x


def p_generator_function_interleaves(x):
    def gen(n):
        for i in range(n):
            note(("yield", i))
            yield x * i
        note("done")

    out = x
    for v in gen(3):
        note("use")
        out = out + v
    return out


def p_next_pulls_one(x):
    it = (note(("make", i), x + i) for i in range(4))
    first = next(it)
    second = next(it)
    return first + second


def p_enumerate_and_sum_of_generator(x):
    total = sum(v * i for i, v in enumerate(note(("item", j), x + j) for j in range(3)))
    return total


def p_yield_from_delegates(x):
    def inner():
        yield note("inner 1", x)
        yield note("inner 2", x * 2)
        return 10

    def outer():
        result = yield from inner()
        note(("returned", result))
        yield x * result

    return [v + 1 for v in outer()]


def p_generator_unpacked_and_in(x):
    a, b = (note(("u", i), x * i) for i in range(2))
    present = 3 in (note(("in", i), i) for i in range(10))
    return a + b, present


def p_itertools_chain_islice_count(x):
    evens = map(lambda i: note(("sq", i), i * i), itertools.count(0, 2))
    head = list(itertools.islice(evens, 1, 6, 2))
    joined = list(itertools.chain([0], (note(("g", i), i) for i in range(2)), head))
    return x * sum(joined), head, joined


def p_itertools_take_drop_accumulate(x):
    taken = list(itertools.takewhile(lambda v: note(("t", v), v < 3), range(10)))
    dropped = list(itertools.dropwhile(lambda v: note(("d", v), v < 7), range(10)))
    running = list(itertools.accumulate([1, 2, 3, 4], lambda a, b: note(("acc", b), a * b)))
    plus = list(itertools.accumulate([x, x, x], initial=x))
    return taken, dropped, running, plus


def p_itertools_groupby(x):
    words = ["apple", "avocado", "banana", "blueberry", "cherry", "apricot"]
    groups = []
    for key, members in itertools.groupby(words, key=lambda w: note(("key", w), w[0])):
        groups.append((key, list(members)))
    skipped = [k for k, _ in itertools.groupby("aabbbc")]
    return x, groups, skipped


def p_itertools_pairwise_starmap_zip_longest(x):
    pairs = list(itertools.pairwise([x, x + 1, x + 2]))
    diffs = list(itertools.starmap(lambda a, b: b - a, pairs))
    longest = list(itertools.zip_longest([1, 2, 3], "ab", fillvalue="-"))
    cycled = list(itertools.islice(itertools.cycle("ab"), 5))
    repeated = list(itertools.repeat(x, 2))
    return diffs, longest, cycled, repeated


def p_itertools_combinatorics(x):
    rows = [x, x * 2, x * 3]
    prods = [a * b for a, b in itertools.product(rows[:2], repeat=2)]
    combos = [a + b for a, b in itertools.combinations(rows, 2)]
    perms = list(itertools.permutations("abc", 2))
    with_repl = list(itertools.combinations_with_replacement([1, 2], 2))
    return prods, combos, perms, with_repl, list(itertools.filterfalse(None, [0, 1, 0, 2]))


def p_zip_strict_and_map_of_two(x):
    sums = list(map(lambda a, b: a + b, [x, x], [1, 2, 3]))
    checked = list(zip([1, 2], "ab", strict=True))
    return sums, checked


def p_iterator_types(x):
    return (
        type(map(abs, [1])).__name__,
        type(filter(None, [1])).__name__,
        type(zip()).__name__,
        type(enumerate([])).__name__,
        type(v for v in ()).__name__,
        type(itertools.chain()).__name__,
        bool(iter([])),
    )


CASES = [
    p_map_interleaves_with_loop,
    p_filter_stops_at_break,
    p_zip_pulls_first_then_second,
    p_genexpr_short_circuits_any,
    p_generator_function_interleaves,
    p_next_pulls_one,
    p_enumerate_and_sum_of_generator,
    p_yield_from_delegates,
    p_generator_unpacked_and_in,
    p_itertools_chain_islice_count,
    p_itertools_take_drop_accumulate,
    p_itertools_groupby,
    p_itertools_pairwise_starmap_zip_longest,
    p_itertools_combinatorics,
    p_zip_strict_and_map_of_two,
    p_iterator_types,
]


DYNAMO_FAILS = {p_yield_from_delegates}
"""torch.compile gets these wrong (`yield from` evaluates to None under Dynamo 2.13)."""


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.removeprefix("p_"))
def test_lazy_iteration(fn):
    counts = check(fn, tensors((2,)), state=_state, reset=_reset, dynamo=fn not in DYNAMO_FAILS)
    assert counts.breaks == 0


# graph breaks in loops over lazy iterators


def p_side_effecting_filter_with_break_in_loop(x):
    """The issue's case: a filter whose predicate counts, and a print in the loop body.
    Computing the filter ahead of the break would count every item first (eager prints
    1, 2, 3 where an eager-first run would print 3, 3, 3)."""
    calls = []

    def keep(t):
        calls.append(1)
        return True

    total = x
    for v in filter(keep, [x, x + 1, x + 2]):
        total = total + v
        print(len(calls))
    return total, len(calls)


def p_pure_map_with_break_in_loop(x):
    total = x
    for v in map(lambda i: x * i, range(3)):
        print("step")
        total = total + v
    return total


def p_pure_generator_with_break_in_loop(x):
    total = x
    for v in (torch.sin(x) * i for i in range(3)):
        print("step")
        total = total + v
    return total


def test_side_effecting_iterator_across_a_break_is_made_again_lazily():
    """The filter cannot be computed ahead (its predicate appends): break code makes it
    again, `filter(keep, <the items left>)`, and each resume function pulls it in order
    (before, the frame ran eagerly; Dynamo skips it: 0 graphs, 2 breaks)."""
    counts = check(p_side_effecting_filter_with_break_in_loop, tensors((2,)))
    assert counts.graphs >= 1


@pytest.mark.parametrize(
    "fn",
    [p_pure_map_with_break_in_loop, p_pure_generator_with_break_in_loop],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_pure_iterator_across_a_break_is_captured(fn):
    counts = check(fn, tensors((2,)))
    assert counts.graphs >= 1 and counts.breaks == 3


def p_random_map_with_break_in_loop(x):
    """Draws in a map's callback and in the loop body interleave eagerly; computing the map
    ahead of the break would draw all of its numbers first, and both results would differ."""
    out = []
    for v in map(lambda i: x + torch.rand(2), range(3)):
        print("step")
        out.append(v + torch.rand(2))
    return out


def test_random_iterator_across_a_break_is_made_again_lazily():
    """Computing the map's remaining items ahead of the break would draw its numbers first
    (other numbers than eager; an earlier ember did, then ran the frame eagerly). Break
    code makes the map again lazily over the items left, with its lambda made again over
    the cell of `x`: the draws interleave as in eager (Dynamo: 1 graph of 2 ops, 2 breaks
    and the frame skipped)."""
    counts = check(
        p_random_map_with_break_in_loop, tensors((2,)), reset=lambda: torch.manual_seed(0)
    )
    assert counts.graphs >= 1
