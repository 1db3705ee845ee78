"""Break code's part in the exception an `except` block is handling.

A break inside an `except` (or `except*`) clause runs its instruction in CPython, which must
see the clause's exception as the one being handled (`sys.exc_info()`,
`logging.exception`): break code raises and catches it again around the instruction, and
lets go of it before calling the resume function.
"""

from __future__ import annotations

from ember.bytecode import CodeBuilder
from ember.capture.break_site import FrameVars
from ember.capture.resume import Slot, StackSlot


def handle_again(cg: CodeBuilder, slots: list[StackSlot], below: int, frame: FrameVars) -> bool:
    """A break inside an `except` block: the instruction runs with the block's exception
    handled by CPython (`sys.exc_info()`, `logging.exception`), so break code raises and
    catches it again; the exception handled before stays on the stack for POP_EXCEPT."""
    handled = [i for i, slot in enumerate(slots[:below]) if slot.kind is Slot.HANDLING]
    if not handled:
        return False
    cg.load_fast(frame.stack(handled[-1]))
    cg.catch_raised(0)
    cg.pop_top()
    return True


def handle_match(cg: CodeBuilder, slots: list[StackSlot], base: int, frame: FrameVars) -> None:
    """CHECK_EG_MATCH makes the part of the group it matched the exception being handled
    (`sys.exc_info()` in the `except*` clause): the resume function handles that one."""
    handling = max(i for i, slot in enumerate(slots[:base]) if slot.kind is Slot.HANDLING)
    no_match = cg.label()
    cg.load_fast(frame.stack(base + 1))
    cg.pop_jump_if("NONE", no_match)
    cg.load_fast(frame.stack(base + 1))
    cg.store_fast(frame.stack(handling))
    cg.place(no_match)


def stop_handling(cg: CodeBuilder, handled: bool) -> None:
    if handled:
        cg.pop_except()
