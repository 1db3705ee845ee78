"""A graph break inside a function called from a `try` or `with` block of an inlined caller
(issue 12): the break is taken in the frame that breaks, and what that frame (or any frame
below the caller) raises reaches the caller's handler through break code, which calls the
caller's resume function at the handler. Before, such a caller could not take part, the
break was taken at the outermost call, and every frame on the way was captured again and
recorded the same break (an optimizer step's `graph_break()` inside `_use_grad`'s
try/finally counted three times). Each program is compared with eager (values, printed
order, exceptions) and with Dynamo's counts."""

from __future__ import annotations

import contextlib

import pytest
import torch
from fidelity_harness import check, tensors


def _breaks_then_raises(x, fail):
    y = x.sin()
    print("inside")
    if fail:
        raise ValueError("from below")
    return y * 2


def try_except_around_a_breaking_call(x):
    try:
        y = _breaks_then_raises(x, fail=True)
    except ValueError as e:
        print("caught", e)
        y = x.cos()
    return y + 1


def try_finally_around_a_breaking_call(x):
    try:
        y = _breaks_then_raises(x, fail=False)
    finally:
        print("finally")
    return y - 1


def _middle(x):
    try:
        return _breaks_then_raises(x, fail=True) + 1
    except ValueError:
        print("middle caught")
        raise KeyError("again") from None


def two_callers_with_handlers(x):
    try:
        return _middle(x)
    except KeyError as e:
        print("outer caught", e)
        return x.exp()


def no_handler_catches(x):
    try:
        y = _breaks_then_raises(x, fail=True)
    except KeyError:
        y = x
    return y


@contextlib.contextmanager
def _announce(name):
    print("enter", name)
    try:
        yield name
    finally:
        print("exit", name)


EXITS: list = []


class _Block:
    """Records its exits in a list (a print in `__exit__` while an exception unwinds breaks
    at WITH_EXCEPT_START, which runs that resume function eagerly, under Dynamo too)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        EXITS.append(exc[0].__name__ if exc[0] else None)
        return False


def _with_blocks_around_a_break(x):
    with _announce("a"), _Block():
        return _breaks_then_raises(x, fail=False) + 3


def with_blocks_around_a_breaking_call(x):
    return _with_blocks_around_a_break(x) * 2


def _with_block_sees_the_exception(x):
    # (a @contextmanager's exit with an exception calls the generator's throw(), which
    # ember does not model: that resume function would run eagerly, as it does for a
    # block in the compiled function itself)
    with _Block():
        return _breaks_then_raises(x, fail=True) + 3


def with_block_sees_the_exception(x):
    try:
        return _with_block_sees_the_exception(x)
    except ValueError:
        return x * 0


def _no_grad_helper(x):
    with torch.no_grad():
        y = _breaks_then_raises(x, fail=False)
    return y * 2, torch.is_grad_enabled()


def no_grad_block_around_a_breaking_call(x):
    return _no_grad_helper(x)


def loop_in_a_try_around_breaking_calls(x):
    total = x
    try:
        for i in range(3):
            total = total + _breaks_then_raises(x, fail=i == 2)
    except ValueError:
        print("stopped")
    return total


PROGRAMS = [
    try_except_around_a_breaking_call,
    try_finally_around_a_breaking_call,
    two_callers_with_handlers,
    no_handler_catches,
    with_blocks_around_a_breaking_call,
    with_block_sees_the_exception,
    no_grad_block_around_a_breaking_call,
    loop_in_a_try_around_breaking_calls,
]


def _raises_value_error(fn):
    return fn is no_handler_catches


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_break_below_a_block_of_a_caller(fn):
    if _raises_value_error(fn):
        import ember

        compiled = ember.compile(fn)
        for call in (fn, compiled):
            with pytest.raises(ValueError, match="from below"):
                call(torch.randn(3))
        return
    check(fn, tensors((3,)), state=lambda: list(EXITS), reset=EXITS.clear)


@pytest.mark.parametrize("fn", [try_finally_around_a_breaking_call, two_callers_with_handlers])
def test_the_callee_in_a_try_block_is_not_captured_again(fn):
    """The break inside `_breaks_then_raises` (its print) is recorded once, in the frame that
    breaks, not again at each caller's call."""
    import ember

    ember.reset()
    ember.compile(fn)(torch.randn(3))
    reasons = ember.stats()["break_reasons"]
    assert len(reasons) == len(set(reasons)), reasons
