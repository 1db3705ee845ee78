"""Continuation (resume) functions for graph breaks.

A resume function continues a user function at one instruction: its parameters are the values
that were on the stack (`___stack_i`, NULLs are pushed back by position) followed by the live
locals; its body pushes the stack back and jumps into a copy of the original bytecode. The
break's replacement code calls it, and it goes through ember's cache like any function, so the
code after a break is captured too.

Resume functions are made once per (original code, place, stack layout, locals): a break that
recurs in a loop, or in a resume function, continues in the same one. Only locals live after
the break travel; cells travel as their contents; methods as their receivers; grad-mode
`with` blocks keep their handlers in the copied code and get an `__exit__` that restores the
outer mode. Whether a break can resume at all (try blocks, other context managers) is decided
from the exception table (`ember.bytecode.enclosing_blocks`); which locals travel, from
`ember.bytecode.live_locals`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import weakref
from collections.abc import Callable

import torch

from ember.bytecode import (  # noqa: F401  (frame.py takes the analyses from here)
    CannotContinue,
    Continuation,
    Inst,
    enclosing_blocks,
    handler_at,
    live_locals,
)
from ember.errors import BreakReason, Unsupported


class Slot(enum.Enum):
    """How a stack slot travels into a resume function."""

    VALUE = "passed as a parameter"
    NULL = "the NULL of the call convention, pushed back by the prologue"
    ITERATOR = "the remaining items of a loop's iterator, passed as a tuple and re-iterated"
    METHOD = "a method: its receiver is passed and the prologue looks the method up again"
    HANDLING = (
        "inside an `except` block, the slot that PUSH_EXC_INFO fills with the exception "
        "handled before: the block's own exception is passed, and the prologue raises and "
        "catches it, so that CPython handles it (`sys.exc_info()`, a bare `raise`) and saves "
        "the one before"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class StackSlot:
    """One stack slot at a break: how it travels, and for METHOD the attribute name.

    A method travels as its receiver so that the resume function sees `receiver.name` with a
    source (a bound method passed as an object would be guarded by identity, and a fresh
    `lst.append` is a new object on every call)."""

    kind: Slot
    attr: str = ""


def is_grad_exit(value: object) -> bool:
    """Whether a stack value is the `__exit__` of a grad-mode `with` block: the block's own
    (ExitValue) or the stand-in that a resume function receives for it."""
    from ember.capture.handlers.control import ExitValue
    from ember.capture.values.functions import UserFunctionValue
    from ember.capture.values.objects import GradModeValue

    if isinstance(value, ExitValue):
        return isinstance(value.manager, GradModeValue) and value.user_exit is None
    return isinstance(value, UserFunctionValue) and value.fn in (
        _leave_to_enabled,
        _leave_to_disabled,
    )


def leave_grad_block(mode: bool) -> Callable[..., None]:
    """The `__exit__` that a grad-mode `with` block resumed after a break finds on its stack:
    it sets the grad mode back to what it was outside the block. A plain function, so that
    ember captures the call like any other (`torch.set_grad_enabled(mode)` as a statement)."""
    return _leave_to_enabled if mode else _leave_to_disabled


def _leave_to_enabled(*exc_info: object) -> None:
    torch.set_grad_enabled(True)


def _leave_to_disabled(*exc_info: object) -> None:
    torch.set_grad_enabled(False)


PASSED = frozenset({Slot.VALUE, Slot.ITERATOR, Slot.METHOD, Slot.HANDLING})
"""The slots that travel as parameters (the others the prologue pushes itself)."""


def stack_param(i: int) -> str:
    return f"___stack_{i}"


@dataclasses.dataclass(frozen=True, slots=True)
class _Origin:
    """Where a resume function's body comes from: instruction ordinal k of the resume code is
    ordinal k + shift of `code`, the user's original code (for k past the prologue)."""

    code: types.CodeType
    shift: int
    prologue: int


_origins: weakref.WeakKeyDictionary[types.CodeType, _Origin] = weakref.WeakKeyDictionary()
_made: weakref.WeakValueDictionary[tuple, types.FunctionType] = weakref.WeakValueDictionary()
"""Resume functions by (original code, ordinal, slots, locals, closure): a break that happens
again at the same place, in a loop or in a resume function, continues in the same function,
so its cache entries are reused instead of nesting new code objects without end. Held
weakly: break code that calls a resume function keeps it alive."""


def _ordinal(insts: list[Inst], target: int) -> int:
    return sum(1 for i in insts[:target] if i.opname != "EXTENDED_ARG")


_cell_params: weakref.WeakKeyDictionary[types.CodeType, tuple[str, ...]] = (
    weakref.WeakKeyDictionary()
)
"""Resume code -> its cell variables that arrive as cell objects (see `_build`)."""


def cell_params(code: types.CodeType) -> tuple[str, ...]:
    """The parameters of a resume function's code that are cells, not values: the capture
    of that code reads and writes them as real cells (`RealCell`, not fixed)."""
    return _cell_params.get(code, ())


