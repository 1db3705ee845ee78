"""Raising and handling exceptions: RAISE_VARARGS, and the instructions of `except`,
`finally` and a `with` block's exit path (PUSH_EXC_INFO, CHECK_EXC_MATCH, POP_EXCEPT,
RERAISE, WITH_EXCEPT_START). The jump to a handler is the translator's (`Translator.unwind`),
which finds it in the exception table as CPython does.

The exception being handled (`sys.exc_info()`) is the capture's, as it is the thread's in
CPython: PUSH_EXC_INFO saves the previous one on the stack and POP_EXCEPT restores it. Outside
every handler of the trace it is whatever the caller is handling.
"""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.classes import ClassValue
from ember.capture.values.exceptions import (
    ExceptionValue,
    SavedException,
    TracedRaise,
    construct_exception,
    raised_type,
)
from ember.errors import BreakReason, Unsupported


def _instance(tx, value: Value) -> ExceptionValue:
    """What `raise value` raises: the instance, or a new one of the class."""
    if isinstance(value, ExceptionValue):
        return value
    if isinstance(value, ClassValue) and issubclass(value.cls, BaseException):
        return construct_exception(tx, value.cls, [], {})
    if isinstance(value, ConstantValue) and value.value is None:
        return None
    raise Unsupported(
        BreakReason.EXCEPTION_RAISED, f"raising {value.describe()}, which ember does not model"
    )


@handler(Op.RAISE_VARARGS)
def raise_varargs(tx, inst):
    if inst.arg == 0:  # a bare `raise`
        if tx.ctx.handling is None:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED,
                "a bare `raise` of the exception the caller is handling",
            )
        raise TracedRaise(tx.ctx.handling)
    cause = _instance(tx, tx.pop()) if inst.arg == 2 else False
    exc = _instance(tx, tx.pop())
    if exc is None:
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "TypeError: `raise None`")
    context = tx.ctx.handling if tx.ctx.handling is not exc else None
    if cause is not False or context is not None:
        if not exc.is_new:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED,
                "raising an exception object from outside the trace with a cause or context "
                "(its attributes would change)",
            )
        if cause is not False:
            exc.cause = cause if cause is not None else ConstantValue(None)
            exc.suppress_context = True
        if context is not None:
            exc.context = context
    raise TracedRaise(exc)


@handler(Op.PUSH_EXC_INFO)
def push_exc_info(tx, inst):
    exc = tx.pop()
    tx.push(SavedException(tx.ctx.handling, exc))
    tx.ctx.handling = exc
    tx.push(exc)


@handler(Op.POP_EXCEPT)
def pop_except(tx, inst):
    tx.ctx.handling = tx.pop().previous


@handler(Op.CHECK_EXC_MATCH)
def check_exc_match(tx, inst):
    expected = tx.pop().as_constant()
    kind = raised_type(tx.peek())
    if kind is None:
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "matching a value that is no exception")
    tx.push(ConstantValue(issubclass(kind, expected)))


@handler(Op.RERAISE)
def reraise(tx, inst):
    exc = tx.pop()
    if not isinstance(exc, ExceptionValue):
        raise Unsupported(BreakReason.EXCEPTION_RAISED, f"re-raising {exc.describe()}")
    raise TracedRaise(exc)


@handler(Op.WITH_EXCEPT_START)
def with_except_start(tx, inst):
    """A `with` block left by an exception: `__exit__(type, exc, traceback)`. Its result
    decides whether the exception is suppressed. (The traceback does not exist while
    tracing: `__exit__` receives None for it.)"""
    exit_method, exc = tx.peek(4), tx.peek(1)
    kind = tx.ctx.builder.wrap_const(raised_type(exc))
    tx.push(exit_method.call(tx, [kind, exc, ConstantValue(None)], {}))


_EXCEPTION_GROUPS = (
    "`except*`: exception groups are split and re-raised in Python (this instruction runs "
    "at a graph break; the handler's body is captured after it)"
)


@handler(Op.CHECK_EG_MATCH)
def check_eg_match(tx, inst):
    raise Unsupported(BreakReason.UNSUPPORTED_OPCODE, _EXCEPTION_GROUPS)


@handler(Op.PREP_RERAISE_STAR)
def prep_reraise_star(tx, inst):
    raise Unsupported(BreakReason.UNSUPPORTED_OPCODE, _EXCEPTION_GROUPS)


@handler(Op.CALL_INTRINSIC_2)
def call_intrinsic_2(tx, inst):
    """3.12+: INTRINSIC_PREP_RERAISE_STAR (1) is PREP_RERAISE_STAR; the others only appear
    where generic functions and classes are defined."""
    if inst.arg == 1:
        raise Unsupported(BreakReason.UNSUPPORTED_OPCODE, _EXCEPTION_GROUPS)
    raise Unsupported(
        BreakReason.UNSUPPORTED_OPCODE,
        f"CALL_INTRINSIC_2 with argument {inst.arg} (type parameters) is not captured",
    )
