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
from the exception table (`enclosing_blocks`).
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import inspect
import types
import weakref
from collections.abc import Callable

import torch
from bytecode import Bytecode, Instr, Label, TryBegin

from ember.bytecode import PY312, Inst
from ember.errors import BreakReason, Unsupported


class Slot(enum.Enum):
    """How a stack slot travels into a resume function."""

    VALUE = "passed as a parameter"
    NULL = "the NULL of the call convention, pushed back by the prologue"
    ITERATOR = "the remaining items of a loop's iterator, passed as a tuple and re-iterated"
    METHOD = "a method: its receiver is passed and the prologue looks the method up again"


@dataclasses.dataclass(frozen=True, slots=True)
class StackSlot:
    """One stack slot at a break: how it travels, and for METHOD the attribute name.

    A method travels as its receiver so that the resume function sees `receiver.name` with a
    source (a bound method passed as an object would be guarded by identity, and a fresh
    `lst.append` is a new object on every call)."""

    kind: Slot
    attr: str = ""


def enclosing_blocks(code: types.CodeType, inst: Inst) -> list[bool]:
    """The try/with blocks around an instruction, innermost first: True for a `with` block.

    The exception table maps an instruction to its innermost handler only; the handler's own
    code is covered by a cleanup entry, and the cleanup by the next enclosing block's handler,
    so the chain of targets visits every enclosing block once."""
    entries = dis.Bytecode(code).exception_entries
    instrs = list(dis.get_instructions(code))
    index = {ins.offset: n for n, ins in enumerate(instrs)}
    blocks: list[bool] = []
    offset = inst.offset
    for _ in range(len(entries) + 1):
        entry = next((e for e in entries if e.start <= offset < e.end), None)
        if entry is None:
            break
        at = index[entry.target]
        if instrs[at].opname == "PUSH_EXC_INFO":
            blocks.append(instrs[at + 1].opname == "WITH_EXCEPT_START")
        offset = entry.target
    return blocks


