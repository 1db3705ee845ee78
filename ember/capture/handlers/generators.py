"""Generator frames: RETURN_GENERATOR and YIELD_VALUE inside a generator being run to
exhaustion by `values/generators.py` (the frame carries a `yielded` list)."""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.values.base import ConstantValue
from ember.errors import BreakReason, Unsupported


def _yielded(tx) -> list:
    items = getattr(tx, "yielded", None)
    if items is None:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{tx.code.co_name} is a generator function; only generators called from "
            "compiled code are captured",
            hint="compile the function that consumes the generator instead",
        )
    return items


@handler(Op.RETURN_GENERATOR)
def return_generator(tx, inst):
    _yielded(tx)
    tx.push(ConstantValue(None))  # the value the first resume sends (popped right after)


@handler(Op.YIELD_VALUE)
def yield_value(tx, inst):
    _yielded(tx).append(tx.pop())
    tx.push(ConstantValue(None))  # what `yield` evaluates to: nothing is ever sent
