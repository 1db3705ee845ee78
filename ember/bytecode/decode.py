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
import opcode
import types
import weakref
from typing import Any, NamedTuple

from ember.bytecode.dialect import THIS
from ember.bytecode.ops import UNSUPPORTED, Op, op_for


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


# How each opcode's argument becomes `argval` (what `dis` reports as `Instruction.argval`).
_PLAIN, _CONST, _NAME, _NAME_SHR1, _NAME_SHR2, _JABS, _JFWD, _JBACK = range(8)
_LOCAL, _LOCAL_PAIR, _COMPARE, _FORMAT, _CONVERT = range(8, 13)
_PAIRS = ("LOAD_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST")


def _cache_entries() -> list[int]:
    """Inline cache entries after each opcode (3.13 keys `opcode`'s table by name)."""
    table = opcode._inline_cache_entries  # type: ignore[attr-defined]
    if isinstance(table, dict):
        return [table.get(dis.opname[code], 0) for code in range(256)]
    return [table[code] for code in range(256)]


def _kind(code: int, name: str, has_arg: set[int]) -> int | None:
    if code not in has_arg:
        return None
    if code in dis.hasconst or name == "KW_NAMES":  # 3.11's dis leaves KW_NAMES raw
        return _CONST
    if code in dis.hasname:
        if name == "LOAD_GLOBAL" or (THIS.attr_method_bit and name == "LOAD_ATTR"):
            return _NAME_SHR1
        return _NAME_SHR2 if name == "LOAD_SUPER_ATTR" else _NAME
    if code in dis.hasjabs:
        return _JABS
    if code in dis.hasjrel:
        return _JBACK if "JUMP_BACKWARD" in name else _JFWD
    if name in _PAIRS:
        return _LOCAL_PAIR
    if code in dis.haslocal or code in dis.hasfree:
        return _LOCAL
    if code in dis.hascompare:
        return _COMPARE
    if name == "FORMAT_VALUE":
        return _FORMAT
    return _CONVERT if name == "CONVERT_VALUE" else _PLAIN


def _tables() -> tuple[list[int | None], list[str], list[Op | None], list[int], list[int]]:
    """Per opcode (0-255): argument kind (None: takes no argument), name, Op, inline cache
    entries after it, and how many code units a relative jump adds beyond its argument."""
    has_arg = set(getattr(dis, "hasarg", range(dis.HAVE_ARGUMENT, 256)))
    names = [dis.opname[code] for code in range(256)]
    ops: list[Op | None] = []
    for name in names:
        try:
            ops.append(op_for(name))
        except KeyError:  # '<42>': unused opcode number, never in a code object
            ops.append(None)
    kinds = [_kind(code, names[code], has_arg) for code in range(256)]
    caches = _cache_entries()
    jump_extra = [caches[code] if THIS.jumps_skip_caches else 0 for code in range(256)]
    return kinds, names, ops, caches, jump_extra


_KINDS, _NAMES, _OPS, _CACHES, _JUMP_EXTRA = _tables()
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_INT_OVERFLOW = 2**31
_CONVERTERS = [None, str, repr, ascii]
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_FOR_ITER = dis.opmap["FOR_ITER"]
_SEND = dis.opmap["SEND"]
_SKIPS = {_FOR_ITER: THIS.for_iter_skips, _SEND: THIS.send_skips}


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
    kinds, caches = _KINDS, _CACHES
    extended = 0
    i, end = 0, len(raw)
    while i < end:
        code = raw[i]
        if kinds[code] is None:
            arg = None
            extended = 0
        else:
            arg = raw[i + 1] | extended
            extended = arg << 8 if code == _EXTENDED_ARG else 0
            if extended >= _INT_OVERFLOW:
                extended -= 2 * _INT_OVERFLOW
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
    kinds, opnames, ops, jump_extra = _KINDS, _NAMES, _OPS, _JUMP_EXTRA
    compare_shift, cast_bit = THIS.compare_shift, THIS.compare_cast_bit
    out = []
    for n, (offset, opc, arg) in enumerate(raw):
        kind = kinds[opc]
        op = ops[opc]
        argval: Any = arg
        target = None
        push_null = to_bool = False
        if kind is None or kind == _PLAIN:
            pass
        elif kind == _CONST:
            argval = consts[arg]
        elif kind == _NAME:
            argval = names[arg]
        elif kind == _NAME_SHR1:
            argval = names[arg >> 1]
            if opc == _LOAD_GLOBAL:
                push_null = bool(arg & 1)
            elif arg & 1:  # 3.12's LOAD_ATTR with the method bit
                op = Op.LOAD_METHOD
        elif kind == _NAME_SHR2:
            argval = names[arg >> 2]
            push_null = bool(arg & 1)
        elif kind == _LOCAL:
            argval = varname(arg)
        elif kind == _LOCAL_PAIR:
            argval = (varname(arg >> 4), varname(arg & 15))
        elif kind == _COMPARE:
            argval = dis.cmp_op[arg >> compare_shift]
            to_bool = bool(arg & cast_bit)
        elif kind == _FORMAT:
            argval = (_CONVERTERS[arg & 3], bool(arg & 4))
        elif kind == _CONVERT:
            argval = _CONVERTERS[arg]
        else:
            if kind == _JABS:
                argval = arg * 2
            else:
                step = -arg if kind == _JBACK else arg
                argval = offset + 2 + step * 2 + 2 * jump_extra[opc]
            target = index_of[argval] + _SKIPS.get(opc, 0)
        out.append(
            Inst(op, opnames[opc], arg, argval, offset, n, lines[n], target, push_null, to_bool)
        )
    return out
