"""Issue 12: exceptions and blocks. try/except/finally and `with` blocks are traced through
their exception tables (raising and catching user exceptions, KeyError / AttributeError /
StopIteration used for control flow, exceptions crossing inlined calls), an exception that
leaves the compiled function is raised by its replacement code after the graph and the side
effects, and a graph break inside a try or `with` block resumes inside the block with its
handler still active. Each program is compared with eager and with Dynamo's capture (see
fidelity_harness); programs that raise are compared on the exception and the state after it."""

from __future__ import annotations

import contextlib
import inspect
import io
import sys

import pytest
import torch
import torch.utils.checkpoint
from fidelity_harness import check, tensors

import ember
from ember import BreakReason, Unsupported

OUT: list = []


def _state():
    return list(OUT)


def _reset():
    OUT.clear()


class ShapeError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Recorder:
    def __enter__(self):
        OUT.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        OUT.append(("exit", kind and kind.__name__))
        return False


class Suppress:
    """Swallows ValueError, as contextlib.suppress(ValueError) does."""

    def __enter__(self):
        OUT.append("enter")
        return self

    def __exit__(self, kind, value, tb):
        OUT.append(("exit", kind and kind.__name__))
        return kind is not None and issubclass(kind, ValueError)


class Lazy:
    def __getattr__(self, name):
        if name == "scale":
            return 3
        raise AttributeError(f"no {name}")


def fail(message):
    raise ValueError(message)


def shout(message):
    """A call ember breaks at (output), raising in CPython."""
    print(message)
    raise ValueError(message)


# ---------------------------------------------------------------- traced: raise and catch
def p_catch_user_exception(x):
    y = x + 1
    try:
        OUT.append("try")
        raise ShapeError(7, "bad shape")
    except ShapeError as e:
        OUT.append((e.code, str(e), e.args))
        y = y * e.code
    return y


def p_key_error_as_control_flow(x):
    table = {"a": 2}
    try:
        scale = table["b"]
    except KeyError as e:
        OUT.append(repr(e))
        scale = 5
    return x * scale


def p_attribute_error_as_control_flow(x):
    try:
        scale = x.not_an_attribute
    except AttributeError:
        scale = 2
    return x * scale + Lazy().scale + getattr(Lazy(), "other", 4) + hasattr(Lazy(), "more")


def p_errors_of_python_operations(x):
    n = x.shape[0] - 4
    try:
        r = 1 / n
    except ZeroDivisionError as e:
        r = len(str(e))
    try:
        r += "a" + n
    except TypeError as e:
        r += e.args[0].count("str")
    return x * r


# plain `assert` statements (pytest rewrites the ones in this file into its own hooks)
_plain: dict = {}
exec(
    compile(
        """
def p_failed_assert_caught(x):
    try:
        assert x.shape[0] == 3, f"want 3 rows, got {x.shape[0]}"
    except AssertionError as e:
        return x * len(str(e))
    return x


def r_failed_assert(x):
    y = x.neg_()
    assert y.shape[0] == 3, "three rows"
    return y
""",
        "<plain asserts>",
        "exec",
    ),
    {},
    _plain,
)
p_failed_assert_caught = _plain["p_failed_assert_caught"]
r_failed_assert = _plain["r_failed_assert"]


def p_stop_iteration(x):
    items = iter([1, 2])
    total = 0
    while True:
        try:
            total += next(items)
        except StopIteration:
            break
    return x + total


def p_finally_on_both_paths(x):
    try:
        y = x + 1
    finally:
        OUT.append("first")
    try:
        try:
            y = y * 2
            fail("inner")
        finally:
            OUT.append("second")
    except ValueError as e:
        y = y - len(e.args[0])
    return y


def p_exception_crosses_inlined_calls(x):
    def inner(v):
        if v.shape[0] == 4:
            raise IndexError("four")
        return v

    def middle(v):
        try:
            return inner(v * 2)
        finally:
            OUT.append("middle finally")

    try:
        return middle(x)
    except LookupError as e:
        return x - len(str(e))


def p_raise_from_and_reraise(x):
    try:
        try:
            {}["k"]
        except KeyError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        OUT.append((type(e.__cause__).__name__, e.__suppress_context__))
        try:
            raise
        except RuntimeError:
            OUT.append("re-raised")
    return x + 1


def p_with_blocks_on_the_exception_path(x):
    with Suppress():
        y = x + 1
        fail("suppressed")
    try:
        with torch.no_grad(), Recorder():
            z = y * 2
            fail("through")
    except ValueError:
        OUT.append(torch.is_grad_enabled())
    return y, z