def make_resume_function(
    fn: types.FunctionType,
    target: int,
    slots: list[StackSlot],
    local_names: list[str],
    insts: list[Inst],
    grad_mode: bool | None = None,
    cells: tuple[str, ...] = (),
) -> types.FunctionType:
    """A function that continues `fn` at instruction index `target` (of `insts`). With
    `grad_mode`, its prologue sets that grad mode first: a break inside a grad-mode block
    calls it in the mode outside the block, so that its graph starts where its callers'
    graphs start and switches the mode itself (as a graph captured whole would)."""
    code = fn.__code__
    ordinal = _ordinal(insts, target)
    origin = _origins.get(code)
    if origin is not None and ordinal >= origin.prologue:
        code, ordinal = origin.code, ordinal + origin.shift
    closure = tuple(map(id, fn.__closure__ or ()))  # the made function keeps them alive
    if set(code.co_freevars) <= set(cells):  # passed as parameters: no closure
        closure = ()
    key = (code, ordinal, tuple(slots), tuple(local_names), closure, id(fn.__globals__))
    key += (grad_mode, cells)
    made = _made.get(key)
    if made is None:
        offset = insts[target].offset
        made = _made[key] = _build(fn, code, ordinal, slots, local_names, offset, grad_mode, cells)
    return made


def super_receiver(code: types.CodeType) -> str | None:
    """The first argument of a method that may call zero-argument `super()` (it has a
    `__class__` cell): on 3.11 `super()` reads it as the frame's first local, without a
    LOAD_FAST that liveness or a resume function's parameters would see."""
    if "__class__" not in code.co_freevars or not code.co_argcount:
        return None
    return code.co_varnames[0]


def _receiver_first(
    code: types.CodeType, positional: list[str], cells: tuple[str, ...]
) -> list[str]:
    """The parameter names of a resume function of a method that calls zero-argument
    `super()`: the method's own first argument (`self`, `cls`) must stay the first
    parameter. Its name and the first positional one swap places (callers pass values in
    the usual order; the prologue swaps the two values back)."""
    receiver = super_receiver(code)
    if receiver is None or receiver not in positional or receiver in cells:
        return positional
    if positional[0] == receiver:
        return positional
    swapped = list(positional)
    k = swapped.index(receiver)
    swapped[0], swapped[k] = receiver, positional[0]
    return swapped


def _build(
    fn: types.FunctionType,
    code: types.CodeType,
    ordinal: int,
    slots: list[StackSlot],
    local_names: list[str],
    offset: int,
    grad_mode: bool | None = None,
    cells: tuple[str, ...] = (),
) -> types.FunctionType:
    """Copy `code`, with a prologue that pushes the stack slots back and jumps to the
    instruction of the given ordinal. Cell variables stay cells: those in `cells` arrive
    as the cell objects themselves, parameters whose MAKE_CELL is dropped from the copied
    head, so that CPython's LOAD_DEREF/STORE_DEREF use the passed cell (the one a function
    rebuilt at the break closes over); the others are made afresh by their MAKE_CELL."""
    stack_names = [stack_param(i) for i, slot in enumerate(slots) if slot.kind in PASSED]
    params = [
        name if name.isidentifier() else f"___local_{i}" for i, name in enumerate(local_names)
    ]
    name = f"__resume_{code.co_name}_at_{offset}"
    positional = stack_names + params
    swapped = _receiver_first(code, positional, cells)
    try:
        cg = Continuation(code, ordinal, name, swapped)
    except CannotContinue as exc:
        raise Unsupported(BreakReason.UNSUPPORTED_OPCODE, str(exc)) from exc
    cg.take_cells(cells)
    if swapped != positional:  # each of the two names takes the other's value back
        cg.load_fast(swapped[0])
        cg.load_fast(positional[0])
        cg.store_fast(swapped[0])
        cg.store_fast(positional[0])
    for param, name in zip(params, local_names):
        if param != name:  # `@py_assert1` (pytest's rewritten asserts) cannot be a parameter
            cg.load_fast(param)
            cg.store_fast(name)
    if grad_mode is not None:  # torch.set_grad_enabled(mode) as a statement
        cg.load_const(torch.set_grad_enabled, push_null=True)
        cg.load_const(grad_mode)
        cg.call(1)
        cg.pop_top()
    for i, slot in enumerate(slots):
        if slot.kind is Slot.NULL:
            cg.push_null()
            continue
        cg.load_fast(stack_param(i))
        if slot.kind is Slot.HANDLING:
            cg.catch_raised(i)
            cg.pop_top()
        elif slot.kind is Slot.ITERATOR:
            cg.get_iter()
        elif slot.kind is Slot.METHOD:
            cg.load_attr(slot.attr)
    prologue = cg.prologue_length()
    new_code = cg.to_code()
    _origins[new_code] = _Origin(code, cg.copied_head - prologue, prologue)
    if cells:
        _cell_params[new_code] = cells
    closure = fn.__closure__ if new_code.co_freevars else None  # free variables passed
    return types.FunctionType(new_code, fn.__globals__, new_code.co_name, None, closure)
