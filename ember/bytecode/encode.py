"""Encode decoded code back into CPython's raw tables: `co_code` from `Inst`s and the
location table from per-instruction positions (the exception table's encoder is in
`analysis.py`, beside its decoder; the location table is read with `co_positions`).

ember builds new code with the `bytecode` package (`CodeBuilder`); this is the inverse of
ember's own reading of code objects. `tests/bytecode/test_roundtrip.py` decodes every code
object of the standard library and torch and requires these encoders to give back the
original bytes, so a field the decoder misreads or drops (a new bit in an argument, a new kind
of argument, a new cache size) shows at once instead of as a wrong capture. Instructions are
laid out as CPython's assembler does it: EXTENDED_ARG prefixes as each argument needs, jump
arguments recomputed until the layout stops changing.
"""

from __future__ import annotations

import dis
import types
from typing import Any

from ember.bytecode import tables
from ember.bytecode.decode import Inst
from ember.bytecode.dialect import THIS
from ember.bytecode.ops import Op

_OPMAP = dis.opmap
_ZEROS = [bytes(2 * n) for n in range(max(tables.CACHES) + 1)]
_COMPARE_LOW_BITS = ((1 << THIS.compare_shift) - 1) & ~THIS.compare_cast_bit
"""Bits of COMPARE_OP's argument below the comparison that only the specializer reads
(3.12+: which orderings make it true); copied, not interpreted."""
_SUPER_TWO_ARGS = 2
"""LOAD_SUPER_ATTR's bit for a `super()` written with no arguments; ember reads the class
and instance from the stack either way, so it is copied, not interpreted."""


def _indexes(code: types.CodeType) -> tuple[dict[int, int], dict[str, int], dict[str, int]]:
    """Constant (by identity, the first where one repeats), name and fast-local indexes
    (-1 for a name with two slots)."""
    consts: dict[int, int] = {}
    for i, value in enumerate(code.co_consts):
        consts.setdefault(id(value), i)
    names = {name: i for i, name in reversed(list(enumerate(code.co_names)))}
    local_names = code.co_varnames + code.co_cellvars + code.co_freevars
    fast: dict[str, int] = {}
    for i in range(len(local_names)):
        try:
            name = code._varname_from_oparg(i)  # type: ignore[attr-defined]
        except IndexError:  # a cell that is also a parameter shares the parameter's slot
            break
        fast[name] = -1 if name in fast else i
    return consts, names, fast


def _slot(fast: dict[str, int], name: str, arg: int) -> int:
    """The fast-local slot of `name`. A class body that uses `__class__` has two slots of
    that name (its own cell and the enclosing one): there the decoder's raw `arg` tells
    which, and only then is it read."""
    slot = fast[name]
    return arg if slot < 0 else slot


def _oparg(inst: Inst, opc: int, consts: dict, names: dict, fast: dict) -> int:
    """The argument of a non-jump instruction, from what the decoder made of it."""
    kind = tables.KINDS[opc]
    if kind is None:
        return 0
    if kind == tables.CONST:
        return consts[id(inst.argval)]
    if kind == tables.NAME:
        return names[inst.argval]
    if kind == tables.NAME_SHR1:
        low = inst.push_null if opc == dis.opmap["LOAD_GLOBAL"] else inst.op is Op.LOAD_METHOD
        return names[inst.argval] << 1 | low
    if kind == tables.NAME_SHR2:
        return names[inst.argval] << 2 | (inst.arg & _SUPER_TWO_ARGS) | inst.push_null
    if kind == tables.LOCAL:
        return _slot(fast, inst.argval, inst.arg)
    if kind == tables.LOCAL_PAIR:
        first, second = inst.argval
        return _slot(fast, first, inst.arg >> 4) << 4 | _slot(fast, second, inst.arg & 15)
    if kind == tables.COMPARE:
        cast = THIS.compare_cast_bit if inst.to_bool else 0
        index = dis.cmp_op.index(inst.argval)
        return index << THIS.compare_shift | cast | (inst.arg & _COMPARE_LOW_BITS)
    if kind == tables.FORMAT:
        converter, has_spec = inst.argval
        return tables.CONVERTERS.index(converter) | (4 if has_spec else 0)
    if kind == tables.CONVERT:
        return tables.CONVERTERS.index(inst.argval)
    return inst.arg  # PLAIN: a count, a flag set, an operator number


def _prefixes(oparg: int) -> int:
    return 0 if oparg < 1 << 8 else 1 if oparg < 1 << 16 else 2 if oparg < 1 << 24 else 3


