"""Globals, attributes, closures and cells."""

from __future__ import annotations

from ember.bytecode import Op, with_null
from ember.capture.handlers import handler
from ember.capture.values.base import NULL, Value, attribute
from ember.capture.values.functions import RealCell
from ember.capture.values.objects import CellValue
from ember.capture.values.super_value import SuperValue
from ember.errors import BreakReason, Unsupported


@handler(Op.LOAD_GLOBAL)
def load_global(tx, inst):
    value = tx.load_global(inst.argval)
    if inst.push_null:
        tx.stack.extend(with_null(value, NULL))
    else:
        tx.push(value)


@handler(Op.STORE_GLOBAL)
def store_global(tx, inst):
    tx.ctx.effects.store_global(tx.f_globals, inst.argval, tx.pop())


@handler(Op.LOAD_ATTR)
def load_attr(tx, inst):
    tx.push(attribute(tx, tx.pop(), inst.argval))


@handler(Op.LOAD_METHOD)
def load_method(tx, inst):
    # pushed as a bound method with a NULL, which CPython also accepts from LOAD_METHOD
    tx.stack.extend(with_null(attribute(tx, tx.pop(), inst.argval), NULL))


@handler(Op.LOAD_SUPER_ATTR)
def load_super_attr(tx, inst):
    self_value = tx.pop()
    cls = tx.pop()
    tx.pop()  # the global `super`
    attr = SuperValue(cls.as_constant(), self_value).getattr(tx, inst.argval)
    if inst.push_null:
        tx.stack.extend(with_null(attr, NULL))
    else:
        tx.push(attr)


@handler(Op.STORE_ATTR)
def store_attr(tx, inst):
    obj = tx.pop()
    value = tx.pop()
    obj.setattr(tx, inst.argval, value)


@handler(Op.DELETE_ATTR)
def delete_attr(tx, inst):
    obj = tx.pop()
    delete = getattr(obj, "delattr", None)
    if delete is None:
        raise Unsupported(BreakReason.SIDE_EFFECT, f"deleting attribute {inst.argval!r}")
    delete(tx, inst.argval)


@handler(Op.MAKE_CELL)
def make_cell(tx, inst):
    name = inst.argval
    initial = tx.load_local(name) if name in tx.locals or name in tx._lazy_args else None
    tx.cells[name] = CellValue(initial)
    tx.locals.pop(name, None)


@handler(Op.COPY_FREE_VARS)
def copy_free_vars(tx, inst):
    pass  # free variables were bound when the frame was created


@handler(Op.LOAD_CLOSURE)
def load_closure(tx, inst):
    tx.push(CellHandle(tx.cells[inst.argval]))


@handler(Op.LOAD_DEREF)
def load_deref(tx, inst):
    tx.push(tx.load_cell(inst.argval))


@handler(Op.STORE_DEREF)
def store_deref(tx, inst):
    tx.store_cell(inst.argval, tx.pop())


class CellHandle(Value):
    """A cell on the stack (LOAD_CLOSURE) on its way into MAKE_FUNCTION's closure tuple."""

    def __init__(self, cell: CellValue | RealCell) -> None:
        self.cell = cell
