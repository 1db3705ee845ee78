"""Decode a code object into a list of version-neutral `Inst`s.

Takes `types.CodeType`, returns `list[Inst]` with jump targets as instruction indices and the
per-version quirks folded in (the method bit of LOAD_ATTR, the NULL bit of LOAD_GLOBAL, where an
exhausted FOR_ITER continues).
"""

from __future__ import annotations

import dataclasses
import dis
import types
import weakref
from typing import Any

from ember.bytecode.ops import PY312, UNSUPPORTED, Op, op_for


@dataclasses.dataclass(frozen=True, slots=True)
class Inst:
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


_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)


_decoded: weakref.WeakKeyDictionary[types.CodeType, tuple[Inst, ...]] = weakref.WeakKeyDictionary()
"""Decoded code objects. A capture inlines the same functions many times (every Linear's
forward, a config's `__getattribute__` on each attribute read) and `dis` is slow: decoding
was ~40% of a GPT-2 capture before this cache. Insts are frozen, so sharing them is safe."""


def decode(code: types.CodeType) -> list[Inst]:
    """All instructions of `code`, in order (a fresh list; the Insts are shared)."""
    cached = _decoded.get(code)
    if cached is None:
        cached = _decoded[code] = tuple(_decode(code))
    return list(cached)


def _decode(code: types.CodeType) -> list[Inst]:
    raw = list(dis.get_instructions(code))
    index_of = {ins.offset: i for i, ins in enumerate(raw)}
    out = []
    line = code.co_firstlineno
    for i, ins in enumerate(raw):
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
        op = op_for(ins.opname)
        argval = ins.argval
        push_null = False
        target = None
        if ins.opcode in _JUMPS:
            target = index_of[ins.argval]
            if ins.opname == "FOR_ITER" and PY312:
                target += 1  # 3.12 jumps over END_FOR when the iterator is exhausted
        if ins.opname == "LOAD_GLOBAL":
            push_null = bool(ins.arg & 1)
        elif ins.opname == "LOAD_ATTR" and PY312 and ins.arg & 1:
            op = Op.LOAD_METHOD
        elif ins.opname == "LOAD_SUPER_ATTR":
            push_null = bool(ins.arg & 1)
        elif ins.opname == "KW_NAMES":
            argval = code.co_consts[ins.arg]  # 3.11's dis leaves it unresolved
        out.append(Inst(op, ins.opname, ins.arg, argval, ins.offset, i, line, target, push_null))
    return out
