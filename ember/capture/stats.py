"""Counts of what capture did since the last `ember.reset()`: graphs compiled, graph breaks
(with their reasons), recompiles and code objects left to run eagerly. `ember.stats()` returns
them, so a harness can compare ember's capture with torch.compile's without a custom backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ember.errors import Unsupported


@dataclasses.dataclass
class CaptureStats:
    graphs: int = 0
    """Graphs handed to a backend."""
    graph_breaks: int = 0
    """Captures that stopped at an instruction: resumed after it, or the frame runs eagerly."""
    break_reasons: list[str] = dataclasses.field(default_factory=list)
    """One line per graph break: the reason, the construct and the user's file:line."""
    recompiles: int = 0
    """Captures of a code object that already had cache entries (a guard failed)."""
    eager_frames: int = 0
    """Code objects that ember stopped capturing (an unsupported construct it cannot resume
    after, or the recompile limit): they run in plain Python."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "graphs": self.graphs,
            "graph_breaks": self.graph_breaks,
            "break_reasons": list(self.break_reasons),
            "recompiles": self.recompiles,
            "eager_frames": self.eager_frames,
        }


_current = CaptureStats()


def current() -> CaptureStats:
    return _current


def describe_break(exc: Unsupported) -> str:
    text = f"{exc.reason.value}: {exc.detail}"
    return f"{text} at {exc.location}" if exc.location else text


def record_graph() -> None:
    _current.graphs += 1


def record_break(exc: Unsupported) -> None:
    _current.graph_breaks += 1
    _current.break_reasons.append(describe_break(exc))


def record_recompile() -> None:
    _current.recompiles += 1


def record_eager_frame() -> None:
    _current.eager_frames += 1


def reset() -> None:
    global _current
    _current = CaptureStats()
