"""Binary, unary, comparison, identity and membership operators."""

from __future__ import annotations

import operator

from ember.bytecode import BINARY_OPS, COMPARE_OPS, Op
from ember.capture.handlers import handler
from ember.capture.operators import apply
from ember.capture.values.base import ConstantValue


@handler(Op.BINARY_OP)
def binary_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(apply(tx, BINARY_OPS[inst.arg], [a, b]))


@handler(Op.COMPARE_OP)
def compare_op(tx, inst):
    # 3.13's bool form (`inst.to_bool`) feeds a conditional jump, which takes the truth of
    # the result itself (see to_bool below)
    b = tx.pop()
    a = tx.pop()
    tx.push(apply(tx, COMPARE_OPS[inst.argval], [a, b]))


@handler(Op.TO_BOOL)
def to_bool(tx, inst):
    """3.13 converts a value to bool before POP_JUMP_IF_TRUE/FALSE and UNARY_NOT. The value
    stays as it is: those readers take its truth themselves, once, as on 3.11/3.12, so a
    tensor condition breaks at the jump (break code and `CodeBuilder.pop_jump_if` put the
    TO_BOOL back in front of it)."""


@handler(Op.IS_OP)
def is_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(apply(tx, operator.is_not if inst.arg else operator.is_, [a, b]))


@handler(Op.CONTAINS_OP)
def contains_op(tx, inst):
    container = tx.pop()
    item = tx.pop()
    result = apply(tx, operator.contains, [container, item])
    tx.push(ConstantValue(not result.as_constant()) if inst.arg else result)


def _unary(fn):
    def run(tx, inst):
        tx.push(apply(tx, fn, [tx.pop()]))

    return run


handler(Op.UNARY_NEGATIVE)(_unary(operator.neg))
handler(Op.UNARY_POSITIVE)(_unary(operator.pos))
handler(Op.UNARY_INVERT)(_unary(operator.invert))
handler(Op.UNARY_NOT)(_unary(operator.not_))
