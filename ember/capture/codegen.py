"""Replacement bytecode (seed 000's last step, Dynamo's PyCodegen).

The generated code object has the user function's signature and closure layout. It loads
`__compiled_fn_N` from the function's globals, stages the graph inputs by reloading their
sources, calls it, keeps the output tuple in a local, replays the side-effect ledger, rebuilds
the return value from graph outputs, constants, sources and fresh containers, and returns.

At a graph break (`build_break_replacement`) it runs the graph, sets the grad mode of the break
point, replays the ledger, rebuilds the stack and the live locals, runs the one instruction
ember could not trace in CPython (a call, a jump on a tensor, a subscript, an attribute
store...), goes back to the entry grad mode and returns what the resume function returns.
User functions called at the break go through ember again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from ember import torch_compat
from ember.bytecode import CodeBuilder, Inst, Op, operands, with_null
from ember.capture.break_site import BreakSite, CallerSite, FrameVars, Handler, cell_temp
from ember.capture.exception_state import handle_again, handle_match, stop_handling
from ember.capture.output_graph import Harvest
from ember.capture.resume import PASSED, Slot, StackSlot
from ember.capture.shapes import concrete, is_symbolic
from ember.capture.side_effects import SideEffects
from ember.capture.values.base import NullValue, Value
from ember.capture.values.compiler import runs_in_python
from ember.capture.values.containers import (
    DictValue,
    IteratorValue,
    ListValue,
    TupleValue,
)
from ember.capture.values.exceptions import SavedException
from ember.capture.values.functions import (
    BoundMethodValue,
    MethodValue,
    NestedFunctionValue,
    PartialValue,
    UserFunctionValue,
)
from ember.capture.values.iterators import LazyIterator
from ember.capture.values.made_classes import MadeClassValue
from ember.capture.values.modules import BornModuleValue, has_hooks
from ember.capture.values.objects import CellValue, ModuleValue, UserObjectValue
from ember.capture.values.reachability import CycleNotRebuilt, rebuild_in_two_steps
from ember.capture.values.tensor import TensorValue
from ember.distributed import data_parallel_call
from ember.errors import BreakReason, Unsupported

GRAPH_OUT = "___graph_out"


def symbol_local(symbol: Any) -> str:
    """The local that holds a size symbol's value, read when the replacement code starts."""
    return f"___sym_{symbol}"


def _read_symbols(cg: CodeBuilder, harvest: Harvest) -> None:
    """Read the symbols the code after the graph computes with, first thing: a symbol is the
    value its guard checked, and the replay may change its source (`self.calls += 1`)."""
    for symbol, source in harvest.symbol_reads().items():
        source.emit(cg)
        cg.store_fast(symbol_local(symbol))


