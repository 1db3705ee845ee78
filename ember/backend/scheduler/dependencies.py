"""Read/write dependencies of a LoopGraph, and dead-node elimination.

Lowering creates reductions eagerly (layer norm's mean/rstd outputs, for example) even when
nothing reads them; `eliminate_dead` drops computed nodes whose buffers nobody reads.
"""

from __future__ import annotations

import dataclasses

from ember.backend.ir import nodes as ir


def output_buffers(g: ir.LoopGraph) -> set[str]:
    return {o.buffer for o in g.buffer_outputs()}


def readers(g: ir.LoopGraph) -> dict[str, list[int]]:
    """Buffer name -> indices of the nodes that read it."""
    out: dict[str, list[int]] = {}
    for i, n in enumerate(g.nodes):
        for name in ir.node_reads(n):
            out.setdefault(name, []).append(i)
    return out


def producers(g: ir.LoopGraph) -> dict[str, int]:
    return {name: i for i, n in enumerate(g.nodes) for name in ir.node_outputs(n)}


def eliminate_dead(g: ir.LoopGraph) -> ir.LoopGraph:
    """Remove Pointwise/Reduction nodes (and their buffers) whose results are never read."""
    live = output_buffers(g)
    keep: list[ir.Node] = []
    for n in reversed(g.nodes):
        if isinstance(n, ir.ExternCall) or any(b in live for b in ir.node_outputs(n)):
            keep.append(n)
            live |= ir.node_reads(n)
    keep.reverse()
    written = {b for n in keep for b in ir.node_outputs(n)}
    buffers = tuple(b for b in g.buffers if b.name in written)
    return dataclasses.replace(g, nodes=tuple(keep), buffers=buffers)
