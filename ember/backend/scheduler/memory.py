"""Memory planning: which buffers the wrapper allocates, and which dead buffers it reuses.

A buffer dies after the last step that reads it. A later kernel output of the same storage
size and dtype may take a dead buffer's storage instead of allocating -- but only when that
cannot raise the graph's peak: the donor stays alive from its death to its reuse, and any
allocation in between that the freed storage could have served would otherwise come on top.
So a reuse is accepted only if, at every step between death and reuse, the bytes the wrapper
holds (plus the donors already held across that step) stay at or below the peak of the plan
without any reuse. A backward graph's peak is the training step's peak, so a donor held across
a weight-gradient GEMM (as the first version of this planner did) costs memory directly.

Graph outputs never die; inputs and fallback results (which may alias their inputs) are never
pooled. Inputs die at their last read too (a boxed caller hands them over), but their bytes
are not counted: whether they are really freed depends on who else holds them.
"""

from __future__ import annotations

import dataclasses

import sympy

from ember.backend.ir import nodes as ir
from ember.backend.scheduler.dependencies import output_buffers
from ember.backend.scheduler.fusion import Kernel, Schedule
from ember.backend.sizes import hint


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


def nbytes(b: ir.Buffer) -> int:
    """Bytes of a buffer's storage (at the example sizes, where they are symbolic: the
    peak estimates only decide which reuses to make, never whether one is valid)."""
    dtype = b.dtype.torch if isinstance(b.dtype, ir.DType) else b.dtype
    return hint(b.layout.storage_numel()) * dtype.itemsize


def plan(s: Schedule, written_in_place: dict[str, str] | None = None) -> Plan:
    """`written_in_place`: output buffer -> the input it is the new value of, whose storage
    it takes where the kernel writing it is the input's last reader and reads it at most
    element by element before writing (compile._written_in_place)."""
    g = s.graph
    buffers = g.buffer_map()
    # Graph constants are globals of the wrapper and never die.
    keep = output_buffers(g) | {name for name, _ in g.constants}
    inputs = {b.name for b in g.inputs}
    last: dict[str, int] = {}
    for i, step in enumerate(s.steps):
        for b in [*step_writes(step), *step_reads(step)]:
            last[b] = i
    poolable = set()
    for step in s.steps:
        if isinstance(step, Kernel) or step.kind == ir.ExternKind.LIBRARY:
            poolable.update(step_writes(step))
    frees = []
    for i in range(len(s.steps)):
        frees.append(tuple(sorted(b for b, j in last.items() if j == i and b not in keep)))
    live = _live_bytes(s, buffers, frees, inputs)
    peak = max(live, default=0)
    held = [0] * len(s.steps)  # bytes of donors kept alive across each step
    pool: dict[tuple, list[tuple[str, int]]] = {}  # key -> [(donor, step it died at)]
    allocs = []
    into = _into_inputs(s, written_in_place or {}, last, buffers)
    for i, step in enumerate(s.steps):
        mine = []
        if isinstance(step, Kernel):
            dying = [b for b in frees[i] if b in poolable and b not in inputs]
            for b in step_writes(step):
                if b in into:
                    mine.append((b, into[b]))
                    continue
                donor = _in_place(step, b, dying, buffers)
                if donor is not None:
                    dying.remove(donor)
                else:
                    size = nbytes(buffers[b])
                    donor = _take(pool.get(_key(buffers[b])), i, live, held, peak, size)
                mine.append((b, donor))
        allocs.append(tuple(mine))
        taken = {d for _, d in mine}
        for b in frees[i]:
            if b in poolable and b not in taken:
                pool.setdefault(_key(buffers[b]), []).append((b, i))
    return Plan(tuple(allocs), tuple(frees))


def _into_inputs(
    s: Schedule, written_in_place: dict[str, str], last: dict[str, int], buffers: dict
) -> dict[str, str]:
    """The outputs of `written_in_place` that can take their input's storage: the input is
    read by kernels only (an aten call's result may alias it), none after the kernel that
    writes the output, and that kernel reads it at most element by element before writing
    (`_overwritable`)."""
    extern_reads = set()
    for step in s.steps:
        if not isinstance(step, Kernel):
            extern_reads |= step_reads(step)
    into = {}
    for i, step in enumerate(s.steps):
        if not isinstance(step, Kernel):
            continue
        for b in step_writes(step):
            src = written_in_place.get(b)
            if src is None or src in extern_reads or last.get(src, -1) > i:
                continue
            if last.get(src, -1) < i or _overwritable(step, b, src):
                into[b] = src
    return into


