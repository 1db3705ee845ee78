"""Decode a code object into a list of version-neutral `Inst`s.

Takes `types.CodeType`, returns `list[Inst]` with jump targets as instruction indices and the
per-version quirks folded in (the method bit of LOAD_ATTR, the NULL bit of LOAD_GLOBAL, where an
exhausted FOR_ITER continues).

The decoder reads `co_code` itself, with per-opcode tables built once from `dis`/`opcode`,
instead of going through `dis.get_instructions`: that builds a `Positions`, an argument repr
(`repr` of every constant) and an `Instruction` per instruction, and was 15-25% of a GPT-2
capture. `tests/bytecode/test_decode.py` checks it field by field against `dis` on every code
object of the standard library, torch and transformers modules it can load.
"""

from __future__ import annotations

import dis
import opcode
import types
import weakref
from typing import Any, NamedTuple

from ember.bytecode.ops import PY312, UNSUPPORTED, Op, op_for


class Inst(NamedTuple):
    """One instruction. A NamedTuple (immutable like the frozen dataclass it replaced, but
    built 3-4x faster: a GPT-2 capture decodes ~4,000 instructions)."""

    op: Op | None
    """None for an opcode ember does not interpret (see `opname` and ops.UNSUPPORTED)."""
    opname: str
    arg: int | None
    argval: Any
    offset: int
    index: int
    line: int | None
    target: int | None = None
    """Index of the jump target (for FOR_ITER: where to continue once exhausted)."""
    push_null: bool = False
    """LOAD_GLOBAL / LOAD_ATTR pushes a NULL (3.11+ calling convention)."""

    @property
    def unsupported_reason(self) -> str:
        return UNSUPPORTED.get(self.opname, "")


# How each opcode's argument becomes `argval` (what `dis` reports as `Instruction.argval`).
_PLAIN, _CONST, _NAME, _NAME_SHR1, _NAME_SHR2, _JABS, _JFWD, _JBACK = range(8)
_LOCAL, _COMPARE, _FORMAT = range(8, 11)


def _tables() -> tuple[list[int | None], list[str], list[Op | None], list[int], list[int]]:
    """Per opcode (0-255): argument kind (None: takes no argument), name, Op, inline cache
    entries after it, and how many code units a relative jump adds beyond its argument."""
    has_arg = set(getattr(dis, "hasarg", range(dis.HAVE_ARGUMENT, 256)))
    kinds: list[int | None] = []
    names: list[str] = []
    ops: list[Op | None] = []
    caches = [opcode._inline_cache_entries[code] for code in range(256)]  # type: ignore[attr-defined]
    for code in range(256):
        name = dis.opname[code]
        names.append(name)
        try:
            ops.append(op_for(name))
        except KeyError:  # '<42>': unused opcode number, never in a code object
            ops.append(None)
        kind: int | None = _PLAIN
        if code not in has_arg:
            kind = None
        elif code in dis.hasconst or name == "KW_NAMES":  # 3.11's dis leaves KW_NAMES raw
            kind = _CONST
        elif code in dis.hasname:
            if name == "LOAD_GLOBAL" or (PY312 and name == "LOAD_ATTR"):
                kind = _NAME_SHR1
            elif name == "LOAD_SUPER_ATTR":
                kind = _NAME_SHR2
            else:
                kind = _NAME
        elif code in dis.hasjabs:
            kind = _JABS
        elif code in dis.hasjrel:
            kind = _JBACK if "JUMP_BACKWARD" in name else _JFWD
        elif code in dis.haslocal or code in dis.hasfree:
            kind = _LOCAL
        elif code in dis.hascompare:
            kind = _COMPARE
        elif name == "FORMAT_VALUE":
            kind = _FORMAT
        kinds.append(kind)
    # 3.12's dis counts a relative jump from after the instruction's inline caches.
    jump_extra = [caches[code] if PY312 else 0 for code in range(256)]
    return kinds, names, ops, caches, jump_extra


_KINDS, _NAMES, _OPS, _CACHES, _JUMP_EXTRA = _tables()
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_INT_OVERFLOW = 2**31
_COMPARE_SHIFT = 4 if PY312 else 0
_CONVERTERS = [None, str, repr, ascii]
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_LOAD_ATTR = dis.opmap["LOAD_ATTR"]
_LOAD_SUPER_ATTR = dis.opmap.get("LOAD_SUPER_ATTR", -1)
_FOR_ITER = dis.opmap["FOR_ITER"]


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


def _unpack(raw: bytes) -> list[tuple[int, int, int | None]]:
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


def _decode(code: types.CodeType) -> list[Inst]:
    raw = _unpack(code.co_code)
    index_of = {offset: n for n, (offset, _, _) in enumerate(raw)}
    lines = [p[0] for p in code.co_positions()]  # one per code unit, caches included
    consts, names = code.co_consts, code.co_names
    varname = code._varname_from_oparg  # type: ignore[attr-defined]
    kinds, opnames, ops, jump_extra = _KINDS, _NAMES, _OPS, _JUMP_EXTRA
    out = []
    line = code.co_firstlineno
    for n, (offset, opc, arg) in enumerate(raw):
        at = lines[offset >> 1]
        if at is not None:
            line = at
        kind = kinds[opc]
        op = ops[opc]
        argval: Any = arg
        target = None
        push_null = False
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
        elif kind == _COMPARE:
            argval = dis.cmp_op[arg >> _COMPARE_SHIFT]
        elif kind == _FORMAT:
            argval = (_CONVERTERS[arg & 3], bool(arg & 4))
        else:
            if kind == _JABS:
                argval = arg * 2
            else:
                step = -arg if kind == _JBACK else arg
                argval = offset + 2 + step * 2 + 2 * jump_extra[opc]
            target = index_of[argval]
            if opc == _FOR_ITER and PY312:
                target += 1  # 3.12 jumps over END_FOR when the iterator is exhausted
        out.append(Inst(op, opnames[opc], arg, argval, offset, n, line, target, push_null))
    return out
