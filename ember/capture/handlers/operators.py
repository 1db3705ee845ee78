"""Binary, unary, comparison, identity and membership operators."""

from __future__ import annotations

import operator

from ember.bytecode import Op
from ember.bytecode.ops import BINARY_OPS, COMPARE_OPS
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
    b = tx.pop()
    a = tx.pop()
    tx.push(apply(tx, COMPARE_OPS[inst.argval], [a, b]))


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