def _overwritable(k: Kernel, out: str, src: str) -> bool:
    """Whether kernel `k` may write pointwise node `out` over the storage of `src`: every
    read of `src` in the kernel is in `out`'s loop, by `out` or a node before it, at the
    element `out` writes. (A loop of the kernel runs per outer point, and those reads are
    at that point's elements, so no other point's loop can read what `out` replaced.)"""
    for lp in k.loops:
        pos = next((j for j, n in enumerate(lp.nodes) if n.name == out), None)
        if pos is None:
            if any(src in ir.node_reads(n) for n in lp.nodes):
                return False
            continue
        node = lp.nodes[pos]
        if not isinstance(node, ir.Pointwise):
            return False
        if any(src in ir.node_reads(n) for n in lp.nodes[pos + 1 :]):
            return False
        loads = [ld for n in lp.nodes[: pos + 1] for ld in ir.loads(n.body) if ld.buffer == src]
        if any(ld.index != node.index for ld in loads):
            return False
    return True


def in_place_buffers(s: Schedule, p: Plan) -> dict[str, frozenset[str]]:
    """Per kernel, the buffers it reads and writes through one storage (an output that took
    the storage of a buffer the same kernel reads): their pointers must not be declared
    non-aliasing, or the compiler may reorder a load after the store that replaced it."""
    out: dict[str, frozenset[str]] = {}
    for step, allocs in zip(s.steps, p.allocs, strict=True):
        if isinstance(step, Kernel):
            reads = step_reads(step)
            pairs = [(b, d) for b, d in allocs if d is not None and d in reads]
            out[step.name] = frozenset(x for pair in pairs for x in pair)
    return out


def _live_bytes(
    s: Schedule, buffers: dict[str, ir.Buffer], frees: list[tuple[str, ...]], inputs: set[str]
) -> list[int]:
    """Bytes the wrapper holds while each step runs (its outputs allocated, nothing reused)."""
    live, cur = [], 0
    for i, step in enumerate(s.steps):
        cur += sum(nbytes(buffers[b]) for b in step_writes(step) if b not in inputs)
        live.append(cur)
        cur -= sum(nbytes(buffers[b]) for b in frees[i] if b not in inputs)
    return live


def _take(
    donors: list[tuple[str, int]] | None,
    i: int,
    live: list[int],
    held: list[int],
    peak: int,
    size: int,
) -> str | None:
    """A donor whose storage step i may take without raising the peak (latest dead first);
    the steps it is held across are charged with its bytes."""
    if not donors:
        return None
    for k in range(len(donors) - 1, -1, -1):
        name, died = donors[k]
        between = range(died + 1, i)
        if all(live[j] + held[j] + size <= peak for j in between):
            for j in between:
                held[j] += size
            del donors[k]
            return name
    return None


def _in_place(k: Kernel, out: str, dying: list[str], buffers: dict[str, ir.Buffer]) -> str | None:
    """A buffer that dies in kernel `k` and that `out` can overwrite element by element: the
    pointwise node writing `out` sits in the kernel's first loop (no earlier loop can have
    stored into `out`), and every read of the buffer in the kernel is in that loop, by that
    node or one before it, at the very element that node writes. The kernel then reads each
    element before writing it (Inductor's in_out_ptr): no new allocation, and the stores hit
    cache lines the loads just brought in."""
    first = k.loops[0].nodes
    pos = next((j for j, n in enumerate(first) if n.name == out), None)
    if pos is None or not isinstance(first[pos], ir.Pointwise):
        return None
    index = first[pos].index
    later = [n for lp in k.loops[1:] for n in lp.nodes] + list(first[pos + 1 :])
    for b in dying:
        if _key(buffers[b]) != _key(buffers[out]):
            continue
        if any(b in ir.node_reads(n) for n in later):
            continue
        loads = [ld for n in first[: pos + 1] for ld in ir.loads(n.body) if ld.buffer == b]
        if loads and all(ld.index == index for ld in loads):
            return b
    return None


def _key(b: ir.Buffer) -> tuple:
    """Buffers that may share storage: the same dtype and the same number of elements for
    every value of the size symbols."""
    n = b.layout.storage_numel()
    return (n if isinstance(n, int) else sympy.expand(n), b.dtype)