class Emitter:
    """Pushes values at run time; fresh mutable objects are built once and reused."""

    def __init__(self, cg: CodeBuilder, harvest: Harvest) -> None:
        self.cg = cg
        self.output_index = harvest.output_index
        self._sizes = harvest.sizes
        self._built: dict[int, str] = {}
        self._building: dict[int, Value] = {}  # being rebuilt, outermost first
        self.site: BreakSite | None = None
        """The break this code is for: callbacks of iterators made again lazily go through
        ember as its callee does (`reconstruct_callback`)."""

    def load_number(self, value: Any) -> None:
        """A constant; a symbolic number computed from the symbols read at entry (a tuple
        of sizes, `x.shape`, item by item)."""
        size = self._sizes.get(value.node.expr) if is_symbolic(value) else None
        if size is not None:
            if size.fn is not None:
                self.cg.load_const(size.fn, push_null=True)
            for symbol, _ in size.symbols:
                self.cg.load_fast(symbol_local(symbol))
            if size.fn is not None:
                self.cg.call(len(size.symbols))
        elif type(value) in (tuple, torch.Size) and any(map(is_symbolic, value)):
            if type(value) is torch.Size:
                self.cg.load_const(torch.Size, push_null=True)
            for item in value:
                self.load_number(item)
            self.cg.build("TUPLE", len(value))
            if type(value) is torch.Size:
                self.cg.call(1)
        else:
            self.cg.load_const(concrete(value))  # a size ember could not write: guarded

    def load_tensor(self, value: TensorValue) -> None:
        if value.node in self.output_index:
            self.cg.load_fast(GRAPH_OUT)
            self.cg.load_const(self.output_index[value.node])
            self.cg.subscr()
        elif value.source is not None:
            value.source.emit(self.cg)
        else:
            raise Unsupported(
                BreakReason.UNSUPPORTED_OBJECT, f"{value.describe()} is not a graph output"
            )

    def attribute_map(self, attrs: dict[str, Value]) -> None:
        """Push `{name: value}` of an object's attributes (what the rebuilders of objects
        made in the trace set on them)."""
        for name, value in attrs.items():
            self.cg.load_const(name)
            self.reconstruct(value)
        self.cg.build("MAP", len(attrs))

    def reconstruct(self, value: Value) -> None:
        key = id(value)
        if key in self._built:
            self.cg.load_fast(self._built[key])
            return
        if key in self._building:  # a cycle of values made in one step each
            raise CycleNotRebuilt(value, list(self._building.values()))
        self._building[key] = value
        try:
            if rebuild_in_two_steps(self, value) is None:
                value.reconstruct(self)
                if _is_fresh_mutable(value):
                    self.keep(value)
        finally:
            del self._building[key]

    def keep(self, value: Value) -> str:
        """Store the value on top of the stack (left there) for later uses of it."""
        name = self._built[id(value)] = f"___tmp{len(self._built)}"
        self.cg.copy(1)
        self.cg.store_fast(name)
        return name

    def reconstruct_callback(self, value: Value) -> None:
        """A callback that CPython calls after the break (a rebuilt `map`'s function): a user
        function goes through ember's wrapper, so its body is captured when called."""
        if self.site is None:
            self.reconstruct(value)
        else:
            _reconstruct_callee(self, value, self.site)

    def load_cell(self, cell: Any) -> None:
        """Push a closure cell as a real cell object. A cell made in the trace (CellValue) is
        made once and shared by every function rebuilt over it and by the resume function
        of its frame; it is made empty first, so that a function stored in its own cell (a
        recursive local function) finds it."""
        if not isinstance(cell, CellValue):
            cell.emit(self.cg)
            return
        key = id(cell)
        if key not in self._built:
            name = self._built[key] = f"___tmp{len(self._built)}"
            self.cg.load_const(types.CellType, push_null=True)
            self.cg.call(0)
            self.cg.store_fast(name)
            if cell.contents is not None:
                self.reconstruct(cell.contents)
                self.cg.load_fast(name)
                self.cg.store_attr("cell_contents")
        self.cg.load_fast(self._built[key])

    def rebuild_fresh(self, container: Value) -> None:
        """Build a container's current contents as a new object (for replaying into it)."""
        saved = container.source
        container.source = None
        try:
            container.reconstruct(self)
        finally:
            container.source = saved


def _made_again(value: Value) -> bool:
    """A lazy iterator that break code makes again as it stands, not from its items."""
    return isinstance(value, LazyIterator) and not value.exhausted


def _is_fresh_mutable(value: Value) -> bool:
    if isinstance(value, MadeClassValue):
        return True
    if value.source is not None:
        return False
    fresh = (
        ListValue,
        DictValue,
        NestedFunctionValue,
        PartialValue,
        IteratorValue,
        BornModuleValue,
    )
    return isinstance(value, fresh) or (isinstance(value, UserObjectValue) and value.is_new)


