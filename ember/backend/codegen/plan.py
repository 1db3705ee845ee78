"""Kernel plans: what both printers (C++ and Triton) read about a scheduled kernel.

The scheduler decides which nodes share a kernel and in which loops; a plan adds what every
code generator needs to know before printing a line: the kernel's form (pure pointwise,
per-row loops, or reductions down columns), its parameters in signature order (buffers read,
buffers written, size symbols), and the accumulator dtype and identity of each reduction.
Two decisions only the CPU's vector loops use are made here too, so that cpp.py only prints:
where a pure pointwise kernel's innermost loop is cut (at the bounds of a concatenation's
pieces, into blocks where loads divide the index), and which rows a multi-pass kernel
prefetches. The printers then differ only in how they spell loops and expressions.
`plan_str` shows the plans on the "schedule" log channel.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import sympy
import torch

from ember.backend import indexing, sizes
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ReductionType
from ember.backend.scheduler.fusion import Kernel, column_access

INFIX = {
    B.ADD: "+",
    B.SUB: "-",
    B.MUL: "*",
    B.EQ: "==",
    B.NE: "!=",
    B.LT: "<",
    B.LE: "<=",
    B.GT: ">",
    B.GE: ">=",
    B.BITWISE_AND: "&",
    B.BITWISE_OR: "|",
    B.BITWISE_XOR: "^",
}
"""Binary ops that C and Triton's Python spell alike, as infix operators."""


class Form(enum.Enum):
    """How a kernel walks memory."""

    POINTWISE = "pointwise"  # every loop covers the outer space alone
    ROWS = "rows"  # per outer point, loops over inner (reduced) ranges
    COLUMNS = "columns"  # one loop of reductions reading down columns of a row-major buffer


@dataclasses.dataclass(frozen=True, slots=True)
class KernelPlan:
    kernel: Kernel
    form: Form
    reads: tuple[str, ...]  # buffers read and not produced by the kernel, sorted
    writes: tuple[str, ...]  # buffers the kernel stores, sorted
    sizes: tuple[str, ...]  # size symbols its bounds and indices use, sorted
    segments: tuple[Segment, ...] | None  # a pure pointwise kernel's innermost loop, cut
    prefetch: tuple[tuple[str, sympy.Expr], ...]  # rows the second pass fetches ahead

    @property
    def params(self) -> list[str]:
        """Signature order: buffers read, buffers written, then size symbols."""
        return [*self.reads, *self.writes, *self.sizes]


def plan_kernel(k: Kernel, buffers: dict[str, ir.Buffer]) -> KernelPlan:
    written = sorted(n.name for n in k.nodes() if n.name not in k.local)
    read: set[str] = set()
    for n in k.nodes():
        read |= ir.node_reads(n)
    produced = {n.name for n in k.nodes()}
    if column_reduction(k):
        form = Form.COLUMNS
    elif all(not lp.inner for lp in k.loops):
        form = Form.POINTWISE
    else:
        form = Form.ROWS
    cut = segments(k) if form == Form.POINTWISE and k.outer else None
    reads = tuple(sorted(read - produced))
    return KernelPlan(k, form, reads, tuple(written), kernel_sizes(k), cut, next_rows(k, buffers))


def plan_str(plan: KernelPlan) -> str:
    """One line per plan, for the schedule log."""
    text = f"{plan.kernel.name}: {plan.form.value}({', '.join(plan.params)})"
    if plan.segments:
        text += " segments=" + " ".join(f"[{s.lo},{s.hi})/{s.block}" for s in plan.segments)
    if plan.prefetch:
        text += f" prefetch={[b for b, _ in plan.prefetch]}"
    return text


def acc_type(n: ir.Reduction) -> DType:
    """The dtype a reduction accumulates in (16-bit floats sum in float, as eager does)."""
    return n.dtype.computed_as


def identity(kind: ReductionType, dtype: DType) -> float | int | bool:
    """The reduction's starting value (an empty reduction's result)."""
    if kind in (ReductionType.SUM, ReductionType.PROD):
        one = kind == ReductionType.PROD
        return one if dtype == DType.BOOL else int(one)
    low = kind == ReductionType.MAX  # max starts at the lowest value
    if dtype.is_float:
        return -math.inf if low else math.inf
    if dtype == DType.BOOL:
        return not low
    limits = torch.iinfo(dtype.torch)
    return limits.min if low else limits.max


