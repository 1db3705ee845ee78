"""Decode a code object into a list of version-neutral `Inst`s.

Takes `types.CodeType`, returns `list[Inst]` with jump targets as instruction indices and the
per-version quirks folded in (the method bit of LOAD_ATTR, the NULL bit of LOAD_GLOBAL, the
bool bit of COMPARE_OP, where an exhausted FOR_ITER or SEND continues).

The decoder reads `co_code` itself, with per-opcode tables built once from `dis`/`opcode`,
instead of going through `dis.get_instructions`: that builds a `Positions`, an argument repr
(`repr` of every constant) and an `Instruction` per instruction, and was 15-25% of a GPT-2
capture. `tests/bytecode/test_decode.py` checks it field by field against `dis`, and
`tests/bytecode/test_roundtrip.py` re-encodes what it decodes over the whole standard library
and torch.
"""

from __future__ import annotations

import dis
import types
import weakref
from typing import Any, NamedTuple

from ember.bytecode.dialect import THIS
from ember.bytecode.ops import UNSUPPORTED, Op
from ember.bytecode.tables import (
    CACHES,
    COMPARE,
    CONST,
    CONVERT,
    CONVERTERS,
    EXTENDED_ARG,
    FORMAT,
    JABS,
    JBACK,
    JUMP_EXTRA,
    KINDS,
    LOAD_GLOBAL,
    LOCAL,
    LOCAL_PAIR,
    NAME,
    NAME_SHR1,
    NAME_SHR2,
    NAMES,
    OPS,
    PLAIN,
    SKIPS,
)


class Inst(NamedTuple):
    """One instruction. A NamedTuple (immutable like the frozen dataclass it replaced, but
    built 3-4x faster: a GPT-2 capture decodes ~4,000 instructions)."""

    op: Op | None
    """None for an opcode ember does not interpret (see `opname` and ops.UNSUPPORTED)."""
    opname: str
    arg: int | None
    argval: Any
    """What `dis` reports as `Instruction.argval`: a constant, a name, a pair of local names
    (3.13's LOAD_FAST_LOAD_FAST and kin), a comparison ('<'), a jump's target offset."""
    offset: int
    index: int
    line: int | None
    target: int | None = None
    """Index of the jump target (for FOR_ITER and SEND: where to continue once exhausted,
    with the iterator or receiver popped)."""
    push_null: bool = False
    """LOAD_GLOBAL / LOAD_SUPER_ATTR also push the NULL of a call (see `with_null`)."""
    to_bool: bool = False
    """COMPARE_OP converts its result to bool (3.13, before a conditional jump)."""

    @property
    def unsupported_reason(self) -> str:
        return UNSUPPORTED.get(self.opname, "")


_decoded: weakref.WeakKeyDictionary[types.CodeType, tuple[Inst, ...]] = weakref.WeakKeyDictionary()
"""Decoded code objects. A capture inlines the same functions many times (every Linear's
forward, a config's `__getattribute__` on each attribute read): decoding was ~40% of a GPT-2
capture before this cache. Insts are immutable, so sharing them is safe."""


def decode(code: types.CodeType) -> list[Inst]:
    """All instructions of `code`, in order (a fresh list; the Insts are shared)."""
    cached = _decoded.get(code)
    if cached is None:
        cached = _decoded[code] = tuple(_decode(code))
    return list(cached)


def unpack(raw: bytes) -> list[tuple[int, int, int | None]]:
    """(offset, opcode, argument) per instruction, inline caches skipped, EXTENDED_ARG kept
    as its own instruction whose argument is folded into the next one (as `dis` does)."""
    out = []
    kinds, caches = KINDS, CACHES
    extended = 0
    i, end = 0, len(raw)
    while i < end:
        code = raw[i]
        if kinds[code] is None:
            arg = None
            extended = 0
        else:
            arg = raw[i + 1] | extended
            extended = arg << 8 if code == EXTENDED_ARG else 0
            if extended >= 2**31:
                extended -= 2**32
        out.append((i, code, arg))
        i += 2 + 2 * caches[code]
    return out


def _lines(code: types.CodeType, offsets: list[int]) -> list[int | None]:
    """The line of each instruction (the last known line where it has none, as the
    translator reports it). `co_lines` gives ranges, far fewer than `co_positions`' one
    entry per code unit."""
    out: list[int | None] = []
    ranges = code.co_lines()
    start, end, at = 0, -1, None
    line = code.co_firstlineno
    for offset in offsets:
        while offset >= end:
            start, end, at = next(ranges)
        if at is not None and offset >= start:
            line = at
        out.append(line)
    return out


def _decode(code: types.CodeType) -> list[Inst]:
    raw = unpack(code.co_code)
    index_of = {offset: n for n, (offset, _, _) in enumerate(raw)}
    lines = _lines(code, list(index_of))
    consts, names = code.co_consts, code.co_names
    varname = code._varname_from_oparg  # type: ignore[attr-defined]
    kinds, opnames, ops, jump_extra = KINDS, NAMES, OPS, JUMP_EXTRA
    compare_shift, cast_bit = THIS.compare_shift, THIS.compare_cast_bit
    new = tuple.__new__  # skips the NamedTuple __new__ (keyword handling): decoding 1.16x faster
    out = []
    for n, (offset, opc, arg) in enumerate(raw):
        kind = kinds[opc]
        op = ops[opc]
        argval: Any = arg
        target = None
        push_null = to_bool = False
        if kind is None or kind == PLAIN:
            pass
        elif kind == CONST:
            argval = consts[arg]
        elif kind == NAME:
            argval = names[arg]
        elif kind == NAME_SHR1:
            argval = names[arg >> 1]
            if opc == LOAD_GLOBAL:
                push_null = bool(arg & 1)
            elif arg & 1:  # 3.12's LOAD_ATTR with the method bit
                op = Op.LOAD_METHOD
        elif kind == NAME_SHR2:
            argval = names[arg >> 2]
            push_null = bool(arg & 1)
        elif kind == LOCAL:
            argval = varname(arg)
        elif kind == LOCAL_PAIR:
            argval = (varname(arg >> 4), varname(arg & 15))
        elif kind == COMPARE:
            argval = dis.cmp_op[arg >> compare_shift]
            to_bool = bool(arg & cast_bit)
        elif kind == FORMAT:
            argval = (CONVERTERS[arg & 3], bool(arg & 4))
        elif kind == CONVERT:
            argval = CONVERTERS[arg]
        else:
            if kind == JABS:
                argval = arg * 2
            else:
                step = -arg if kind == JBACK else arg
                argval = offset + 2 + step * 2 + 2 * jump_extra[opc]
            target = index_of[argval] + SKIPS.get(opc, 0)
        out.append(
            new(
                Inst,
                (op, opnames[opc], arg, argval, offset, n, lines[n], target, push_null, to_bool),
            )
        )
    return out