_JUMP_CONDITIONS = {
    Op.POP_JUMP_IF_TRUE: "TRUE",
    Op.POP_JUMP_IF_FALSE: "FALSE",
    Op.POP_JUMP_IF_NONE: "NONE",
    Op.POP_JUMP_IF_NOT_NONE: "NOT_NONE",
}


def _call_graph(cg: CodeBuilder, compiled_name: str | None, harvest: Harvest) -> None:
    if compiled_name is None:
        return
    cg.load_global(compiled_name, push_null=True)
    for graph_input in harvest.inputs:
        graph_input.source.emit(cg)
    cg.call(len(harvest.inputs))
    cg.store_fast(GRAPH_OUT)


def _set_grad_mode(cg: CodeBuilder, mode: bool | None) -> None:
    """Set the grad mode the captured code left (None: unchanged). The graph may have been
    skipped as empty, or its backend may not change global state."""
    if mode is None:
        return
    cg.load_const(torch_compat.set_grad_enabled, push_null=True)
    cg.load_const(mode)
    cg.call(1)
    cg.pop_top()


def build_replacement(
    template: types.CodeType,
    compiled_name: str | None,
    harvest: Harvest,
    effects: SideEffects,
    result: Value,
    grad_mode: bool | None = None,
    raised: Value | None = None,
) -> types.CodeType:
    """The code object that replaces the user's function body for one cache entry: it
    returns `result`, or raises `raised` (an exception that left the traced function)."""
    cg = CodeBuilder(template)
    em = Emitter(cg, harvest)
    _read_symbols(cg, harvest)
    _call_graph(cg, compiled_name, harvest)
    _set_grad_mode(cg, grad_mode)
    # before the replay: the result may read state the replay changes
    em.reconstruct(result if raised is None else raised)
    effects.replay(em)
    if raised is None:
        cg.return_value()
    else:
        cg.raise_exception()
    return cg.to_code()


def _rebuild_callee(em: Emitter, value: Value, site: BreakSite) -> None:
    """A function made in the trace (a comprehension on 3.11, a local helper) or a local
    function from outside guarded by its code, called at the break: the very function the
    frame holds, wrapped at run time so that ember captures its call (its closure is this
    call's, so the wrapper is made here: compiled functions keep one cache per closure)."""
    em.cg.load_const(site.wrap_callee, push_null=True)
    em.reconstruct(value)
    em.cg.call(1)


def _captured_again(value: Value) -> bool:
    """Whether the callee of a broken call goes through ember again: not when it runs in
    Python by rule, nor through an lru_cache wrapper (the wrapper is called, cache and all)."""
    if isinstance(value, BoundMethodValue):
        value = value.fn
    if not isinstance(value, UserFunctionValue):
        return True
    return value.cached_by is None and runs_in_python(value.fn) is None


def _reconstruct_callee(em: Emitter, value: Value, site: BreakSite) -> None:
    """The callable of the call that broke: user functions go through ember again."""
    if not _captured_again(value):
        em.reconstruct(value)
    elif isinstance(value, NestedFunctionValue) or (
        isinstance(value, UserFunctionValue) and value.by_code
    ):
        _rebuild_callee(em, value, site)
    elif isinstance(value, UserFunctionValue):
        em.cg.load_const(site.wrap_callee(value.fn))
    elif isinstance(value, BoundMethodValue) and isinstance(value.fn, UserFunctionValue):
        em.cg.load_const(types.MethodType, push_null=True)
        em.cg.load_const(site.wrap_callee(value.fn.fn))
        em.reconstruct(value.receiver)
        em.cg.call(2)
    elif isinstance(value, ModuleValue) and value.source is not None:
        mod = value.module
        if (
            type(mod).__call__ is torch.nn.Module.__call__
            and not has_hooks(mod)
            and data_parallel_call(mod) is None  # DDP's, FSDP1's forward: in Python
        ):
            # forward through ember, so a submodule whose forward breaks is captured too
            em.cg.load_const(types.MethodType, push_null=True)
            em.cg.load_const(site.wrap_callee(type(mod).forward))
            value.source.emit(em.cg)
            em.cg.call(2)
        else:
            value.source.emit(em.cg)
    else:
        em.reconstruct(value)