_UNCONDITIONAL = {
    "JUMP_FORWARD",
    "JUMP_BACKWARD",
    "JUMP_BACKWARD_NO_INTERRUPT",
    "RETURN_VALUE",
    "RETURN_CONST",
    "RAISE_VARARGS",
    "RERAISE",
}
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)
_live_cache: weakref.WeakKeyDictionary[types.CodeType, dict[int, frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)


def live_locals(code: types.CodeType, offset: int) -> frozenset[str]:
    """The fast locals that may be read, before being assigned, from the instruction at
    `offset` on (exception handlers count as successors). Only these travel to a resume
    function: a dead local would cost a guard, and a dead tensor a graph output."""
    table = _live_cache.get(code)
    if table is None:
        table = _live_cache[code] = _liveness(code)
    return table.get(offset, frozenset(code.co_varnames))


def _liveness(code: types.CodeType) -> dict[int, frozenset[str]]:
    instrs = list(dis.get_instructions(code))
    index = {ins.offset: n for n, ins in enumerate(instrs)}
    handlers = dis.Bytecode(code).exception_entries
    succs: list[list[int]] = []
    uses: list[set[str]] = []
    defs: list[set[str]] = []
    for n, ins in enumerate(instrs):
        nxt = [] if ins.opname in _UNCONDITIONAL or n + 1 == len(instrs) else [n + 1]
        if ins.opcode in _JUMPS and ins.argval in index:
            nxt.append(index[ins.argval])
        nxt += [index[e.target] for e in handlers if e.start <= ins.offset < e.end]
        succs.append(nxt)
        name = ins.argval if isinstance(ins.argval, str) else None
        reads = ins.opname.startswith("LOAD_FAST") or ins.opname == "MAKE_CELL"
        uses.append({name} if reads and name else set())
        writes = ins.opname in ("STORE_FAST", "DELETE_FAST")
        defs.append({name} if writes and name else set())
    live: list[set[str]] = [set() for _ in instrs]
    changed = True
    while changed:
        changed = False
        for n in reversed(range(len(instrs))):
            out: set[str] = set()
            for m in succs[n]:
                out |= live[m]
            new = uses[n] | (out - defs[n])
            if new != live[n]:
                live[n] = new
                changed = True
    return {ins.offset: frozenset(live[n]) for n, ins in enumerate(instrs)}


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


def make_resume_function(
    fn: types.FunctionType,
    target: int,
    slots: list[StackSlot],
    local_names: list[str],
    insts: list[Inst],
    grad_mode: bool | None = None,
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
    cells = tuple(map(id, fn.__closure__ or ()))  # the made function keeps them alive
    key = (code, ordinal, tuple(slots), tuple(local_names), cells, id(fn.__globals__), grad_mode)
    made = _made.get(key)
    if made is None:
        offset = insts[target].offset
        made = _made[key] = _build(fn, code, ordinal, slots, local_names, offset, grad_mode)
    return made


def _keep_handler_depths(code: types.CodeType, entries: list) -> None:
    """Give the copied try blocks the stack depths of the original exception table (the
    `bytecode` package recomputes them from the entry, which in a resume function jumps into
    the middle of the code and yields nonsense)."""
    table = dis.Bytecode(code).exception_entries
    blocks = [e for e in entries if isinstance(e, TryBegin)]
    if len(blocks) != len(table):
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPCODE,
            "the exception table of this function cannot be copied into a resume function",
        )
    for block, entry in zip(blocks, table):
        block.stack_depth = entry.depth
        block.push_lasti = entry.lasti


def _build(
    fn: types.FunctionType,
    code: types.CodeType,
    ordinal: int,
    slots: list[StackSlot],
    local_names: list[str],
    offset: int,
    grad_mode: bool | None = None,
) -> types.FunctionType:
    """Copy `code`, with a prologue that pushes the stack slots back and jumps to the
    instruction of the given ordinal. Cell variables stay cells: live ones arrive as
    parameters, which the copied MAKE_CELL instructions turn into fresh cells."""
    original = Bytecode.from_code(code)
    entries = list(original)
    _keep_handler_depths(code, entries)
    body_start = next(
        n + 1 for n, e in enumerate(entries) if isinstance(e, Instr) and e.name == "RESUME"
    )
    label = Label()
    seen = 0
    for position, entry in enumerate(entries):
        if isinstance(entry, Instr):
            if seen == ordinal:
                entries.insert(position, label)
                break
            seen += 1
    stack_names = [stack_param(i) for i, slot in enumerate(slots) if slot.kind is not Slot.NULL]
    prologue = [e for e in entries[:body_start] if isinstance(e, Instr)]
    copied_head = len(prologue)
    params = [
        name if name.isidentifier() else f"___local_{i}" for i, name in enumerate(local_names)
    ]
    for param, name in zip(params, local_names):
        if param != name:  # `@py_assert1` (pytest's rewritten asserts) cannot be a parameter
            prologue += [Instr("LOAD_FAST", param), Instr("STORE_FAST", name)]
    if grad_mode is not None:  # torch.set_grad_enabled(mode) as a statement
        prologue += [
            Instr("PUSH_NULL"),
            Instr("LOAD_CONST", torch.set_grad_enabled),
            Instr("LOAD_CONST", grad_mode),
            *([] if PY312 else [Instr("PRECALL", 1)]),
            Instr("CALL", 1),
            Instr("POP_TOP"),
        ]
    for i, slot in enumerate(slots):
        if slot.kind is Slot.NULL:
            prologue.append(Instr("PUSH_NULL"))
            continue
        prologue.append(Instr("LOAD_FAST", stack_param(i)))
        if slot.kind is Slot.ITERATOR:
            prologue.append(Instr("GET_ITER"))
        elif slot.kind is Slot.METHOD:
            prologue.append(Instr("LOAD_ATTR", (False, slot.attr) if PY312 else slot.attr))
    prologue.append(Instr("JUMP_FORWARD", label))
    resume = Bytecode(prologue + entries[body_start:])
    resume.name = f"__resume_{code.co_name}_at_{offset}"
    resume.qualname = resume.name
    resume.filename = code.co_filename
    resume.first_lineno = code.co_firstlineno
    resume.freevars = list(code.co_freevars)
    resume.cellvars = list(code.co_cellvars)
    resume.flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    resume.argcount = len(stack_names) + len(local_names)
    resume.posonlyargcount = 0
    resume.kwonlyargcount = 0
    resume.argnames = stack_names + params
    # the copied try blocks keep their original depths (the prologue rebuilds that stack;
    # recomputing them from the jump into the middle of the code gives nonsense)
    new_code = resume.to_code(compute_exception_stack_depths=False)
    _origins[new_code] = _Origin(code, copied_head - len(prologue), len(prologue))
    return types.FunctionType(new_code, fn.__globals__, new_code.co_name, None, fn.__closure__)