@pytest.mark.parametrize(
    "fn",
    [
        p_catch_user_exception,
        p_key_error_as_control_flow,
        p_attribute_error_as_control_flow,
        p_errors_of_python_operations,
        p_failed_assert_caught,
        p_stop_iteration,
        p_finally_on_both_paths,
        p_exception_crosses_inlined_calls,
        p_raise_from_and_reraise,
        p_with_blocks_on_the_exception_path,
    ],
)
def test_traced_exceptions(fn):
    counts = check(fn, tensors((4,)), state=_state, reset=_reset)
    assert counts.graphs == 1 and counts.breaks == 0


# ---------------------------------------------------------------- leaving the function
def r_user_raise(x):
    x.add_(1)
    OUT.append("before")
    y = x * 2
    raise ShapeError(3, f"rows {y.shape[0]}")


def r_uncaught_in_handler(x):
    try:
        return x + {"a": 1}["b"]
    except KeyError:
        OUT.append("handled")
        raise


def r_wrong_handler(x):
    try:
        return x.no_such_attribute  # AttributeError, with Python's own message
    except KeyError:
        return x


def r_tensor_in_the_exception(x):
    raise RuntimeError(x.sum() * 2, "total")


def r_break_then_bare_raise(x):
    """The break inside the `except` block runs with the block's exception handled by
    CPython, and the bare `raise` after it re-raises that very exception."""
    try:
        x.mul_(2)
        raise ShapeError(5, "five")
    except ShapeError:
        OUT.append(sys.exc_info()[0].__name__)
        print("handling", sys.exc_info()[1])
        raise


def _raises(fn):
    """Eager and compiled raise the same exception (type, message, cause), with the same
    state after it, twice; the compiled function runs in one graph or with stated breaks."""
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        results = []
        for run in (fn, compiled):
            _reset()
            x = torch.ones(4)
            with pytest.raises(Exception) as info:
                run(x)
            exc = info.value
            results.append((type(exc), str(exc), repr(exc.__cause__), list(OUT), x.tolist()))
        assert results[1] == results[0]


@pytest.mark.parametrize(
    "fn,breaks",
    [
        (r_user_raise, 0),
        (r_uncaught_in_handler, 0),
        (r_wrong_handler, 1),
        (r_break_then_bare_raise, 3),
        (r_tensor_in_the_exception, 0),
        (r_failed_assert, 0),
    ],
)
def test_exception_leaving_the_function(fn, breaks):
    """r_wrong_handler: ember's wording of an AttributeError is not Python's, so CPython
    raises it at a break; r_break_then_bare_raise breaks at sys.exc_info (twice) and print."""
    ember.reset()
    with contextlib.redirect_stdout(io.StringIO()):
        _raises(fn)
    stats = ember.stats()
    assert stats["eager_frames"] == 0, stats["break_reasons"]
    assert stats["graph_breaks"] == breaks, stats["break_reasons"]


def test_fullgraph_refuses_an_exception_leaving_the_function():
    with pytest.raises(Unsupported) as info:
        ember.compile(r_user_raise, backend="eager", fullgraph=True)(torch.ones(4))
    assert info.value.reason is BreakReason.EXCEPTION_RAISED
    assert "ShapeError: rows 4" in info.value.detail
    assert "test_exceptions.py" in info.value.location and "raise" in info.value.source_line


# ---------------------------------------------------------------- breaks inside blocks
def b_break_in_try(x):
    try:
        y = x * 2
        print("inside try")
        y = y + 1
    except RuntimeError:
        y = x
    return y.sin()


def b_break_raises_into_handler(x):
    y = x + 1
    try:
        y = y * 2
        shout("raised at the break")
        y = y * 100
    except ValueError as e:
        OUT.append(str(e))
        y = y - 1
    return y.cos()


def b_break_in_except_and_finally(x):
    try:
        raise KeyError("k")
    except KeyError as e:
        y = x + 1
        print("handling", e)
        y = y * 2
    finally:
        print("finally")
        y = y - 3
    return y


def b_tensor_exception_across_a_break(x):
    y = x * 2
    try:
        raise ValueError(y)
    except ValueError as e:
        print("caught")
        return e.args[0] + 1


def b_break_in_user_with(x):
    with Recorder():
        y = x + 1
        print("in recorder")
        y = y * 2
    with Suppress():
        z = y - 1
        shout("suppressed at the break")
    return y, z


def b_break_in_try_in_a_loop(x):
    for i in range(3):
        try:
            x = x + i
            print(i)
            if i == 1:
                raise RuntimeError("one")
        except RuntimeError:
            x = x * 2
    return x


