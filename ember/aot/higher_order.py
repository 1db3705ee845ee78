"""Higher-order nodes of a torch-level graph (ember/higher_order.py) in ember's aot stage.

- checkpoint (ember's node, or PyTorch's tag_activation_checkpoint that Dynamo makes): the
  body is traced inline, and every aten node it records is tagged with the
  region (`node.meta["recompute_region"]`); the partitioner then saves no value from inside the
  region for the backward (only what enters it, and what leaves it for the rest of the
  forward) and computes the region again in the backward, just before its gradients. Random
  ops keep ember's rule: never recomputed, their results saved (a recomputed dropout would
  draw another mask).
- cond: a branch cannot be one node of an aten graph for ember's backend, so a graph with
  cond nodes runs as segments: the graph between two conds is compiled by aot as usual, each
  cond (with its output items) runs as torch code, which is PyTorch's own cond with the
  torch-level branches (its autograd traces the branch backward itself).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from ember import higher_order
from ember.aot.trace import TraceError, Tracer
from ember.errors import BreakReason

_COND = torch.ops.higher_order.cond
_CHECKPOINTS = (higher_order.checkpoint, torch.ops.higher_order.tag_activation_checkpoint)
"""ember's checkpoint node, and PyTorch's (what Dynamo's capture makes): the same meaning."""


def _nodes_calling(gm: Any, target: Any) -> list[fx.Node]:
    if not isinstance(gm, fx.GraphModule):
        return []
    return list(gm.graph.find_nodes(op="call_function", target=target))


class _Inliner(fx.Interpreter):
    """Runs a torch-level graph under the recorder, a checkpoint node's body inline in a
    recompute region of the tracer."""

    def __init__(self, gm: fx.GraphModule, tracer: Tracer) -> None:
        super().__init__(gm)
        self.tracer = tracer

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target in _CHECKPOINTS:
            body, *operands = args
            with self.tracer.recompute_region():
                return tuple(run_graph(body, operands, self.tracer))
        if target is _COND:
            raise TraceError(
                BreakReason.HIGHER_ORDER_OP,
                "torch.cond reached ember's aot tracer inside another higher-order op",
            )
        return super().call_function(target, args, kwargs)


def run_graph(gm: Any, args: Sequence[Any], tracer: Tracer) -> Any:
    """`gm(*args)` while tracing, with checkpointed bodies inlined as recompute regions."""
    if not any(_nodes_calling(gm, t) for t in (*_CHECKPOINTS, _COND)):
        return gm.forward(*args)  # not gm(): global module hooks are the user's, traced
    return _Inliner(gm, tracer).run(*args)


def has_cond(gm: Any) -> bool:
    return bool(_nodes_calling(gm, _COND))


def _segments(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """Each cond node in a segment of its own, with its branch attributes and its output
    items; the nodes between two conds in one segment."""
    part: dict[fx.Node, int] = {}
    segment = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in part:
            continue
        if node.target is _COND:
            segment += 1
            for item in [node, *node.all_input_nodes, *node.users]:
                if item.op == "get_attr" or item is node or item.target is operator.getitem:
                    part[item] = segment
            segment += 1
        else:
            part[node] = segment
    return part


class _Compiled(torch.nn.Module):
    """A segment compiled by aot (lazily, for the inputs of its first call)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def compile_with_cond(
    gm: fx.GraphModule, compile_segment: Callable[[fx.GraphModule], Callable[..., Any]]
) -> fx.GraphModule:
    """The graph split around its cond nodes; segments without one compiled by
    `compile_segment`, those with one left as torch code."""
    split = split_module(gm, None, _segments(gm).__getitem__)
    for name, segment in list(split.named_children()):
        if isinstance(segment, fx.GraphModule) and name.startswith("submod_"):
            if not has_cond(segment):
                setattr(split, name, _Compiled(compile_segment(segment)))
    return split