def _slot(value: Value) -> StackSlot:
    if isinstance(value, NullValue):
        return StackSlot(Slot.NULL)
    if isinstance(value, SavedException):
        return StackSlot(Slot.HANDLING)
    if isinstance(value, IteratorValue):
        return StackSlot(Slot.ITERATOR)
    if isinstance(value, MethodValue):
        return StackSlot(Slot.METHOD, value.name)
    if (
        isinstance(value, BoundMethodValue)
        and value.source is None
        and isinstance(value.fn, UserFunctionValue)
    ):
        return StackSlot(Slot.METHOD, value.fn.fn.__name__)
    return StackSlot(Slot.VALUE)


def _call_resume(
    cg: CodeBuilder,
    resume: Callable[..., Any],
    slots: list[StackSlot],
    local_names: list[str],
    cells: dict[str, Any],
    frame: FrameVars,
) -> None:
    """Call a frame's resume function on its stack slots and locals, leaving its result."""
    cg.load_const(resume, push_null=True)
    count = 0
    for i, slot in enumerate(slots):
        if slot.kind in PASSED:
            cg.load_fast(frame.stack(i))
            count += 1
    for local in local_names:
        cg.load_fast(frame.local(local, cells))
    cg.call(count + len(local_names))


class _ReturnThroughCallers:
    """How break code returns the result of the frame that broke (on the stack): for a
    break in an inlined frame, through its callers, each continuing after its call with the
    result of the frame below, innermost first. A caller inside a try or `with` block gets
    what the frames below raise at the block's handler: each such caller's block covers
    everything from the instruction run at the break to its own call of the resume
    function after its call, and its handler calls a resume function that continues at
    the block's handler with the exception, as CPython would unwind into it."""

    def __init__(self, cg: CodeBuilder, callers: list[_Caller]) -> None:
        self.cg = cg
        self.callers = callers
        self.returned = [cg.label() for _ in callers]
        """Per caller, where the result of the frame below it arrives (on the stack)."""
        self.handlers = [cg.label() if c.site.handler is not None else None for c in callers]
        self.blocks = [
            cg.try_block(label) if label is not None else contextlib.nullcontext()
            for label in self.handlers
        ]
        for block in self.blocks:  # the outermost caller's first
            block.__enter__()

    def leave(self) -> None:
        """One way the frame that broke returns, its result on the stack."""
        if self.callers:
            self.cg.jump_forward(self.returned[-1])
        else:
            self.cg.return_value()

    def finish(self) -> None:
        cg = self.cg
        for k in reversed(range(len(self.callers))):
            caller = self.callers[k]
            self.blocks[k].__exit__(None, None, None)
            cg.place(self.returned[k])
            cg.store_fast(caller.frame.stack(len(caller.slots) - 1))
            _call_resume(
                cg, caller.resume, caller.slots, caller.names, caller.site.cells, caller.frame
            )
            self._to_outer(k)
            if self.handlers[k] is not None:
                cg.place(self.handlers[k])
                self._resume_at_handler(caller)
                self._to_outer(k)

    def _to_outer(self, k: int) -> None:
        if k:
            self.cg.jump_forward(self.returned[k - 1])
        else:
            self.cg.return_value()

    def _resume_at_handler(self, caller: _Caller) -> None:
        """The exception on the stack, into the handler's stack slot; then the caller's
        resume function at its handler (as `_resume_at_handler` does for the frame that
        broke)."""
        handler, frame = caller.site.handler, caller.frame
        at_handler = _store_caught(self.cg, handler, caller.slots, frame)
        resume = caller.site.make_resume(handler.target, at_handler, caller.names)
        _set_grad_mode(self.cg, caller.site.grad_mode_at_call)
        _call_resume(self.cg, resume, at_handler, caller.names, caller.site.cells, frame)


