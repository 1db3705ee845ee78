"""`ember.explain(fn)(*args)`: run a function under capture and report what happened: the
graphs, the graph breaks with their reasons and places, the ops in each graph and the guards.
The fields follow `torch._dynamo.explain`'s output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ember.capture import frame
from ember.capture.cache import CacheEntry
from ember.errors import BreakReason, Unsupported


@dataclasses.dataclass
class BreakInfo:
    reason: BreakReason
    detail: str
    location: str
    source_line: str
    user_stack: list[str]

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}\n    at {self.location}: {self.source_line}"


@dataclasses.dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[BreakInfo]
    ops_per_graph: list[list[Any]]
    out_guards: list[str]
    compile_times: str = ""

    def __str__(self) -> str:
        lines = [
            f"Graph Count: {self.graph_count}",
            f"Graph Break Count: {self.graph_break_count}",
            f"Op Count: {sum(len(ops) for ops in self.ops_per_graph)}",
            "Break Reasons:",
        ]
        for i, info in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}: {info}")
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Ops {i}: " + ", ".join(getattr(op, "__name__", str(op)) for op in ops))
        lines.append("Out Guards:")
        lines.extend(f"  {guard}" for guard in self.out_guards)
        return "\n".join(lines)


def _info(exc: Unsupported) -> BreakInfo:
    return BreakInfo(exc.reason, exc.detail, exc.location, exc.source_line, list(exc.user_stack))


def explain(fn: Callable[..., Any]) -> Callable[..., ExplainOutput]:
    """`explain(fn)(*args, **kwargs)` runs fn once under a fresh capture (caches are reset)."""
    import ember

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        ember.reset()
        entries: list[CacheEntry] = []
        eager_reasons: list[Unsupported] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
            return gm.forward

        frame._listeners.append(entries.append)
        try:
            compiled = ember.compile(fn, backend=backend)
            compiled(*args, **kwargs)
        finally:
            frame._listeners.remove(entries.append)
        from ember.capture.cache import live_caches

        for cache in live_caches():
            if isinstance(cache.eager_reason, Unsupported):
                eager_reasons.append(cache.eager_reason)
        graphs = [e.graph for e in entries if e.graph is not None]
        breaks = [_info(e.graph_break) for e in entries if e.graph_break is not None]
        breaks += [_info(r) for r in eager_reasons]
        ember.reset()
        return ExplainOutput(
            graphs=graphs,
            graph_count=len(graphs),
            graph_break_count=len(breaks),
            break_reasons=breaks,
            ops_per_graph=[
                [n.target for n in g.graph.nodes if n.op in ("call_function", "call_method")]
                for g in graphs
            ],
            out_guards=[e.guard.source_text for e in entries],
        )

    return run