def encode_instructions(insts: list[Inst], code: types.CodeType) -> bytes:
    """`co_code` for `insts` (decoded from `code`, whose constant, name and local tables the
    arguments index), with zeroed inline caches as `co_code` shows them."""
    consts, names, fast = _indexes(code)
    opcodes: list[int] = []
    opargs: list[int] = []
    jumps: list[tuple[int, int]] = []  # (instruction, decoded index of its target)
    position = {}  # decoded index -> instruction number (EXTENDED_ARG: of what it prefixes)
    for inst in insts:
        position[inst.index] = len(opcodes)
        if inst.opname == "EXTENDED_ARG":
            continue
        opc = _OPMAP[inst.opname]
        if inst.target is None:
            opargs.append(_oparg(inst, opc, consts, names, fast))
        else:  # placed below; the decoded argument is only the first guess of its size
            opargs.append(inst.arg)
            jumps.append((len(opcodes), inst.target - tables.SKIPS.get(opc, 0)))
        opcodes.append(opc)
    jumps = [(n, position[target]) for n, target in jumps]
    while True:  # lay out, place the jumps, until no argument changes size
        starts = []
        offset = 0
        for opc, oparg in zip(opcodes, opargs):
            starts.append(offset)
            offset += 2 * (1 + _prefixes(oparg) + tables.CACHES[opc])
        changed = False
        for n, target in jumps:
            opc = opcodes[n]
            after = starts[n] + 2 * (1 + _prefixes(opargs[n]) + tables.JUMP_EXTRA[opc])
            kind = tables.KINDS[opc]
            new = (
                starts[target] // 2
                if kind == tables.JABS
                else (after - starts[target]) // 2
                if kind == tables.JBACK
                else (starts[target] - after) // 2
            )
            changed |= _prefixes(new) != _prefixes(opargs[n])
            opargs[n] = new
        if not changed:
            break
    out = bytearray()
    for opc, oparg in zip(opcodes, opargs):
        for shift in range(8 * _prefixes(oparg), 0, -8):
            out += bytes((tables.EXTENDED_ARG, (oparg >> shift) & 255))
        out += bytes((opc, oparg & 255))
        out += _ZEROS[tables.CACHES[opc]]
    return bytes(out)


Location = tuple[Any, Any, Any, Any]
"""(line, end line, column, end column), None where the table has none (`co_positions`)."""


def _write_varint(out: bytearray, value: int) -> None:
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


def _write_signed(out: bytearray, value: int) -> None:
    _write_varint(out, (-value << 1) | 1 if value < 0 else value << 1)


def encode_locations(runs: list[tuple[int, Location]], first_line: int) -> bytes:
    """`co_linetable` for consecutive (code units, location) runs, written as CPython's
    assembler writes it: equal neighbours merged (3.12+), at most 8 units an entry, the
    shortest form that holds each location."""
    merged: list[list[Any]] = []
    for units, location in runs:
        if merged and merged[-1][1] == location and THIS.merged_locations:
            merged[-1][0] += units
        else:
            merged.append([units, location])
    out = bytearray()
    line = first_line
    for units, location in merged:
        while units > 0:
            size = min(units, 8)
            units -= size
            line = _write_entry(out, size, location, line)
    return bytes(out)


def _write_entry(out: bytearray, size: int, location: Location, line: int) -> int:
    """One entry; returns the line the next entry's delta counts from."""
    start, end, column, end_column = location
    head = 128 | (size - 1)
    if start is None:
        out.append(head | 15 << 3)
        return line
    delta = start - line
    if column is None or end_column is None:
        if end in (start, None):
            out.append(head | 13 << 3)
            _write_signed(out, delta)
            return start
    elif end == start:
        if delta == 0 and column < 80 and 0 <= end_column - column < 16:
            out += bytes((head | (column >> 3) << 3, (column & 7) << 4 | (end_column - column)))
            return line
        if 0 <= delta < 3 and column < 128 and end_column < 128:
            out += bytes((head | (10 + delta) << 3, column, end_column))
            return start
    out.append(head | 14 << 3)
    _write_signed(out, delta)
    _write_varint(out, (end if end is not None else start) - start)
    _write_varint(out, (column if column is not None else -1) + 1)
    _write_varint(out, (end_column if end_column is not None else -1) + 1)
    return start


def instruction_locations(code: types.CodeType, insts: list[Inst]) -> list[tuple[int, Location]]:
    """(code units, location) of each instruction as the interpreter reads the table, its
    EXTENDED_ARG prefixes and inline caches included (they share its location)."""
    positions = list(code.co_positions())  # one per code unit
    out = []
    prefixes = 0
    for inst in insts:
        if inst.opname == "EXTENDED_ARG":
            prefixes += 1
            continue
        start = inst.offset // 2 - prefixes
        out.append((1 + prefixes + tables.CACHES[dis.opmap[inst.opname]], positions[start]))
        prefixes = 0
    return out