def _store_caught(
    cg: CodeBuilder, handler: Handler, slots: list[StackSlot], frame: FrameVars
) -> list[StackSlot]:
    """The exception on the stack (and, for a handler that takes it, a raising offset)
    into the slots above the stack the handler keeps; returns the handler's stack slots."""
    cg.store_fast(frame.stack(handler.depth + handler.lasti))
    if handler.lasti:
        cg.load_const(0)
        cg.store_fast(frame.stack(handler.depth))
    return [*slots[: handler.depth], *[StackSlot(Slot.VALUE)] * (1 + handler.lasti)]


@dataclasses.dataclass
class _Caller:
    site: CallerSite
    frame: FrameVars
    slots: list[StackSlot]
    names: list[str]
    resume: Callable[..., Any]


def _store_frame(em: Emitter, site: CallerSite | BreakSite, frame: FrameVars) -> list[str]:
    """Rebuild an inlined frame's cells and locals into its variables (before the replay,
    which cannot reach them); returns the local names its resume functions take."""
    for name, cell in site.cells.items():
        em.load_cell(cell)
        em.cg.store_fast(frame.local(name, site.cells))
    for name, value in site.locals.items():
        em.reconstruct(value)
        em.cg.store_fast(frame.local(name, site.cells))
    return list(site.locals) + site.untouched_args + list(site.cells)


def _store_stack(
    em: Emitter,
    stack: list[Value],
    slots: list[StackSlot],
    frame: FrameVars,
    site: BreakSite,
    base: int,
    callee_at: int = -1,
) -> None:
    """Rebuild a frame's stack slots into its variables; from `base` on, the operands of
    the instruction run at the break (its callee goes through ember again)."""
    for i, value in enumerate(stack):
        kind = slots[i].kind
        if i == callee_at and kind is not Slot.NULL:
            _reconstruct_callee(em, value, site)
        elif kind is Slot.ITERATOR and _made_again(value):
            em.reconstruct(value)  # a lazy iterator not settled (frame.py): GET_ITER keeps it
        elif kind is Slot.ITERATOR:
            em.reconstruct(TupleValue(value.items[value.position :]))
        elif kind is Slot.METHOD:
            em.reconstruct(value.receiver)
        elif kind is Slot.HANDLING:
            em.reconstruct(value.handled)
        elif kind is Slot.VALUE:
            em.reconstruct(value)
        else:
            continue
        em.cg.store_fast(frame.stack(i))


def _rebuild_callers(em: Emitter, site: BreakSite) -> list[_Caller]:
    """The callers' stacks, and the cells and locals of those inlined into the compiled
    function, rebuilt into their variables; their resume functions."""
    callers = []
    for depth, caller in enumerate(site.callers):
        frame = FrameVars(depth)
        slots = [_slot(v) for v in caller.stack]
        _store_stack(em, caller.stack, slots, frame, site, len(slots))
        if depth:
            names = _store_frame(em, caller, frame)
        else:
            names = list(caller.locals) + caller.untouched_args + list(caller.cells)
        slots.append(StackSlot(Slot.VALUE))  # the call's result
        resume = caller.make_resume(caller.after, slots, names)
        callers.append(_Caller(caller, frame, slots, names, resume))
    return callers


def _store_root_locals(em: Emitter, site: CallerSite | BreakSite) -> None:
    """The compiled function's own cells and locals: rebuilt before the replay, which may
    change what they read (`old = v.data; v.data = ...`), and stored in the frame's own
    variables after it, through temps (the replay may reach objects through them)."""
    for name, cell in site.cells.items():
        em.load_cell(cell)
        em.cg.store_fast(cell_temp(name))
    for j, value in enumerate(site.locals.values()):
        em.reconstruct(value)
        em.cg.store_fast(f"___local_tmp{j}")


