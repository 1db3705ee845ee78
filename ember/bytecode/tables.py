"""Per-opcode tables of the running Python, built once from `dis` and `opcode` and the
dialect: the kind of each opcode's argument (how it becomes `Inst.argval` and back), its
name, its `Op`, its inline cache entries and the extra code units of its relative jump.
The decoder reads them, and so does the encoder that the round-trip test checks it with.
"""

from __future__ import annotations

import dis
import opcode

from ember.bytecode.dialect import THIS
from ember.bytecode.ops import Op, op_for

# Argument kinds
PLAIN, CONST, NAME, NAME_SHR1, NAME_SHR2, JABS, JFWD, JBACK = range(8)
LOCAL, LOCAL_PAIR, COMPARE, FORMAT, CONVERT = range(8, 13)
PAIRS = ("LOAD_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST")


def _cache_entries() -> list[int]:
    """Inline cache entries after each opcode (3.13 keys `opcode`'s table by name)."""
    table = opcode._inline_cache_entries  # type: ignore[attr-defined]
    if isinstance(table, dict):
        return [table.get(dis.opname[code], 0) for code in range(256)]
    return [table[code] for code in range(256)]


def _kind(code: int, name: str, has_arg: set[int]) -> int | None:
    if code not in has_arg:
        return None
    if code in dis.hasconst or name == "KWNAMES":  # 3.11's dis leaves KWNAMES raw
        return CONST
    if code in dis.hasname:
        if name == "LOAD_GLOBAL" or (THIS.attr_method_bit and name == "LOAD_ATTR"):
            return NAME_SHR1
        return NAME_SHR2 if name == "LOAD_SUPER_ATTR" else NAME
    if code in dis.hasjabs:
        return JABS
    if code in dis.hasjrel:
        return JBACK if "JUMP_BACKWARD" in name else JFWD
    if name in PAIRS:
        return LOCAL_PAIR
    if code in dis.haslocal or code in dis.hasfree:
        return LOCAL
    if code in dis.hascompare:
        return COMPARE
    if name == "FORMAT_VALUE":
        return FORMAT
    return CONVERT if name == "CONVERT_VALUE" else PLAIN


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


KINDS, NAMES, OPS, CACHES, JUMP_EXTRA = _tables()
EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
CONVERTERS = [None, str, repr, ascii]
LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
FOR_ITER = dis.opmap["FOR_ITER"]
SEND = dis.opmap["SEND"]
SKIPS = {FOR_ITER: THIS.for_iter_skips, SEND: THIS.send_skips}
