"""What differs between the CPython versions ember reads and writes, as one row per version.

This is the only module of ember that looks at `sys.version_info`. The decoder, the stack
effects, the analyses and `CodeBuilder` read the row of the running Python (`THIS`); the rest
of ember never sees a version, only version-neutral instructions (`Op`) and builder methods.
Adding a version is adding a row here (what changed since the last one), its new opcodes to
`ops.py` (an `Op` or a reason in UNSUPPORTED; tests/bytecode/test_ops.py lists what is
missing) and, where an instruction's meaning changed, the decoder's or builder's use of the
new field.
"""

from __future__ import annotations

import dataclasses
import sys


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    precall: bool
    """3.11: CALL is preceded by PRECALL with the same argument."""
    kw_names_instruction: bool
    """3.11/3.12: KW_NAMES names the keyword arguments of the next CALL; 3.13: CALL_KW
    takes the tuple of names from the top of the stack."""
    null_above_callable: bool
    """Where a call's NULL sits: 3.11/3.12 [NULL, callable, args]; 3.13 [callable, NULL,
    args]. A method call is [function, self, args] in all three."""
    attr_method_bit: bool
    """3.12+: LOAD_ATTR's low bit is the method form (3.11 has LOAD_METHOD)."""
    compare_shift: int
    """COMPARE_OP's argument is the index into dis.cmp_op shifted left by this."""
    compare_cast_bit: int
    """3.13: the bit of COMPARE_OP's argument that converts the result to bool (0: none)."""
    jumps_skip_caches: bool
    """3.12+: a relative jump counts from after the instruction's inline caches."""
    conditional_jump_prefix: str
    """3.11 has forward and backward forms (POP_JUMP_FORWARD_IF_TRUE); 3.12+ one."""
    exact_bool_tests: bool
    """3.13: POP_JUMP_IF_TRUE/FALSE and UNARY_NOT take an exact bool, made by TO_BOOL."""
    for_iter_skips: int
    """Instructions after FOR_ITER's jump target that an exhausted loop skips (3.12:
    END_FOR; 3.13: END_FOR and POP_TOP)."""
    send_skips: int
    """Instructions after SEND's jump target that a finished delegation skips once SEND has
    popped the receiver itself, as 3.11's SEND does (3.12+: the END_SEND that pops it)."""
    merged_locations: bool
    """3.12+: the location table has one entry for neighbouring instructions at the same
    place (3.11: one per instruction)."""
    generator_start_depth: int
    """The stack depth a generator's or coroutine's code starts at when the compiler sizes
    its frame (3.11/3.12: 1, the value RETURN_GENERATOR's POP_TOP removes; 3.13 counts
    RETURN_GENERATOR's push instead)."""
    min_stack_size: int
    """3.13 gives every frame a stack of at least one slot (`def f(): pass` too)."""
    cell_object_load: str
    """The instruction that pushes a free variable's cell object (for a closure tuple):
    LOAD_CLOSURE; on 3.13 that is a pseudo-instruction the compiler turns into LOAD_FAST."""


_PY311 = Dialect(
    precall=True,
    kw_names_instruction=True,
    null_above_callable=False,
    attr_method_bit=False,
    compare_shift=0,
    compare_cast_bit=0,
    jumps_skip_caches=False,
    conditional_jump_prefix="POP_JUMP_FORWARD_IF_",
    exact_bool_tests=False,
    for_iter_skips=0,
    send_skips=0,
    merged_locations=False,
    generator_start_depth=1,
    min_stack_size=0,
    cell_object_load="LOAD_CLOSURE",
)
_PY312 = dataclasses.replace(
    _PY311,
    precall=False,
    attr_method_bit=True,
    compare_shift=4,
    jumps_skip_caches=True,
    conditional_jump_prefix="POP_JUMP_IF_",
    for_iter_skips=1,
    send_skips=1,
    merged_locations=True,
)
_PY313 = dataclasses.replace(
    _PY312,
    kw_names_instruction=False,
    null_above_callable=True,
    compare_shift=5,
    compare_cast_bit=16,
    exact_bool_tests=True,
    for_iter_skips=2,
    generator_start_depth=0,
    min_stack_size=1,
    cell_object_load="LOAD_FAST",
)
DIALECTS = {(3, 11): _PY311, (3, 12): _PY312, (3, 13): _PY313}
"""Each version's row, written as what changed since the one before."""

SUPPORTED = f"{min(DIALECTS)[0]}.{min(DIALECTS)[1]} to {max(DIALECTS)[0]}.{max(DIALECTS)[1]}"

if sys.version_info[:2] not in DIALECTS:
    raise ImportError(
        f"ember reads the bytecode of Python {SUPPORTED}, not {sys.version.split()[0]} "
        "(README: 'Python versions' says how a version is added)"
    )

THIS = DIALECTS[sys.version_info[:2]]
"""The running Python's row."""
