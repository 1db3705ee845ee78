"""Calls, keyword names, function creation, imports and CPython intrinsics."""

from __future__ import annotations

import operator

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.operators import apply
from ember.capture.values import (  # noqa: F401 (registers handlers)
    index_protocol,
    made_classes,
    torch_queries,
)
from ember.capture.values.base import NullValue, Value
from ember.capture.values.builtins import BUILTINS
from ember.capture.values.containers import DictValue, TupleValue
from ember.capture.values.exceptions import (
    ExceptionValue,
    TracedRaise,
    leaving_generator,
    python_error,
)
from ember.capture.values.functions import NestedFunctionValue
from ember.capture.values.super_value import SuperValue
from ember.errors import BreakReason, Unsupported


def call_value(tx, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """Call a symbolic callable; zero-argument super() needs the frame, so it is done here."""
    if fn.is_constant() and fn.as_constant() is super and not args:
        return _zero_arg_super(tx)
    tx.calling = fn  # a break inside the callee's frame may resume in it (capture/nested.py)
    return fn.call(tx, args, kwargs)


def _zero_arg_super(tx) -> Value:
    if "__class__" not in tx.cells or tx.code.co_argcount == 0:
        raise Unsupported(BreakReason.UNSUPPORTED_CALL, "super() outside a method")
    cls = tx.load_cell("__class__").as_constant()
    first = tx.code.co_varnames[0]
    return SuperValue(cls, tx.load_local(first))


BUILTINS[super] = lambda tx, args, kwargs: SuperValue(args[0].as_constant(), args[1])


@handler(Op.KW_NAMES)
def kw_names(tx, inst):
    tx.kw_names = inst.argval


def _pop_callable(tx) -> tuple[Value, list[Value]]:
    """The callable below a call's arguments and the arguments it takes first: the two
    slots are [NULL, callable] (3.11/3.12), [callable, NULL] (3.13) or [function, self]."""
    second = tx.pop()
    first = tx.pop()
    if isinstance(first, NullValue):
        return second, []
    if isinstance(second, NullValue):
        return first, []
    return first, [second]


def _call(tx, nargs: int, names: tuple[str, ...]) -> None:
    args = tx.popn(nargs)
    fn, leading = _pop_callable(tx)
    args = leading + args
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[-len(names) :]))
        args = args[: -len(names)]
    tx.push(call_value(tx, fn, args, kwargs))


@handler(Op.CALL)
def call(tx, inst):
    names = tx.kw_names
    tx.kw_names = ()
    _call(tx, inst.arg, names)


@handler(Op.CALL_KW)
def call_kw(tx, inst):
    _call(tx, inst.arg, tx.pop().as_constant())


@handler(Op.CALL_FUNCTION_EX)
def call_function_ex(tx, inst):
    kwargs_value = tx.pop() if inst.arg & 1 else DictValue({})
    args_value = tx.pop()
    fn, leading = _pop_callable(tx)
    if not isinstance(kwargs_value, DictValue):
        raise Unsupported(BreakReason.UNSUPPORTED_OBJECT, f"** of {kwargs_value.describe()}")
    kwargs = {str(k): v for k, v in kwargs_value.items.items()}
    tx.push(call_value(tx, fn, leading + args_value.iterate(tx), kwargs))


_CLOSURE, _ANNOTATIONS, _KWDEFAULTS, _DEFAULTS = 0x08, 0x04, 0x02, 0x01


def _set_part(fn: NestedFunctionValue, flag: int, value: Value) -> None:
    """Give a function made during capture one of its optional parts."""
    if flag == _CLOSURE:
        fn.closure = tuple(h.cell for h in value.items)
        for cell in fn.closure:
            if not hasattr(cell, "load") and not hasattr(cell, "cell"):
                raise Unsupported(BreakReason.UNSUPPORTED_OBJECT, "closure of unknown cells")
    elif flag == _ANNOTATIONS:
        fn.annotations = value
    elif flag == _KWDEFAULTS:
        fn.kwdefaults = dict(value.items)
    elif flag == _DEFAULTS:
        fn.defaults = tuple(value.items)


@handler(Op.MAKE_FUNCTION)
def make_function(tx, inst):
    """3.11/3.12: the parts its argument names are below the code, the closure on top;
    3.13 sets each afterwards (SET_FUNCTION_ATTRIBUTE) and MAKE_FUNCTION takes none."""
    code = tx.pop().as_constant()
    fn = NestedFunctionValue(code, tx.f_globals, (), {}, (), code.co_qualname)
    for flag in (_CLOSURE, _ANNOTATIONS, _KWDEFAULTS, _DEFAULTS):
        if (inst.arg or 0) & flag:
            _set_part(fn, flag, tx.pop())
    tx.push(fn)


@handler(Op.SET_FUNCTION_ATTRIBUTE)
def set_function_attribute(tx, inst):
    fn = tx.pop()
    _set_part(fn, inst.arg, tx.pop())
    tx.push(fn)


@handler(Op.CALL_INTRINSIC_1)
def call_intrinsic_1(tx, inst):
    if inst.arg == 5:  # INTRINSIC_UNARY_POSITIVE
        tx.push(apply(tx, operator.pos, [tx.pop()]))
    elif inst.arg == 6:  # INTRINSIC_LIST_TO_TUPLE
        tx.push(TupleValue(tx.pop().items))
    elif inst.arg == 3 and isinstance(tx.peek(), ExceptionValue):  # INTRINSIC_STOPITERATION_ERROR
        tx.push(leaving_generator(tx.pop()))
    else:
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPCODE, f"CALL_INTRINSIC_1 with argument {inst.arg}"
        )


@handler(Op.IMPORT_NAME)
def import_name(tx, inst):
    fromlist = tx.pop().as_constant()
    level = tx.pop().as_constant()
    try:
        module = __import__(inst.argval, tx.f_globals, None, fromlist, level)
    except ImportError as error:  # `try: import x / except ImportError:` (optional packages)
        if tx.handled_in_trace():
            raise TracedRaise(python_error(tx, error)) from error
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED, f"import {inst.argval} raised {type(error).__name__}"
        ) from error
    tx.push(tx.ctx.builder.wrap_const(module))


@handler(Op.IMPORT_FROM)
def import_from(tx, inst):
    tx.push(tx.peek().getattr(tx, inst.argval))
