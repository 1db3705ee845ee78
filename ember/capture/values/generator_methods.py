"""`generator.throw(...)` and `generator.close()` on a generator of the trace
(GeneratorIterator), modelled as CPython runs them, instead of a break at the call.

A graph break there is worse than slow: break code hands the generator on settled (its
remaining items computed ahead, as a tuple iterator), which has neither method. CPython
raises the thrown exception inside the generator's frame at the `yield` it is suspended
at: a handler there catches it and the generator runs to its next yield, which `throw()`
returns; otherwise it leaves the frame (PEP 479 applies) and `throw()` raises it. `close()`
throws GeneratorExit: the generator must then end (GeneratorExit or StopIteration leaving
it: `close()` returns None) or raise; yielding again is a RuntimeError."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.exceptions import (
    ExceptionValue,
    TracedRaise,
    construct_exception,
    leaving_generator,
    raise_in_trace,
)
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator
    from ember.capture.values.iterators import GeneratorIterator


def thrown_exception(tx: Translator, args: list[Value]) -> ExceptionValue:
    """What `throw(typ)`, `throw(typ, val)` or `throw(exc)` raises."""
    first = args[0]
    if isinstance(first, ExceptionValue) and len(args) == 1:
        return first
    if first.is_constant() and isinstance(first.as_constant(), type):
        cls = first.as_constant()
        if issubclass(cls, BaseException) and len(args) <= 2:
            rest = args[1:2]
            if rest and isinstance(rest[0], ExceptionValue):
                return rest[0]
            if rest and rest[0].is_constant() and rest[0].as_constant() is None:
                rest = []
            return construct_exception(tx, cls, rest, {})
    raise Unsupported(BreakReason.UNSUPPORTED_CALL, "generator.throw() with these arguments")


def throw(tx: Translator, gen: GeneratorIterator, exc: ExceptionValue) -> Value:
    """Raise `exc` in the generator at its yield; its next yielded item is the result."""
    started = bool(gen.items) and not gen.exhausted
    if not started:  # never started, or finished: raised right here, the generator ends
        gen.exhausted = True
        raise TracedRaise(exc)
    frame = gen.frame
    at_yield = frame.insts[frame.ip - 1]
    if not frame.unwind(at_yield, exc):
        gen.exhausted = True
        raise TracedRaise(leaving_generator(exc))
    item = gen.next(tx)
    if item is None:
        raise_in_trace(tx, StopIteration, gen.stop_arguments(), "StopIteration from throw()")
    return item


def close(tx: Translator, gen: GeneratorIterator) -> Value:
    """Throw GeneratorExit in; None once the generator has ended."""
    if not gen.items or gen.exhausted:
        gen.exhausted = True
        return ConstantValue(None)
    try:
        throw(tx, gen, construct_exception(tx, GeneratorExit, [], {}))
    except TracedRaise as raised:
        if issubclass(raised.value.cls, (GeneratorExit, StopIteration)):
            return ConstantValue(None)
        raise
    message = "generator ignored GeneratorExit"
    raise_in_trace(tx, RuntimeError, [ConstantValue(message)], f"RuntimeError: {message}")
