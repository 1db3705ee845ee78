"""Group loop-IR nodes into kernels: producer/consumer and sibling fusion.

A kernel iterates an outer space (parallel over threads) and runs, per outer point, a
sequence of loops over inner spaces. A reduction with ranges O and reduction ranges I sits in
a loop over I inside outer O; a pointwise node over O + I joins such a kernel as a loop over
I (or over nothing when it spans just O). So softmax becomes one kernel: per row, a max loop,
a sum-of-exp loop and the normalizing loop, reading the row from memory once.

Legality: a node may read a buffer produced inside the kernel only at the element the
current outer point (and, for pointwise producers, inner point) wrote. Profitability: fuse
only nodes that share data with the kernel (consumer or sibling reading the same input),
except tiny ones: a kernel of a few elements costs its call, not its loop, so independent
tiny nodes over one space share a kernel (a conv net's per-layer `num_batches_tracked + 1`
are one kernel, not one each).
"""

from __future__ import annotations

import dataclasses

import sympy

from ember.backend import indexing
from ember.backend.ir import nodes as ir
from ember.backend.scheduler.dependencies import output_buffers
from ember.backend.sizes import same

MAX_KERNEL_NODES = 24
TINY = 64  # elements (static) of a node and a kernel that may share it without sharing data


@dataclasses.dataclass(frozen=True, slots=True)
class Loop:
    inner: tuple[int, ...]
    nodes: tuple[ir.Pointwise | ir.Reduction, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Kernel:
    """Nodes are rewritten to kernel variables: x0.. outer, r0.. inner."""

    name: str
    outer: tuple[int, ...]
    loops: tuple[Loop, ...]
    local: frozenset[str]  # buffers that live in registers only (never stored)

    def nodes(self) -> list[ir.Pointwise | ir.Reduction]:
        return [n for lp in self.loops for n in lp.nodes]


Step = Kernel | ir.ExternCall


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    graph: ir.LoopGraph
    steps: tuple[Step, ...]

    def kernels(self) -> list[Kernel]:
        return [s for s in self.steps if isinstance(s, Kernel)]


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _rebase(node, outer: tuple[int, ...]):
    """(node in kernel variables, its inner ranges) when its iteration space is `outer`
    (possibly with dimensions merged or split: 512 rows == 4 x 128) followed by inner ranges;
    None otherwise. Kernel variables: x0.. over `outer`, r0.. over the inner ranges."""
    ranges = node.ranges
    target, acc, m = _prod(outer), 1, 0
    # ranges are >= 2 (or size symbols, >= 2 too): the product grows with each dimension,
    # so the first prefix whose product equals the outer space's is the only candidate
    while m < len(ranges) and not same(acc, target):
        acc *= ranges[m]
        m += 1
    if not same(acc, target):
        return _rebase_inner_run(node, outer) if isinstance(node, ir.Pointwise) else None
    if isinstance(node, ir.Reduction) and m != len(ranges):
        return None
    inner = node.reduction_ranges if isinstance(node, ir.Reduction) else ranges[m:]
    if isinstance(node, ir.Pointwise) and m == len(ranges) and tuple(ranges) == tuple(outer):
        return node, ()
    xs = ir.loop_vars(len(ranges))
    kv = ir.loop_vars(len(outer))
    sub: dict = {}
    if tuple(ranges[:m]) != tuple(outer):
        flat = indexing.strided(kv, ir.contiguous_strides(outer))
        sub.update(zip(xs[:m], indexing.unflatten(flat, ranges[:m])))
    if isinstance(node, ir.Pointwise):
        sub.update(zip(xs[m:], ir.loop_vars(len(inner), "r")))
    return _substituted(node, sub, outer, inner)


def _rebase_inner_run(node: ir.Pointwise, outer: tuple[int, ...]):
    """A pointwise node whose dimensions hold the outer space as a run after its first one,
    with at least one dimension after it: a per-channel statistic's consumer, (N, C, H, W)
    over outer (C,). The run becomes the kernel's outer variables and the other dimensions,
    in order, its inner loop: a batch norm's statistics and its normalization are then one
    kernel per channel (the channel's slice read again from cache, one call instead of two),
    and the innermost loop stays the node's contiguous last dimension."""
    ranges, k = tuple(node.ranges), len(outer)
    starts = [a for a in range(1, len(ranges) - k) if all(map(same, ranges[a : a + k], outer))]
    if not starts:
        return None
    a = starts[0]
    inner = ranges[:a] + ranges[a + k :]
    xs = ir.loop_vars(len(ranges))
    sub = dict(zip(xs[a : a + k], ir.loop_vars(k)))
    sub.update(zip(xs[:a] + xs[a + k :], ir.loop_vars(len(inner), "r")))
    return _substituted(node, sub, outer, inner)


def _substituted(node, sub: dict, outer: tuple[int, ...], inner: tuple[int, ...]):
    """(the node with its loop variables replaced by the kernel's, its inner ranges)."""
    if not sub:
        return node, inner
    env = dict(zip(ir.loop_vars(len(outer)), outer))
    env.update(zip(ir.loop_vars(len(inner), "r"), inner))

    def fix(index: sympy.Expr) -> sympy.Expr:
        return indexing.simplify(index.xreplace(sub), env)

    body = ir.map_loads(node.body, lambda ld: ir.reindex(ld, fix), fix)
    index = fix(node.index)
    if _divides_by_size(index, *(ld.index for ld in ir.loads(body))):
        return None  # a division by a symbolic size per element costs more than a kernel
    return dataclasses.replace(node, body=body, index=index), inner


def _divides_by_size(*indices: sympy.Expr) -> bool:
    """Whether an index divides by a symbolic size (a remapping that the index algebra
    could not take apart, e.g. (8, 4, 64, s) read in the order of (8, 4, s, 64))."""
    return any(
        not f.args[1].is_Integer
        for index in indices
        for f in index.atoms(indexing.FloorDiv, indexing.ModIdx)
    )


def _tiny(space: tuple) -> bool:
    size = _prod(space)
    return isinstance(size, int | sympy.Integer) and size <= TINY


def _signature(node: ir.Pointwise | ir.Reduction) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if isinstance(node, ir.Reduction):
        return node.ranges, node.reduction_ranges
    return node.ranges, ()


def _down_columns(node: ir.Pointwise | ir.Reduction) -> bool:
    """A reduction that walks down columns: some load is contiguous in the last output
    variable and strided in the last reduced one (a bias gradient: rows summed per column).
    It gets a kernel of its own, where codegen reads it in row order (cpp.py's column path);
    fused with row-major pointwise work, it would read memory one column at a time."""
    if not isinstance(node, ir.Reduction) or not node.ranges or not node.reduction_ranges:
        return False  # no reduced loop (only size-1 dims reduced, a 1x1 global pool)
    x = ir.loop_vars(len(node.ranges))[-1]
    r = ir.loop_vars(len(node.reduction_ranges), "r")[-1]
    return any(column_access(ld.index, x, r) for ld in ir.loads(node.body))


def column_access(index: sympy.Expr, x: sympy.Symbol, r: sympy.Symbol) -> bool:
    """Whether a load steps by one element along output variable `x` and by more along
    reduced variable `r` (reading down a column of a row-major matrix)."""
    if index.has(indexing.FloorDiv, indexing.ModIdx):
        return False
    return index.coeff(x) == 1 and index.coeff(r) not in (0, 1)


class _Builder:
    """A kernel under construction."""

    def __init__(self, node: ir.Pointwise | ir.Reduction) -> None:
        self.columns = _down_columns(node)
        self.outer, inner = _signature(node)
        self.loops: list[list] = [[inner, [node]]]
        self.where: dict[str, int] = {node.name: 0}  # buffer -> loop index
        self.produced: dict[str, ir.Pointwise | ir.Reduction] = {node.name: node}
        self.reads: set[str] = ir.node_reads(node)

    def _resplit(self, outer: tuple[int, ...], inner: tuple[int, ...]) -> bool:
        """Re-read a pure pointwise kernel over the same space as outer x inner."""
        if any(lp[0] for lp in self.loops) or not same(_prod(self.outer), _prod(outer + inner)):
            return False
        rebased = [[_rebase(n, outer) for n in lp[1]] for lp in self.loops]
        if any(r is None or r[1] != inner for lp in rebased for r in lp):
            return False
        self.outer = outer
        for lp, new in zip(self.loops, rebased):
            lp[0] = inner
            lp[1] = [n for n, _ in new]
        self.produced = {n.name: n for lp in self.loops for n in lp[1]}
        return True

    def _fit(self, node: ir.Pointwise | ir.Reduction):
        """(node in kernel variables, its inner ranges), or None if shapes do not match."""
        fit = _rebase(node, self.outer)
        if fit is not None:
            return fit
        if isinstance(node, ir.Reduction) and self._resplit(node.ranges, node.reduction_ranges):
            return node, node.reduction_ranges
        return None

    def _legal(self, node, inner) -> tuple[bool, int]:
        """(legal?, the earliest loop index the node may join)."""
        earliest = 0
        for ld in ir.loads(node.body):
            prod = self.produced.get(ld.buffer)
            if prod is None:
                continue
            li = self.where[ld.buffer]
            if isinstance(prod, ir.Reduction):
                if ld.index != prod.index:
                    return False, 0
                earliest = max(earliest, li + 1)
            elif ld.index != prod.index:
                return False, 0
            elif self.loops[li][0] == inner:
                earliest = max(earliest, li)
            elif not self.loops[li][0]:  # made once per outer point: any later loop reads it
                earliest = max(earliest, li + 1)
            else:
                return False, 0
        return True, earliest

    def try_add(self, node: ir.Pointwise | ir.Reduction, unrelated: bool = False) -> bool:
        """Add the node if legal and useful: sharing data with the kernel, or, with
        `unrelated`, both tiny."""
        reads = ir.node_reads(node)
        if unrelated:
            if not all(_tiny(self.outer + tuple(inner)) for inner, _ in self.loops):
                return False
        elif not reads & (self.reads | set(self.produced)):
            return False
        if _down_columns(node) or self.columns and not isinstance(node, ir.Reduction):
            return False
        if sum(len(lp[1]) for lp in self.loops) >= MAX_KERNEL_NODES:
            return False
        saved = (self.outer, [[lp[0], list(lp[1])] for lp in self.loops], dict(self.produced))
        fit = self._fit(node)
        ok, earliest = self._legal(*fit) if fit else (False, 0)
        if not ok:
            self.outer, self.loops, self.produced = saved
            return False
        node, inner = fit
        last = len(self.loops) - 1
        if self.loops[last][0] == inner and earliest <= last:
            self.loops[last][1].append(node)
        else:
            self.loops.append([inner, [node]])
        self.where[node.name] = len(self.loops) - 1
        self.produced[node.name] = node
        self.reads |= reads
        return True

    def build(self, name: str, keep: set[str], readers_in: dict[str, set[int]]) -> Kernel:
        """Freeze; a buffer is local if only this kernel reads it, in a way registers serve:
        a reduction's result, a value read only in its own loop, or one made once per outer
        point (a loop without inner ranges; 16-bit floats aside, whose stores round) that later
        loops read (a batch norm's per-channel scale and shift)."""
        local = set()
        for buf, li in self.where.items():
            if buf in keep:
                continue
            loops_reading = readers_in.get(buf, set())
            prod = self.produced[buf]
            once = not self.loops[li][0] and not prod.dtype.is_half
            if isinstance(prod, ir.Reduction) or loops_reading <= {li} or once:
                local.add(buf)
        loops = tuple(Loop(tuple(i), tuple(ns)) for i, ns in self.loops)
        return Kernel(name, self.outer, loops, frozenset(local))


def schedule(g: ir.LoopGraph) -> Schedule:
    """Greedy in program order: each node joins the kernel before it when legal and useful."""
    steps: list[Step | _Builder] = []
    made_at: dict[str, int] = {b.name: -1 for b in g.inputs}  # buffer -> step index
    for node in g.nodes:
        at = _place(steps, node, made_at)
        if at is None:
            steps.append(node if isinstance(node, ir.ExternCall) else _Builder(node))
            at = len(steps) - 1
        for b in ir.node_outputs(node):
            made_at[b] = at
    return Schedule(g, tuple(_finish(g, steps)))


def _place(steps: list, node: ir.Node, made_at: dict[str, int]) -> int | None:
    """The latest kernel the node can join: its other inputs must exist before that kernel.
    A kernel sharing data with the node comes first; a tiny node that finds none may join
    the latest tiny kernel over its space."""
    if isinstance(node, ir.ExternCall):
        return None
    at = _scan(steps, node, made_at, unrelated=False)
    if at is None and _tiny(sum(_signature(node), ())):
        at = _scan(steps, node, made_at, unrelated=True)
    return at


def _scan(steps: list, node: ir.Node, made_at: dict[str, int], unrelated: bool) -> int | None:
    ready = max((made_at[b] for b in ir.node_reads(node)), default=-1)
    for i in range(len(steps) - 1, -1, -1):
        s = steps[i]
        if isinstance(s, _Builder):
            inside = {b for b in ir.node_reads(node) if made_at.get(b) == i}
            outside_ready = max(
                (made_at[b] for b in ir.node_reads(node) if b not in inside), default=-1
            )
            if outside_ready < i and s.try_add(node, unrelated):
                return i
        if i <= ready:
            return None
    return None


def _finish(g: ir.LoopGraph, steps: list) -> list[Step]:
    """Decide which kernel buffers stay in registers: read only inside their own kernel."""
    outside: set[str] = set(output_buffers(g))
    for s in steps:
        if isinstance(s, ir.ExternCall):
            outside |= ir.node_reads(s)
    owner = {b: i for i, s in enumerate(steps) if isinstance(s, _Builder) for b in s.where}
    loops_reading: dict[str, set[int]] = {}
    for i, s in enumerate(steps):
        if not isinstance(s, _Builder):
            continue
        for li, (_, ns) in enumerate(s.loops):
            for n in ns:
                for b in ir.node_reads(n):
                    if owner.get(b, i) != i:
                        outside.add(b)
                    else:
                        loops_reading.setdefault(b, set()).add(li)
    out: list[Step] = []
    for i, s in enumerate(steps):
        if isinstance(s, _Builder):
            out.append(s.build(f"kernel{i}", outside, loops_reading))
        else:
            out.append(s)
    return out
