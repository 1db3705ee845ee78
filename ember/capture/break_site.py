"""What break code needs to know about the frames a graph break interrupts: the frame that
breaks (`BreakSite`), the inlined frames above it (`CallerSite`), the exception-table
entry that covers an instruction (`Handler`), and the variables break code keeps each
frame's stack slots, locals and cells in (`FrameVars`). Data only: capture/codegen.py
writes the code, capture/frame.py fills these in."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.bytecode import Inst
    from ember.capture.values.base import Value


def break_temp(i: int) -> str:
    """Where break code keeps stack slot i (not `___stack_i`: a resume function that breaks
    again still reads its own `___stack_i` parameters while rebuilding values)."""
    return f"___break_{i}"


def cell_temp(name: str) -> str:
    """Where break code keeps a cell's contents (the cell's own name is not a fast local)."""
    return f"___cell_{name}"


@dataclasses.dataclass
class BreakSite:
    """What the break's code needs from the interrupted frame."""

    inst: Inst
    stack: list[Value]
    locals: dict[str, Value]
    untouched_args: list[str]
    kw_names: tuple[str, ...]
    cells: dict[str, Any]
    """The frame's own cells (locals captured by nested functions: CellValue, or RealCell
    in a resume function, which receives them as cells). They travel to the resume
    function as cell objects (`Emitter.load_cell`), shared with the functions rebuilt over
    them."""
    make_resume: Callable[..., Callable[..., Any]]
    """(target index, stack slots, local names) -> the compiled resume function."""
    wrap_callee: Callable[[Any], Any]
    """Wrap a user function so that, run in Python at the break, it is compiled by ember."""
    grad_mode: bool | None = None
    """The grad mode at the break, where the code before it changed it (a `with no_grad()`
    block the break is inside): set before the unsupported instruction runs."""
    handler: Handler | None = None
    """Where an exception raised by the instruction goes in the user's code (the break is
    inside a try or `with` block), or None when it leaves the function."""
    callers: list[CallerSite] = dataclasses.field(default_factory=list)
    """Where the break is taken in an inlined frame (capture/nested.py): the frames above
    it, the compiled function's own first, each to continue after its call."""
    instruction_sets_grad_mode: bool = False
    """The instruction run at the break sets the grad mode itself (the real `__exit__` of
    an inference-mode block, which restores the mode from before the block): `grad_mode`
    is set before it, and neither the break code nor the resume function set it after."""

    @property
    def frame(self) -> FrameVars:
        return FrameVars(len(self.callers))


@dataclasses.dataclass
class CallerSite:
    """A frame above an inlined frame that breaks: it called the frame below directly, and
    continues at instruction `after` with the call's result on top of its stack."""

    after: int
    stack: list[Value]
    """Its stack below the call's operands."""
    locals: dict[str, Value]
    untouched_args: list[str]
    cells: dict[str, Any]
    make_resume: Callable[..., Callable[..., Any]]
    handler: Handler | None = None
    """Where an exception raised by the frames below goes (the call is inside a try or
    `with` block of this frame), or None when it leaves this frame too."""
    grad_mode_at_call: bool = True
    """The grad mode of this frame at its call (its handler runs in it: the compiled
    frames below restore the mode they were called in when they raise)."""


@dataclasses.dataclass(frozen=True)
class FrameVars:
    """The variables break code keeps one frame's stack slots, locals and cells in: the
    compiled function's own frame (depth 0) keeps its locals in their own variables; a frame
    inlined into it, in variables named after its depth."""

    depth: int

    def stack(self, i: int) -> str:
        return break_temp(i) if self.depth == 0 else f"___f{self.depth}_break_{i}"

    def local(self, name: str, cells: dict[str, Any]) -> str:
        if name in cells:
            return cell_temp(name) if self.depth == 0 else f"___f{self.depth}_cell_{name}"
        return name if self.depth == 0 else f"___f{self.depth}_local_{name}"


@dataclasses.dataclass(frozen=True)
class Handler:
    """The exception-table entry of the instruction that broke: the handler's instruction
    index, the stack depth it keeps, and whether it also takes the raising offset."""

    target: int
    depth: int
    lasti: bool
