"""Analyses of a code object: its exception table, control flow, live locals, stack depth.

All of them work on decoded instructions (`decode.py`), so they read every version the same
way: successors are the next instruction (unless the instruction ends the flow), the jump
target and the handlers of the exception-table entries that cover the instruction.
"""

from __future__ import annotations

import dataclasses
import types
import weakref
from inspect import CO_ASYNC_GENERATOR, CO_COROUTINE, CO_GENERATOR

from ember.bytecode.decode import Inst, decode
from ember.bytecode.dialect import THIS
from ember.bytecode.ops import Op
from ember.bytecode.stack import stack_effect


@dataclasses.dataclass(frozen=True, slots=True)
class ExceptionEntry:
    """One entry of `co_exceptiontable`, in byte offsets (as `dis` reports them)."""

    start: int
    end: int
    """Offset just past the last instruction covered."""
    target: int
    """Offset of the handler."""
    depth: int
    """Stack depth the handler starts from, below the exception (and `lasti`)."""
    lasti: bool
    """Whether the offset of the raising instruction is pushed too."""


def _varint(table: bytes, i: int) -> tuple[int, int]:
    """One value of the exception table: 6-bit groups, most significant first, bit 6 set
    on all but the last (bit 7 marks an entry's first byte)."""
    byte = table[i]
    value = byte & 63
    while byte & 64:
        i += 1
        byte = table[i]
        value = (value << 6) | (byte & 63)
    return value, i + 1


def exception_table(code: types.CodeType) -> list[ExceptionEntry]:
    """The entries of `code`'s exception table, in table order."""
    table = code.co_exceptiontable
    entries = []
    i = 0
    while i < len(table):
        start, i = _varint(table, i)
        length, i = _varint(table, i)
        target, i = _varint(table, i)
        depth_lasti, i = _varint(table, i)
        entries.append(
            ExceptionEntry(
                2 * start, 2 * (start + length), 2 * target, depth_lasti >> 1, bool(depth_lasti & 1)
            )
        )
    return entries


_handlers: weakref.WeakKeyDictionary[types.CodeType, dict[int, ExceptionEntry]] = (
    weakref.WeakKeyDictionary()
)


def handler_at(code: types.CodeType, offset: int) -> ExceptionEntry | None:
    """The exception-table entry that covers the instruction at `offset` (where an
    exception raised there goes), or None when it leaves the frame. Entries do not overlap,
    so the first that covers the offset is the one."""
    table = _handlers.get(code)
    if table is None:
        table = _handlers[code] = {}
        entries = sorted(exception_table(code), key=lambda e: e.start)
        at = 0
        for inst in decode(code):
            while at < len(entries) and entries[at].end <= inst.offset:
                at += 1
            if at < len(entries) and entries[at].start <= inst.offset:
                table[inst.offset] = entries[at]
    return table.get(offset)


def _write_varint(out: bytearray, value: int, first: bool) -> None:
    groups = [value & 63]
    value >>= 6
    while value:
        groups.append((value & 63) | 64)
        value >>= 6
    groups.reverse()
    if first:
        groups[0] |= 128
    out.extend(groups)


