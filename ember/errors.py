"""ember's exceptions and the closed set of reasons a capture can stop.

Every `Unsupported` carries a `BreakReason`, the user's file:line and a hint that says what
to change, so that tests assert the reason and users read the place.
"""

from __future__ import annotations

import enum


class BreakReason(enum.Enum):
    """Why capture could not continue at an instruction."""

    UNSUPPORTED_OPCODE = "unsupported bytecode instruction"
    UNSUPPORTED_CALL = "call to a function ember cannot trace"
    DATA_DEPENDENT_BRANCH = "branch on the value of a tensor"
    TENSOR_TO_PYTHON = "tensor value converted to a Python value"
    UNSUPPORTED_ATTRIBUTE = "attribute ember cannot model"
    UNSUPPORTED_OBJECT = "object of a type ember cannot model"
    UNSUPPORTED_OPERATOR = "operator on values ember cannot combine"
    EXCEPTION_RAISED = "exception raised in traced code"
    DYNAMIC_CONTROL_FLOW = "control flow ember cannot unroll"
    INLINE_DEPTH = "user calls nested too deeply"
    SIDE_EFFECT = "mutation ember cannot record"
    TENSOR_OP_FAILED = "tensor operation failed on example inputs"
    DATA_DEPENDENT_OP = "operation whose output shape depends on tensor values"
    RECOMPILE_LIMIT = "the function was captured again too many times"
    FORCED = "a graph break the program asks for (torch._dynamo.graph_break())"
    HIGHER_ORDER_OP = "a higher-order op whose function ember cannot capture as one node"


class Unsupported(Exception):
    """Capture cannot go on: the construct, where it is in the user's code, what to do."""

    sets_grad_mode = False
    """The instruction broken at sets the grad mode itself, when it runs at the break."""

    def __init__(
        self,
        reason: BreakReason,
        detail: str,
        *,
        location: str = "",
        source_line: str = "",
        hint: str = "",
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.location = location
        self.source_line = source_line
        self.hint = hint
        self.user_stack: list[str] = []
        super().__init__(self._message())

    def _message(self) -> str:
        text = f"{self.reason.value}: {self.detail}"
        if self.location:
            text += f"\n  at {self.location}"
            if self.source_line:
                text += f"\n    {self.source_line}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def at(self, location: str, source_line: str) -> Unsupported:
        """Fill in the user's location if no deeper frame set it already."""
        if not self.location:
            self.location = location
            self.source_line = source_line
            self.args = (self._message(),)
        return self


class BackendCompilerFailed(Exception):
    """A backend raised while compiling a captured graph; names the backend and shows the graph."""

    def __init__(self, backend_name: str, stage: str, graph_code: str, cause: BaseException):
        self.backend_name = backend_name
        self.stage = stage
        self.graph_code = graph_code
        super().__init__(
            f"backend {backend_name!r} failed during {stage}: "
            f"{type(cause).__name__}: {cause}\n\ngraph:\n{graph_code}"
        )
