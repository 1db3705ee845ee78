"""The differential harness of the break tests: run a program eagerly and compiled on fresh
copies of the same inputs, twice, and compare the result, the arguments afterwards, any
outside state the case names (globals, closures, module attributes), what was printed and the
grad mode; count graphs and breaks, and check that the second run captures nothing."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
from collections.abc import Callable
from typing import Any

import torch

import ember
from ember.capture import cache, frame
from ember.capture.cache import CacheEntry
from ember.testing import CompileCounter, CountingBackend, assert_same


@dataclasses.dataclass
class Case:
    """One differential program.

    `make` returns the positional arguments (fresh objects each call); `state` reads the
    outside state to compare after each run, `reset` puts it back before each run."""

    fn: Callable[..., Any]
    make: Callable[[], tuple]
    graphs: int
    breaks: int
    state: Callable[[], Any] | None = None
    reset: Callable[[], None] | None = None
    compare_args: bool = True
    eager: int = 0
    """How many code objects end up running eagerly (a break ember cannot resume)."""

    @property
    def id(self) -> str:
        return self.fn.__name__


@dataclasses.dataclass
class Record:
    """What the compiled runs did."""

    counter: CompileCounter
    entries: list[CacheEntry]
    entries_after_first: int
    frames_after_first: int

    @property
    def breaks(self) -> int:
        return sum(e.graph_break is not None for e in self.entries)

    @property
    def eager(self) -> int:
        return sum(c.eager_reason is not None for c in cache._caches.values())


def _run(fn: Callable[..., Any], case: Case) -> tuple[Any, tuple, Any, str, bool]:
    if case.reset is not None:
        case.reset()
    args = case.make()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = fn(*args)
    state = copy.deepcopy(case.state()) if case.state is not None else None
    return result, args, state, out.getvalue(), torch.is_grad_enabled()


def check_case(
    case: Case,
    runs: int = 2,
    compiled: Callable[..., Any] | None = None,
    backend: str | None = None,
) -> Record:
    """Differential check of one case; returns the record for further assertions."""
    counter = CompileCounter() if backend is None else CountingBackend(backend)
    if compiled is None:
        compiled = ember.compile(case.fn, backend=counter)
    entries: list[CacheEntry] = []
    frame._listeners.append(entries.append)
    after_first = (0, 0)
    try:
        for run in range(runs):
            expected = _run(case.fn, case)
            actual = _run(compiled, case)
            assert_same(actual[0], expected[0], path=f"run {run}: result")
            if case.compare_args:
                assert_same(actual[1], expected[1], path=f"run {run}: arguments after the call")
            assert_same(actual[2], expected[2], path=f"run {run}: outside state")
            assert actual[3] == expected[3], f"run {run}: printed {actual[3]!r} != {expected[3]!r}"
            assert actual[4] == expected[4], f"run {run}: grad mode after the call differs"
            if run == 0:
                after_first = (len(entries), counter.frame_count)
    finally:
        frame._listeners.remove(entries.append)
    record = Record(counter, entries, *after_first)
    assert len(entries) == record.entries_after_first, "a later run captured again"
    assert counter.frame_count == record.frames_after_first, "a later run compiled a graph"
    return record


def check_counts(case: Case, record: Record) -> None:
    assert record.counter.frame_count == case.graphs, (
        f"{case.id}: expected {case.graphs} graph(s), the backend saw {record.counter.frame_count}"
    )
    assert record.breaks == case.breaks, (
        f"{case.id}: expected {case.breaks} break(s), saw {record.breaks}"
    )
    assert record.eager == case.eager, (
        f"{case.id}: expected {case.eager} eager frame(s), saw {record.eager}"
    )


def ids(cases: list[Case]) -> list[str]:
    return [c.id for c in cases]
