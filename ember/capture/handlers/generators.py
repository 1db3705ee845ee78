"""Generator frames: RETURN_GENERATOR, YIELD_VALUE and `yield from` (GET_YIELD_FROM_ITER,
SEND, END_SEND) inside a generator that its consumer pulls from (values/iterators.py: the
frame carries a `yielded` list and stops after each yield)."""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.values.base import ConstantValue
from ember.capture.values.containers import IteratorValue
from ember.capture.values.iterators import GeneratorSuspended
from ember.errors import BreakReason, Unsupported


def _yielded(tx) -> list:
    items = tx.yielded
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
    raise GeneratorSuspended  # the frame waits here until its consumer pulls again


@handler(Op.GET_YIELD_FROM_ITER)
def get_yield_from_iter(tx, inst):
    _yielded(tx)
    value = tx.pop()
    tx.push(value if isinstance(value, IteratorValue) else IteratorValue(value.iterate(tx)))


@handler(Op.SEND)
def send(tx, inst):
    tx.pop()  # the sent value: always None, nothing is ever sent
    iterator = tx.peek()
    item = iterator.next(tx)
    if item is not None:
        tx.push(item)  # YIELD_VALUE yields it, then the loop jumps back here
        return
    tx.pop()  # the target is past 3.12+'s END_SEND, so SEND drops the iterator as on 3.11
    tx.push(iterator.returned or ConstantValue(None))
    tx.ip = inst.target


@handler(Op.END_SEND)
def end_send(tx, inst):
    del tx.stack[-2]