def _restore_root_locals(cg: CodeBuilder, site: CallerSite | BreakSite) -> None:
    for j, name in enumerate(site.locals):
        cg.load_fast(f"___local_tmp{j}")
        cg.store_fast(name)


def build_break_replacement(
    template: types.CodeType,
    compiled_name: str | None,
    harvest: Harvest,
    effects: SideEffects,
    site: BreakSite,
) -> types.CodeType:
    """Replacement code for a capture that stopped at an unsupported instruction: run the
    graph, replay the ledger, restore the frame, run that instruction in CPython, then
    return the result of the resume function that continues after it (and, for a break in
    an inlined frame, of its callers' resume functions after their calls)."""
    cg = CodeBuilder(template)
    em = Emitter(cg, harvest)
    em.site = site
    _read_symbols(cg, harvest)
    _call_graph(cg, compiled_name, harvest)
    _set_grad_mode(cg, site.grad_mode)
    stack, inst, frame = site.stack, site.inst, site.frame
    slots = [_slot(v) for v in stack]
    if inst.op is Op.FOR_ITER:
        pops, pushes = 1, 0
    else:
        pops, pushes = operands(inst) if can_resume_after(inst) else (0, 0)
    base = len(stack) - pops
    callee_at = -1
    if inst.op in _CALLS:  # [NULL, callable], [callable, NULL] or [function, self]; args
        callee_at = base + 1 if isinstance(stack[base], NullValue) else base
    for i in range(base, len(stack)):  # what CPython consumes is passed whole
        if slots[i].kind is Slot.METHOD:
            slots[i] = StackSlot(Slot.VALUE)
    _store_stack(em, stack, slots, frame, site, base, callee_at)
    # Everything the frames hold is rebuilt before the replay (it may read state the replay
    # changes)
    root = site.callers[0] if site.callers else site
    _store_root_locals(em, root)
    callers = _rebuild_callers(em, site)
    local_names = _store_frame(em, site, frame) if site.callers else None
    effects.replay(em)
    _restore_root_locals(cg, root)
    if local_names is None:
        local_names = list(site.locals) + site.untouched_args + list(site.cells)
    # the resume function is called in the mode the frame was entered in (see make_resume)
    entry_mode = None if site.grad_mode is None else not site.grad_mode
    after_mode = site.grad_mode  # what the resume function's prologue sets
    if site.instruction_sets_grad_mode:
        entry_mode = after_mode = None
    ret = _ReturnThroughCallers(cg, callers)
    handler = cg.label()
    guarded = cg.try_block(handler) if site.handler is not None else contextlib.nullcontext()
    if inst.op in _JUMP_CONDITIONS or inst.op is Op.FOR_ITER:
        _set_grad_mode(cg, entry_mode)
        handled = handle_again(cg, slots, base, frame)
        other = cg.label()
        with guarded:  # the truth of a tensor, or the pull, may raise
            ways = _branch(cg, inst, slots, frame, other)
        for n, (target, rest) in enumerate(ways):
            if n:
                cg.place(other)
            stop_handling(cg, handled)
            resume = site.make_resume(target, rest, local_names, site.grad_mode)
            _call_resume(cg, resume, rest, local_names, site.cells, frame)
            ret.leave()
        _resume_at_handler(cg, site, handler, slots, local_names, entry_mode, handled, ret)
        ret.finish()
        return cg.to_code()
    if not can_resume_after(inst):
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPCODE,
            f"a graph break at {inst.opname} cannot be resumed",
            hint="the function runs eagerly",
        )
    kw_names = site.kw_names
    pushed_back = len(stack)
    if inst.op is Op.CALL_KW:  # the names are the top slot, which `call` loads itself
        kw_names = stack[-1].as_constant()
        pushed_back -= 1
    handled = handle_again(cg, slots, base, frame)
    with guarded:  # from its operands on: 3.13 finds the handler of a failed call there
        if inst.op is Op.LOAD_SUPER_ATTR:  # [super, class, object]: the lookup, as a call
            cg.load_const(super_attribute, push_null=True)
            cg.load_fast(frame.stack(base + 1))
            cg.load_fast(frame.stack(base + 2))
            cg.load_const(inst.argval)
            cg.call(3)
        else:
            for i in range(base, pushed_back):
                if slots[i].kind is Slot.NULL:
                    cg.push_null()
                else:
                    cg.load_fast(frame.stack(i))
                    if slots[i].kind is Slot.ITERATOR:
                        cg.get_iter()
            _emit_unsupported(cg, inst, kw_names)
    results = _results(inst, pushes)
    for i in reversed(range(pushes)):
        if results[i].kind is Slot.VALUE:
            cg.store_fast(frame.stack(base + i))
    rest = [*slots[:base], *results]
    if inst.op is Op.CHECK_EG_MATCH and handled:
        handle_match(cg, slots, base, frame)
    stop_handling(cg, handled)
    _set_grad_mode(cg, entry_mode)
    resume = site.make_resume(inst.index + 1, rest, local_names, after_mode)
    _call_resume(cg, resume, rest, local_names, site.cells, frame)
    ret.leave()
    _resume_at_handler(cg, site, handler, slots, local_names, entry_mode, handled, ret)
    ret.finish()
    return cg.to_code()