def column_reduction(k: Kernel) -> bool:
    """One loop of reductions over one dim whose loads are contiguous in the output index
    and strided in the reduced one (x.sum(0) of a row-major matrix), or depend on only one
    of the two."""
    if len(k.outer) != 1 or len(k.loops[0].inner) != 1:
        return False
    if not all(isinstance(n, ir.Reduction) for n in k.loops[0].nodes):
        return False
    epilogue = [n for lp in k.loops[1:] for n in lp.nodes]
    if any(lp.inner for lp in k.loops[1:]) or any(isinstance(n, ir.Reduction) for n in epilogue):
        return False
    x0, r0 = ir.loop_vars(1)[0], ir.loop_vars(1, "r")[0]
    loads = [ld.index for n in k.loops[0].nodes for ld in ir.loads(n.body)]
    # besides the column reads: per-row values (a layer norm's mean and rstd) and per-column
    # ones read the same in either order
    return any(column_access(i, x0, r0) for i in loads) and all(
        column_access(i, x0, r0) or not (i.has(x0) and i.has(r0)) for i in loads
    )


def kernel_sizes(k: Kernel) -> tuple[str, ...]:
    """Names of the size symbols a kernel needs, sorted (they follow its pointers)."""
    found = sizes.symbols(k.outer, *(lp.inner for lp in k.loops))
    for n in k.nodes():
        found |= sizes.symbols(n.index)
        for e in ir.walk(n.body):
            if isinstance(e, ir.Load):
                found |= sizes.symbols(e.index, *((m.value, m.lo, m.hi) for m in e.mask))
            elif isinstance(e, ir.IndexValue):
                found |= sizes.symbols(e.index)
    return tuple(sorted(s.name for s in found))


def prod(xs) -> ir.Size:
    out = 1
    for x in xs:
        out *= x
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """A range [lo, hi) of a pure pointwise kernel's innermost variable and its nodes
    specialized to it; block > 1: the variable is lo + b*block + l, with the nodes' indices
    rewritten in b and l."""

    lo: int
    hi: int
    block: int
    nodes: list[ir.Pointwise]


def segments(k: Kernel) -> tuple[Segment, ...] | None:
    """How a pure pointwise kernel's innermost loop runs, when not as one plain loop: parts
    cut at the bounds of masks on the innermost variable (a concatenation along it), each in
    blocks when its loads divide the variable (a view that splits the innermost dim, like
    heads x head_dim)."""
    n, size = len(k.outer), k.outer[-1]
    var = ir.loop_vars(n)[-1]
    masks = [m for node in k.nodes() for ld in ir.loads(node.body) for m in ld.mask]
    bounds = [b for m in masks if m.value == var for b in (m.lo, m.hi)]
    if not all(isinstance(b, int) for b in (size, *bounds)):
        return None  # cut points of symbolic sizes: one loop with masked loads
    cuts = {0, size} | {min(max(b, 0), size) for b in bounds}
    edges = sorted(cuts)
    plan = []
    for lo, hi in zip(edges, edges[1:]):
        nodes = [_within(nd, var, lo, hi) for nd in k.nodes()] if len(edges) > 2 else k.nodes()
        plan.append(_blocked(nodes, var, lo, hi, k.outer[:-1]))
    return None if len(plan) == 1 and plan[0].block == 1 else tuple(plan)


MIN_SPLIT = 16  # smallest inner block worth a loop of its own (one AVX-512 vector of floats)


