"""Memory planning: which buffers the wrapper allocates, and which dead buffers it reuses.

A buffer dies after the last step that reads it; its storage goes to a pool keyed by
(element count, dtype) and the next kernel output with the same key takes it instead of
allocating. Graph outputs never die; inputs and fallback results (which may alias their
inputs) are never pooled.
"""

from __future__ import annotations

import dataclasses

from ember.backend.ir import nodes as ir
from ember.backend.scheduler.dependencies import output_buffers
from ember.backend.scheduler.fusion import Kernel, Schedule


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    allocs: tuple[tuple[tuple[str, str | None], ...], ...]  # per step: (buffer, donor or None)
    frees: tuple[tuple[str, ...], ...]  # per step: buffers dead once it has run


def step_writes(step) -> list[str]:
    if isinstance(step, Kernel):
        return [n.name for n in step.nodes() if n.name not in step.local]
    return list(step.outputs)


def step_reads(step) -> set[str]:
    if isinstance(step, Kernel):
        produced = {n.name for n in step.nodes()}
        reads: set[str] = set()
        for n in step.nodes():
            reads |= ir.node_reads(n)
        return reads - produced
    return ir.node_reads(step)


def plan(s: Schedule) -> Plan:
    g = s.graph
    buffers = g.buffer_map()
    # inputs die at their last read too: a boxed caller hands them over (see wrapper.py),
    # so an activation saved for the backward is freed inside it. Graph constants are globals
    # of the wrapper and never die.
    keep = output_buffers(g) | {name for name, _ in g.constants}
    last: dict[str, int] = {}
    for i, step in enumerate(s.steps):
        for b in [*step_writes(step), *step_reads(step)]:
            last[b] = i
    poolable = set()
    for step in s.steps:
        if isinstance(step, Kernel) or step.kind == ir.ExternKind.LIBRARY:
            poolable.update(step_writes(step))
    pool: dict[tuple, list[str]] = {}
    allocs, frees = [], []
    for i, step in enumerate(s.steps):
        mine = []
        if isinstance(step, Kernel):
            for b in step_writes(step):
                key = _key(buffers[b])
                donors = pool.get(key)
                mine.append((b, donors.pop() if donors else None))
        allocs.append(tuple(mine))
        dead = tuple(sorted(b for b, j in last.items() if j == i and b not in keep))
        for b in dead:
            if b in poolable:
                pool.setdefault(_key(buffers[b]), []).append(b)
        frees.append(dead)
    return Plan(tuple(allocs), tuple(frees))


def _key(b: ir.Buffer) -> tuple:
    return (b.layout.storage_numel(), b.dtype)
