"""Stack shuffling, locals and constants."""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.handlers.names import CellHandle
from ember.capture.values.base import NULL, NullValue, Value
from ember.capture.values.generator_drop import close_if_dropped


@handler(Op.NOP)
def nop(tx, inst):
    pass


def _fast(tx, name: str) -> Value:
    """What a fast-local slot holds: a plain value, or a cell (3.13 reads a cell so for a
    closure, where 3.11/3.12 have LOAD_CLOSURE). A comprehension inlined into a function
    keeps its own variable in the slot of an outer cell of the same name, as a plain value."""
    if name in tx.locals:
        return tx.locals[name]
    if name in tx.cells:
        return CellHandle(tx.cells[name])
    return tx.load_local(name)


@handler(Op.LOAD_FAST)
def load_fast(tx, inst):
    tx.push(_fast(tx, inst.argval))


@handler(Op.LOAD_FAST_LOAD_FAST)
def load_fast_load_fast(tx, inst):
    for name in inst.argval:
        tx.push(_fast(tx, name))


@handler(Op.LOAD_FAST_AND_CLEAR)
def load_fast_and_clear(tx, inst):
    # 3.12 inlined comprehensions save the outer variable (or NULL) and clear it
    name = inst.argval
    if name in tx._lazy_args:  # an argument not read yet: it is saved like any local
        tx.load_local(name)
    tx.push(tx.locals.pop(name, NULL))


def _store(tx, name: str) -> None:
    value = tx.pop()
    if isinstance(value, NullValue):
        tx.locals.pop(name, None)
    else:
        tx.locals[name] = value
    tx._lazy_args.pop(name, None)


@handler(Op.STORE_FAST)
def store_fast(tx, inst):
    _store(tx, inst.argval)


@handler(Op.STORE_FAST_STORE_FAST)
def store_fast_store_fast(tx, inst):
    for name in inst.argval:  # the top of the stack goes to the first name
        _store(tx, name)


@handler(Op.STORE_FAST_LOAD_FAST)
def store_fast_load_fast(tx, inst):
    stored, loaded = inst.argval
    _store(tx, stored)
    tx.push(_fast(tx, loaded))


@handler(Op.DELETE_FAST)
def delete_fast(tx, inst):
    tx.load_local(inst.argval)
    del tx.locals[inst.argval]


@handler(Op.LOAD_CONST)
def load_const(tx, inst):
    tx.push(tx.ctx.builder.wrap_const(inst.argval))


@handler(Op.POP_TOP)
def pop_top(tx, inst):
    close_if_dropped(tx, tx.pop())  # a `for` loop's generator at a `break`


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