_EXHAUSTED = object()
"""What `next(iterator, _EXHAUSTED)` returns at the end (break code at FOR_ITER)."""


def _branch(
    cg: CodeBuilder, inst: Inst, slots: list[StackSlot], frame: FrameVars, other: Any
) -> list[tuple[int, list[StackSlot]]]:
    """A jump run at a break: emit its test, jumping to `other` for the second way; return
    where each way continues and with which stack. For a jump on a value, after it or at
    its target. For FOR_ITER (a pull whose callback breaks: a map's function that prints),
    `next(iterator, _EXHAUSTED)` into the slot above the iterator: the loop's body with
    the iterator and the item, or past the loop without the iterator."""
    top = len(slots) - 1
    if inst.op is not Op.FOR_ITER:
        cg.load_fast(frame.stack(top))
        cg.pop_jump_if(_JUMP_CONDITIONS[inst.op], other)
        return [(inst.index + 1, slots[:-1]), (inst.target, slots[:-1])]
    cg.load_const(iter, push_null=True)  # the items left (a tuple), or the iterator itself
    cg.load_fast(frame.stack(top))
    cg.call(1)
    cg.store_fast(frame.stack(top))
    cg.load_const(next, push_null=True)
    cg.load_fast(frame.stack(top))
    cg.load_const(_EXHAUSTED)
    cg.call(2)
    cg.copy(1)
    cg.store_fast(frame.stack(top + 1))
    cg.load_const(_EXHAUSTED)
    cg.emit("IS_OP", 0)
    cg.pop_jump_if("TRUE", other)
    item = [*slots[:-1], StackSlot(Slot.ITERATOR), StackSlot(Slot.VALUE)]
    return [(inst.index + 1, item), (inst.target, slots[:-1])]


def super_attribute(cls: type, obj: Any, name: str) -> Any:
    """What LOAD_SUPER_ATTR (3.12+) finds, run by break code: `super(cls, obj).name`."""
    return getattr(super(cls, obj), name)


def _results(inst: Inst, pushes: int) -> list[StackSlot]:
    """The slots the instruction run at the break leaves: values, but for LOAD_METHOD (of
    an attribute that could not be traced: a property's getter that breaks) and the method
    form of LOAD_SUPER_ATTR the bound method and the NULL of the call it is for."""
    if inst.op is Op.LOAD_METHOD or inst.op is Op.LOAD_SUPER_ATTR and inst.push_null:
        return list(with_null(StackSlot(Slot.VALUE), StackSlot(Slot.NULL)))
    return [StackSlot(Slot.VALUE)] * pushes