def _blocked(nodes: list, var, lo: int, hi: int, outer: tuple[int, ...]) -> Segment:
    """The part [lo, hi) in blocks of d when that turns every div/mod of `var` in the nodes'
    loads into plain block and lane indices; else unsplit (block 1)."""
    found = [f.args[1] for f in _divmods(nodes) if f.args[0].has(var)]
    if not all(d.is_Integer for d in found):
        return Segment(lo, hi, 1, nodes)  # a symbolic divisor: one plain loop
    divisors = {int(d) for d in found}
    d = min(divisors, default=1)
    if d < MIN_SPLIT or (hi - lo) % d or any(x % d for x in divisors):
        return Segment(lo, hi, 1, nodes)
    block, lane = split_vars(var)
    env = dict(zip(ir.loop_vars(len(outer)), outer)) | {block: (hi - lo) // d, lane: d}
    split = [_substituted(node, var, lo + block * d + lane, env) for node in nodes]
    if any(f.args[0].has(lane) for f in _divmods(split)):
        return Segment(lo, hi, 1, nodes)
    return Segment(lo, hi, d, split)


def _divmods(nodes: list) -> list:
    """The FloorDiv/ModIdx terms of the nodes' load, mask and index-value indices."""
    out = []
    for node in nodes:
        for e in ir.walk(node.body):
            if isinstance(e, ir.Load):
                indices = [e.index, *(m.value for m in e.mask)]
            else:
                indices = [e.index] if isinstance(e, ir.IndexValue) else []
            for index in indices:
                out.extend(index.atoms(indexing.FloorDiv, indexing.ModIdx))
    return out


def split_vars(var):
    return (
        sympy.Symbol(f"{var.name}b", integer=True, nonnegative=True),
        sympy.Symbol(f"{var.name}l", integer=True, nonnegative=True),
    )


def _substituted(node: ir.Pointwise, var, value, env: dict) -> ir.Pointwise:
    """`node` with `var` replaced by `value`, indices simplified over `env`."""

    def fix(index):
        return indexing.simplify(sympy.expand(index.xreplace({var: value})), env)

    body = ir.map_loads(node.body, lambda ld: ir.reindex(ld, fix), fix)
    return dataclasses.replace(node, body=body, index=fix(node.index))


def _within(node: ir.Pointwise, var, lo: int, hi: int) -> ir.Pointwise:
    """`node` for lo <= var < hi only: masks on `var` resolved (dropped where they hold,
    the load replaced by 0 where they do not) and comparisons of `var` with constants folded,
    with the `Where`s they decide."""

    def fold(e: ir.Expr) -> ir.Expr:
        if isinstance(e, ir.Load):
            if any(m.value == var and (hi <= m.lo or m.hi <= lo) for m in e.mask):
                return ir.Const(False if e.dtype == DType.BOOL else 0, e.dtype)
            keep = tuple(m for m in e.mask if not (m.value == var and m.lo <= lo and hi <= m.hi))
            return ir.Load(e.buffer, e.index, e.dtype, keep)
        if isinstance(e, ir.Binary):
            a, b = fold(e.a), fold(e.b)
            if e.op == B.LT and isinstance(a, ir.IndexValue) and a.index == var:
                if isinstance(b, ir.Const) and (hi <= b.value or lo >= b.value):
                    return ir.Const(hi <= b.value, DType.BOOL)
            return ir.Binary(e.op, a, b, e.dtype)
        if isinstance(e, ir.Where):
            cond = fold(e.cond)
            if isinstance(cond, ir.Const):
                return fold(e.a) if cond.value else fold(e.b)
            return ir.Where(cond, fold(e.a), fold(e.b), e.dtype)
        if isinstance(e, ir.Unary):
            return ir.Unary(e.op, fold(e.x), e.dtype)
        if isinstance(e, ir.Cast):
            return ir.Cast(fold(e.x), e.dtype)
        return e

    return dataclasses.replace(node, body=fold(node.body))


R0 = ir.loop_vars(1, "r")[0]
PREFETCH_MIN_BYTES = 1 << 20  # rows in all below which they stay in cache between kernels


def next_rows(k: Kernel, buffers: dict[str, ir.Buffer]) -> tuple[tuple[str, sympy.Expr], ...]:
    """What the second loop of a kernel making several passes over each outer point's row
    prefetches: the row its first loop reads from memory, at the next outer point (each
    buffer, index at the next point with r0 free). The first pass waits on memory while
    the later ones run from cache, and the hardware prefetcher does not run ahead across
    the passes; fetching the next row during the second pass overlaps the two (nn.LayerNorm
    4096x1024: 1.39 -> 1.03 ms in a hand-written C++ test, prefetching in the last pass
    instead 1.19 ms). Only contiguous row reads of large inputs, so a line is one fetch."""
    if len(k.loops) < 2 or not k.outer:
        return ()
    first, second = k.loops[0], k.loops[1]
    if len(first.inner) != 1 or second.inner != first.inner:
        return ()
    x = ir.loop_vars(len(k.outer))[-1]
    produced = {n.name for n in k.nodes()}
    rows: dict[str, sympy.Expr] = {}
    for node in first.nodes:
        for ld in ir.loads(node.body):
            divided = ld.index.has(indexing.FloorDiv, indexing.ModIdx)
            contiguous = ld.index.coeff(R0) == 1 and not divided
            if ld.buffer in produced or ld.mask or not contiguous or not ld.index.has(x):
                continue
            rows[ld.buffer] = ld.index.subs(x, x + 1)
    size = prod(k.outer) * first.inner[0]
    # symbolic sizes: prefetch (a hint is one size of many; rows served dynamically are
    # typically large, and a prefetch of small rows costs a few instructions per row)
    if (
        isinstance(size, int)
        and sum(size * buffers[b].dtype.itemsize for b in rows) < PREFETCH_MIN_BYTES
    ):
        return ()
    return tuple(sorted(rows.items()))