def encode_exception_table(entries: list[ExceptionEntry]) -> bytes:
    """`co_exceptiontable` for these entries (the inverse of `exception_table`)."""
    out = bytearray()
    for e in entries:
        _write_varint(out, e.start // 2, first=True)
        _write_varint(out, (e.end - e.start) // 2, first=False)
        _write_varint(out, e.target // 2, first=False)
        _write_varint(out, (e.depth << 1) | e.lasti, first=False)
    return bytes(out)


def enclosing_blocks(code: types.CodeType, inst: Inst) -> list[bool]:
    """The try/with blocks around an instruction, innermost first: True for a `with` block.

    The exception table maps an instruction to its innermost handler only; the handler's own
    code is covered by a cleanup entry, and the cleanup by the next enclosing block's handler,
    so the chain of targets visits every enclosing block once."""
    entries = exception_table(code)
    insts = decode(code)
    index = {i.offset: i.index for i in insts}
    blocks: list[bool] = []
    offset = inst.offset
    for _ in range(len(entries) + 1):
        entry = next((e for e in entries if e.start <= offset < e.end), None)
        if entry is None:
            break
        at = index[entry.target]
        if insts[at].opname == "PUSH_EXC_INFO":
            blocks.append(insts[at + 1].opname == "WITH_EXCEPT_START")
        offset = entry.target
    return blocks


_ENDS_FLOW = {
    "JUMP_FORWARD",
    "JUMP_BACKWARD",
    "JUMP_BACKWARD_NO_INTERRUPT",
    "RETURN_VALUE",
    "RETURN_CONST",
    "RAISE_VARARGS",
    "RERAISE",
}


def _jump_index(inst: Inst, index: dict[int, int]) -> int | None:
    """The instruction a jump goes to (FOR_ITER and SEND: the instruction `dis` names, not
    the one `Inst.target` continues at)."""
    return None if inst.target is None else index[inst.argval]


def successors(code: types.CodeType) -> list[list[int]]:
    """For each instruction, the indices of the instructions that may run next."""
    insts = decode(code)
    index = {i.offset: i.index for i in insts}
    handlers = [(e.start, e.end, index[e.target]) for e in exception_table(code)]
    out = []
    for inst in insts:
        nxt = [] if inst.opname in _ENDS_FLOW or inst.index + 1 == len(insts) else [inst.index + 1]
        jump = _jump_index(inst, index)
        if jump is not None:
            nxt.append(jump)
        nxt += [target for start, end, target in handlers if start <= inst.offset < end]
        out.append(nxt)
    return out


_READS = {Op.LOAD_FAST, Op.LOAD_FAST_AND_CLEAR, Op.MAKE_CELL}
_WRITES = {Op.STORE_FAST, Op.DELETE_FAST}


def _uses_and_defs(inst: Inst) -> tuple[set[str], set[str]]:
    """Locals read before being written, and locals written, by one instruction."""
    op = inst.op
    if op in _READS:
        return {inst.argval}, set()
    if op in _WRITES:
        return set(), {inst.argval}
    if op is Op.LOAD_FAST_LOAD_FAST:
        return set(inst.argval), set()
    if op is Op.STORE_FAST_STORE_FAST:
        return set(), set(inst.argval)
    if op is Op.STORE_FAST_LOAD_FAST:
        stored, loaded = inst.argval
        return ({loaded} - {stored}), {stored}
    return set(), set()


_live: weakref.WeakKeyDictionary[types.CodeType, dict[int, frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)


def live_locals(code: types.CodeType, offset: int) -> frozenset[str]:
    """The fast locals that may be read, before being assigned, from the instruction at
    `offset` on (exception handlers count as successors). Only these travel to a resume
    function: a dead local would cost a guard, and a dead tensor a graph output."""
    table = _live.get(code)
    if table is None:
        table = _live[code] = _liveness(code)
    return table.get(offset, frozenset(code.co_varnames))


def _liveness(code: types.CodeType) -> dict[int, frozenset[str]]:
    insts = decode(code)
    succs = successors(code)
    uses, defs = zip(*map(_uses_and_defs, insts)) if insts else ((), ())
    live: list[set[str]] = [set() for _ in insts]
    changed = True
    while changed:
        changed = False
        for n in reversed(range(len(insts))):
            out: set[str] = set()
            for m in succs[n]:
                out |= live[m]
            new = uses[n] | (out - defs[n])
            if new != live[n]:
                live[n] = new
                changed = True
    return {inst.offset: frozenset(live[n]) for n, inst in enumerate(insts)}


@dataclasses.dataclass(frozen=True, slots=True)
class StackDepth:
    highest: int
    """`co_stacksize` as the compiler computes it from the reachable code."""
    unreachable: int
    """Instructions no path reaches (dead code CPython kept in the table; the compiler
    sized the frame before it knew they are dead, so `co_stacksize` may be larger)."""


def stack_depth(code: types.CodeType) -> StackDepth:
    """The deepest the value stack gets: each instruction's effect along both of its edges;
    a handler starts at its entry's depth plus the exception (and the offset, for
    `lasti`); a generator at the dialect's start depth."""
    insts = decode(code)
    index = {i.offset: i.index for i in insts}
    depths: list[int | None] = [None] * len(insts)
    generator = code.co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)
    pending = [(0, THIS.generator_start_depth if generator else 0)]
    for e in exception_table(code):
        pending.append((index[e.target], e.depth + 1 + e.lasti))
    highest = THIS.min_stack_size
    while pending:
        at, depth = pending.pop()
        highest = max(highest, depth)
        while at < len(insts) and depths[at] is None:
            depths[at] = depth
            inst = insts[at]
            if inst.target is not None:
                taken = depth + stack_effect(inst, jump=True)
                highest = max(highest, taken)
                pending.append((index[inst.argval], taken))  # not FOR_ITER's skip
            depth += stack_effect(inst)
            highest = max(highest, depth)
            if inst.opname in _ENDS_FLOW:
                break
            at += 1
    return StackDepth(highest, depths.count(None))
