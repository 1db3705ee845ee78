"""Stack shuffling, locals and constants."""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.values.base import NULL, NullValue


@handler(Op.NOP)
def nop(tx, inst):
    pass


@handler(Op.LOAD_FAST)
def load_fast(tx, inst):
    tx.push(tx.load_local(inst.argval))


@handler(Op.LOAD_FAST_AND_CLEAR)
def load_fast_and_clear(tx, inst):
    # 3.12 inlined comprehensions save the outer variable (or NULL) and clear it
    name = inst.argval
    if name in tx._lazy_args:  # an argument not read yet: it is saved like any local
        tx.load_local(name)
    tx.push(tx.locals.pop(name, NULL))


@handler(Op.STORE_FAST)
def store_fast(tx, inst):
    value = tx.pop()
    if isinstance(value, NullValue):
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = value
    tx._lazy_args.pop(inst.argval, None)


@handler(Op.DELETE_FAST)
def delete_fast(tx, inst):
    tx.load_local(inst.argval)
    del tx.locals[inst.argval]


@handler(Op.LOAD_CONST)
def load_const(tx, inst):
    tx.push(tx.ctx.builder.wrap_const(inst.argval))


@handler(Op.POP_TOP)
def pop_top(tx, inst):
    tx.pop()


@handler(Op.PUSH_NULL)
def push_null(tx, inst):
    tx.push(NULL)


@handler(Op.COPY)
def copy(tx, inst):
    tx.push(tx.peek(inst.arg))


@handler(Op.SWAP)
def swap(tx, inst):
    stack = tx.stack
    stack[-1], stack[-inst.arg] = stack[-inst.arg], stack[-1]