def b_break_in_try_in_no_grad(x):
    with torch.no_grad():
        try:
            y = x * 2
            shout("no grad")
        except ValueError:
            y = y + torch.is_grad_enabled()
    return y * 3


@pytest.mark.parametrize(
    "fn",
    [
        b_break_in_try,
        b_break_raises_into_handler,
        b_break_in_except_and_finally,
        b_tensor_exception_across_a_break,
        b_break_in_user_with,
        b_break_in_try_in_a_loop,
        b_break_in_try_in_no_grad,
    ],
)
def test_break_inside_a_block_resumes_in_it(fn):
    """The graph before the break is compiled, the instruction runs in CPython with the
    block's handler active, and the rest resumes inside the block (Dynamo runs these frames
    eagerly: it cannot resume inside a try block)."""
    counts = check(fn, lambda: (torch.ones(4, requires_grad=True),), state=_state, reset=_reset)
    assert counts.graphs >= 1 and counts.eager_frames == 0


@contextlib.contextmanager
def generator_scope():
    OUT.append("enter")
    try:
        yield
    finally:
        OUT.append("exit")


def b_break_in_generator_context(x):
    y = x + 1
    with generator_scope():
        y = y * 2
        print("in scope")
    return y


def test_break_in_a_generator_context_manager_ends_the_graph_before_it():
    """The generator behind @contextmanager cannot be rebuilt at the break: the graph ends
    where the manager is made, with a reason naming the construct and the lines; contextlib's
    `helper` (which makes the generator) breaks where it makes it, so no frame runs eagerly
    (before, `helper` did). Dynamo runs the whole frame eagerly."""
    check(b_break_in_generator_context, tensors((4,)), state=_state, reset=_reset)
    first = ember.stats()["break_reasons"][0]
    assert "inside a `with` block on _GeneratorContextManager object" in first
    with_line = _line_of(b_break_in_generator_context, "with generator_scope")
    print_line = _line_of(b_break_in_generator_context, "print")
    assert f"test_exceptions.py:{print_line}" in first
    assert first.endswith(f"test_exceptions.py:{with_line}")


@contextlib.contextmanager
def numbered_scope(n):
    OUT.append(("enter", n))
    try:
        yield
    finally:
        OUT.append(("exit", n))


def _prints_then_adds(y):
    print("inner")
    return y + 1


def b_break_in_a_callee_in_nested_generator_contexts(x):
    y = x + 1
    with numbered_scope(1):
        y = y * 2
        with numbered_scope(2):
            y = _prints_then_adds(y)
            y = y - 1
    return y


def test_nested_generator_contexts_restart_until_the_outer_manager():
    """A break inside a callee restarts the capture at the call; the inner manager, then
    the outer one, cannot be rebuilt there, so it restarts earlier each time."""
    check(
        b_break_in_a_callee_in_nested_generator_contexts,
        tensors((4,)),
        state=_state,
        reset=_reset,
    )


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _body_raising(x):
    if x.shape[0] == 4:
        raise ValueError("four")
    return x.sin()


def b_raise_inside_checkpoint(x):
    try:
        return torch.utils.checkpoint.checkpoint(_body_raising, x, use_reentrant=False)
    except ValueError:
        return x.cos()


def test_exception_inside_a_higher_order_op_breaks_before_it():
    """As under Dynamo, a body that raises is not one graph node: the break at the
    checkpoint call lets CPython raise, and the handler resumes."""
    counts = check(b_raise_inside_checkpoint, tensors((4,)), dynamo=False)
    assert counts.eager_frames == 0 and counts.breaks == 1
    assert "ValueError exception raised" in ember.stats()["break_reasons"][0]


def test_breaks_report_the_user_line():
    ember.reset()
    with contextlib.redirect_stdout(io.StringIO()):
        ember.compile(b_break_in_try, backend="eager")(torch.ones(4))
    (reason,) = ember.stats()["break_reasons"]
    assert reason.startswith(BreakReason.UNSUPPORTED_CALL.value)
    assert f"test_exceptions.py:{_line_of(b_break_in_try, 'print')}" in reason


def p_errors_of_constants_caught(x, d):
    try:
        v = d["b"]
    except TypeError:
        v = "caught"
    try:
        n = len(d)
    except (KeyError, TypeError):
        n = -1
    try:
        c = "ab"[5]
    except IndexError as e:
        c = str(e)
    return x + n, v, c


def test_errors_of_indexing_and_len_on_constants_reach_the_handlers():
    """`None["b"]` and `len(None)` raised their TypeError out of the capture, past the
    program's own `except TypeError`."""
    counts = check(p_errors_of_constants_caught, lambda: (torch.ones(2), None))
    assert counts.breaks == 0
