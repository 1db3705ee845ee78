"""`except*` (exception groups). Splitting a group by a clause's type (CHECK_EG_MATCH) and
building what to re-raise (PREP_RERAISE_STAR; CALL_INTRINSIC_2 on 3.12+) run in CPython at
graph breaks, with their reason; everything around them is captured: the try body, the
clause's body, the code after the statement. Before, reaching one ran the whole function
eagerly; Dynamo skips such frames too (its counts: 0 graphs, 1 skipped frame). A try/except*
whose body raises nothing is captured whole. Each program is compared with eager (values,
printed output, outside state, `sys.exc_info()` inside the clause) and with Dynamo."""

from __future__ import annotations

import sys

import pytest
import torch
from fidelity_harness import check, tensors

import ember

OUT: list = []


def _state():
    return list(OUT)


def _reset():
    OUT.clear()


def plain_exception_in_a_group_clause(x):
    y = x * 2
    try:
        if x.shape[0] == 3:
            raise ValueError("three")
        y = y + 1
    except* ValueError as eg:
        OUT.append((type(eg).__name__, len(eg.exceptions), eg.exceptions[0].args))
        OUT.append(sys.exc_info()[1] is eg)
        y = y - 1
    return y.sin()


def group_with_two_clauses(x):
    y = x * 2
    try:
        raise ExceptionGroup("g", [ValueError("v"), KeyError("k")])
    except* ValueError as eg:
        OUT.append(("values", eg.message, len(eg.exceptions)))
        y = y + 1
    except* KeyError as eg:
        OUT.append(("keys", eg.message, len(eg.exceptions)))
        y = y * 3
    return y.cos()


def nothing_raised(x):
    y = x * 2
    try:
        y = y + 1
    except* ValueError:
        y = y - 1
    return y.cos()


def raised_in_a_callee(x):
    y = x.exp()
    try:
        _check_rows(y)
    except* IndexError as eg:
        OUT.append(str(eg.exceptions[0]))
        y = y * 0
    return y + 1


def _check_rows(y):
    if y.shape[0] < 5:
        raise IndexError(f"only {y.shape[0]} rows")


@pytest.mark.parametrize(
    "fn",
    [plain_exception_in_a_group_clause, group_with_two_clauses, raised_in_a_callee],
)
def test_except_star_runs_its_matching_in_python_and_captures_the_rest(fn):
    counts = check(fn, tensors((3,)), state=_state, reset=_reset)
    assert counts.eager_frames == 0 and counts.graphs >= 2


def test_except_star_without_a_raise_is_one_graph():
    counts = check(nothing_raised, tensors((3,)))
    assert (counts.graphs, counts.breaks) == (1, 0)


def unmatched_part_leaves(x):
    OUT.append("start")
    y = x * 2
    try:
        raise ExceptionGroup("g", [ValueError("v"), KeyError("k")])
    except* ValueError:
        OUT.append("handled the ValueError")
        y.add_(1)
    return y


def raise_in_the_clause(x):
    try:
        raise ValueError("inner")
    except* ValueError:
        x.mul_(3)
        raise RuntimeError("from the clause")  # noqa: B904  (the implicit context is under test)
    return x


@pytest.mark.parametrize("fn", [unmatched_part_leaves, raise_in_the_clause])
def test_what_except_star_re_raises_leaves_the_function(fn):
    """The rest of the group (or what the clause raised) leaves the compiled function as it
    leaves the eager one: type, message, the sub-exceptions, the state after it."""
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        seen = []
        for run in (fn, compiled):
            _reset()
            x = torch.ones(3)
            with pytest.raises(BaseException) as info:
                run(x)
            exc = info.value
            subs = [repr(e) for e in getattr(exc, "exceptions", ())]
            seen.append((type(exc), str(exc), subs, list(OUT), x.tolist()))
        assert seen[1] == seen[0]
    assert ember.stats()["eager_frames"] == 0
