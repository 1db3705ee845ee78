"""Graph breaks inside inlined calls: which frame takes the break.

A break deep in inlined code (a decorator's `(*args, **kwargs)` wrapper calls forward,
which calls a helper that breaks) is taken in the deepest frame of the call chain that can
continue in a resume function of its own, provided every frame above it called the one
below directly (`f(...)`, `obj.method(...)`, `module(...)` without hooks), so that what the
call pushes is exactly what the callee returns. Break code then runs that frame's
instruction in CPython, calls its resume function, and hands the result to each caller's
resume function after its call, innermost first (codegen.py). The graph before the break
holds the tensor work of every frame on the way, and the break happens once: breaking at
the outermost call instead captures each callee again, and each records the same break.

Frames that cannot take part: generator frames (their state lives in a generator object),
frames inside an `except` handler at that point, and methods that use zero-argument
`super()` (its `__class__` must stay a free variable). A frame inside a `try` or `with`
block takes part: break code catches what the frames below raise and calls that frame's
resume function at the block's handler (codegen.py `_ReturnThroughCallers`). An inlined
function whose closure holds cells that are not the same on every call (made in the trace,
or of a closure guarded by its code) takes part too: its resume function receives its free
variables as cell objects (`passes_free_cells`), so break code hands it this call's cells.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ember.bytecode import Op
from ember.capture.values.base import Value
from ember.capture.values.exceptions import SavedException
from ember.capture.values.functions import (
    BoundMethodValue,
    NestedFunctionValue,
    RealCell,
    UserFunctionValue,
)
from ember.capture.values.modules import has_hooks
from ember.capture.values.objects import ModuleValue

if TYPE_CHECKING:
    from ember.capture.translator import Translator

CALLS = (Op.CALL, Op.CALL_KW, Op.CALL_FUNCTION_EX)


def host_depth(chain: Sequence[Translator]) -> int:
    """The index in `chain` (the running frames, the root first, each stopped at an
    instruction) of the frame a break among them is taken in: 0 (the root frame, as always
    before) unless inlined frames can take it."""
    from ember.capture.codegen import can_resume_after

    host = 0
    for depth in range(1, len(chain)):
        caller, frame = chain[depth - 1], chain[depth]
        if not (
            _calls_directly(caller, frame)
            and _can_resume(caller, inlined=depth > 1)
            and _can_resume(frame, inlined=True)
        ):
            break
        inst = frame.current
        if can_resume_after(inst) and inst.op is not Op.BEFORE_WITH:
            host = depth
    return host


def _calls_directly(caller: Translator, frame: Translator) -> bool:
    """Whether `frame` is the callee of the call instruction `caller` is running, and the
    call's result is what that frame returns."""
    inst = caller.current
    if inst is None or inst.op not in CALLS or caller.calling is None:
        return False
    return _frame_code(caller.calling) is frame.code


def _frame_code(fn: Value) -> types.CodeType | None:
    """The code a call of `fn` runs as the frame whose return value is the call's result
    (None when the call does more: a class's construction, hooks, an lru_cache lookup)."""
    if isinstance(fn, ModuleValue):
        module = fn.module
        if has_hooks(module) or type(module).__call__ is not torch.nn.Module.__call__:
            return None
        forward = getattr(type(module), "forward", None)
        if "forward" in vars(module) or not isinstance(forward, types.FunctionType):
            return None
        return forward.__code__
    if isinstance(fn, BoundMethodValue):
        fn = fn.fn
    if isinstance(fn, UserFunctionValue) and fn.cached_by is None:
        return fn.fn.__code__
    if isinstance(fn, NestedFunctionValue):
        return fn.code
    return None


def _can_resume(frame: Translator, inlined: bool) -> bool:
    """Whether the rest of a frame, after its current instruction, can run as a resume
    function: not inside an `except` block (the exception it handles would have to be
    handled again in the frames below), and an inlined frame is neither a generator's nor
    closes over cells made in the trace. Inside a try or `with` block it can: break code
    sends what the frames below raise to a resume function at the block's handler."""
    if any(isinstance(v, SavedException) for v in frame.stack):
        return False
    if not inlined:
        return True
    if frame.code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE):
        return False
    return "__class__" not in frame.code.co_freevars or not passes_free_cells(frame)


def _fixed(cell: object) -> bool:
    """A cell that is the same on every call (its resume function can close over it)."""
    return isinstance(cell, RealCell) and cell.fixed


def passes_free_cells(frame: Translator) -> bool:
    """Whether the resume functions of a frame take its free variables as cell parameters
    (some cell of its closure differs between calls: an inlined closure's, or the compiled
    function's own, whose entries serve all its closures) instead of closing over the cells
    the capture saw."""
    return not all(_fixed(frame.cells.get(name)) for name in frame.code.co_freevars)


def frame_function(frame: Translator) -> types.FunctionType:
    """A function object for an inlined frame's code, globals and closure: what its resume
    functions are made from (the root frame's is the compiled function itself). Where the
    resume functions take the free variables as parameters, the closure is a stand-in."""
    closure = tuple(
        frame.cells[name].cell if _fixed(frame.cells[name]) else types.CellType()
        for name in frame.code.co_freevars
    )
    return types.FunctionType(
        frame.code, frame.f_globals, frame.code.co_name, None, closure or None
    )