def _resume_at_handler(
    cg: CodeBuilder,
    site: BreakSite,
    label: Any,
    slots: list[StackSlot],
    local_names: list[str],
    entry_mode: bool | None,
    handled: bool,
    ret: _ReturnThroughCallers,
) -> None:
    """Where the instruction run at the break raises inside a try or `with` block: the
    exception goes to a resume function that continues at the block's handler, with the
    stack the handler keeps, (the raising offset,) and the exception, as CPython would
    jump there. The offset is only read back by a RERAISE to set the frame's line, so the
    first instruction's stands for it."""
    if site.handler is None:
        return
    frame = site.frame
    cg.place(label)
    at_handler = _store_caught(cg, site.handler, slots, frame)
    stop_handling(cg, handled)
    _set_grad_mode(cg, entry_mode)
    resume = site.make_resume(site.handler.target, at_handler, local_names, site.grad_mode)
    _call_resume(cg, resume, at_handler, local_names, site.cells, frame)
    ret.leave()


_CALLS = (Op.CALL, Op.CALL_KW, Op.CALL_FUNCTION_EX)
_REPLAYABLE = frozenset(
    {
        Op.BINARY_SUBSCR,
        Op.BINARY_OP,
        Op.COMPARE_OP,
        Op.IS_OP,
        Op.CONTAINS_OP,
        Op.UNARY_NEGATIVE,
        Op.UNARY_INVERT,
        Op.UNARY_NOT,
        Op.LOAD_ATTR,
        Op.LOAD_METHOD,
        Op.LOAD_SUPER_ATTR,
        Op.STORE_ATTR,
        Op.DELETE_ATTR,
        Op.STORE_SUBSCR,
        Op.DELETE_SUBSCR,
        Op.BEFORE_WITH,
        Op.CHECK_EG_MATCH,
        Op.PREP_RERAISE_STAR,
        Op.CALL_INTRINSIC_2,
        Op.FORMAT_VALUE,
        Op.FORMAT_SIMPLE,
        Op.FORMAT_WITH_SPEC,
        Op.CONVERT_VALUE,
    }
)
"""Instructions other than calls that break code can run in CPython as they are
(`x[mask]`, `t.grad`, `del obj.attr` break here; BEFORE_WITH where the `__exit__` of a
context manager could not be rebuilt later in the block; an `except*` clause's matching and
re-raising of exception groups; an f-string's formatting of a tensor)."""


class _Probe(Emitter):
    """An emitter that only finds out whether values can be rebuilt (tensors count as
    rebuildable: they become graph outputs)."""

    def load_tensor(self, value: TensorValue) -> None:
        pass


def can_rebuild(template: types.CodeType, value: Value) -> bool:
    """Whether break code could rebuild `value` (a `with` block's `__exit__`)."""
    try:
        _Probe(CodeBuilder(template), Harvest(None, [], {})).reconstruct(value)  # no graph
    except Unsupported:
        return False
    return True


def can_resume_after(inst: Inst) -> bool:
    """Whether break code can run this instruction in CPython and resume after it."""
    return (
        inst.op in _CALLS
        or inst.op in _REPLAYABLE
        or inst.op in _JUMP_CONDITIONS
        or inst.op is Op.FOR_ITER
    )


def _emit_unsupported(cg: CodeBuilder, inst: Inst, kw_names: tuple[str, ...]) -> None:
    """The instruction that broke the capture, for CPython to run on the rebuilt stack."""
    if inst.op in (Op.CALL, Op.CALL_KW):
        cg.call(inst.arg, kw_names)
    elif inst.op is Op.CALL_FUNCTION_EX:
        cg.call_ex(bool(inst.arg & 1))
    elif inst.op is Op.LOAD_METHOD:  # the bound method; its NULL is pushed back by position
        cg.load_attr(inst.argval)
    else:
        cg.replay(inst)
