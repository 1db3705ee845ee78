"""Values during lowering: lazy expressions (inlined into consumers) and buffer views.

A `LazyValue` is Inductor's unrealized pointwise computation: a function from indices to an
`Expr`, so a chain of pointwise ops becomes one expression and never touches memory. A
`BufferValue` is a strided view of a buffer. `GraphBuilder.realize` turns a lazy value into a
`Pointwise` node writing a new buffer; reductions and extern calls always produce buffers.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ember.backend import indexing
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import DType, Expr, Layout
from ember.backend.sizes import hint


@dataclasses.dataclass(frozen=True, slots=True)
class BufferValue:
    size: tuple[int, ...]
    dtype: Any  # DType, or a torch.dtype kernels cannot hold (only fallbacks touch those)
    buffer: str
    layout: Layout

    def load(self, idx: Sequence[sympy.Expr]) -> Expr:
        index = indexing.strided(idx, self.layout.stride, self.layout.offset)
        return ir.Load(self.buffer, index, self.dtype)


@dataclasses.dataclass(frozen=True, slots=True)
class LazyValue:
    size: tuple[int, ...]
    dtype: DType
    fn: Callable[[Sequence[sympy.Expr]], Expr]

    def load(self, idx: Sequence[sympy.Expr]) -> Expr:
        return self.fn(list(idx))


Value = BufferValue | LazyValue


def expr_size(v: LazyValue) -> tuple[int, int, bool]:
    """(expression nodes, distinct buffers read, whether a transcendental op is among them)
    per element: decides when to stop inlining."""
    idx = ir.loop_vars(len(v.size))
    nodes = list(ir.walk(v.load(idx)))
    reads = len({e.buffer for e in nodes if isinstance(e, ir.Load)})
    return len(nodes), reads, ir.any_transcendental(nodes)


class GraphBuilder:
    """Collects buffers and nodes in program order while the fx graph is lowered."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        """Where the graph runs (a lowering whose runtime check would stall a GPU asks)."""
        self.inputs: list[ir.Buffer] = []
        self.buffers: list[ir.Buffer] = []
        self.nodes: list[ir.Node] = []
        self._names = itertools.count()

    def new_name(self) -> str:
        return f"buf{next(self._names)}"

    def add_input(self, name: str, size, stride, dtype) -> BufferValue:
        layout = Layout(tuple(size), tuple(stride), 0)
        self.inputs.append(ir.Buffer(name, layout, dtype))
        return BufferValue(tuple(size), dtype, name, layout)

    def realize(self, v: Value, stride: Sequence[int] | None = None) -> BufferValue:
        """Materialize a value (as a Pointwise node) unless it already lives in a buffer."""
        if isinstance(v, BufferValue):
            return v
        size = v.size
        stride = tuple(stride) if stride is not None else ir.contiguous_strides(size)
        idx, ranges = iteration(size, stride)
        name = self.new_name()
        layout = Layout(size, stride, 0)
        body = simplified(v.load(idx), ranges, ())
        self.nodes.append(ir.Pointwise(name, ranges, body, indexing.strided(idx, stride), v.dtype))
        self.buffers.append(ir.Buffer(name, layout, v.dtype))
        return BufferValue(size, v.dtype, name, layout)

    def add_reduction(
        self,
        x: Value,
        dims: Sequence[int],
        rtype: ir.ReductionType,
        out_size: tuple[int, ...],
        keepdim: bool,
        dtype: DType,
        acc_dtype: DType,
    ) -> BufferValue:
        """Reduce `x` over `dims` into a new contiguous buffer of shape `out_size`."""
        n = len(x.size)
        kept = [d for d in range(n) if d not in dims and x.size[d] != 1]
        red = [d for d in dims if x.size[d] != 1]
        xv = ir.loop_vars(len(kept))
        idx: list[sympy.Expr] = [sympy.Integer(0)] * n
        for d, v in zip(kept, xv):
            idx[d] = v
        ranges = tuple(x.size[d] for d in kept)
        body, rranges = _reduced_body(x, idx, red, ranges, acc_dtype)
        if keepdim:
            out_idx = [sympy.Integer(0) if d in dims else idx[d] for d in range(n)]
        else:
            out_idx = [idx[d] for d in range(n) if d not in dims]
        layout = Layout.contiguous(out_size)
        index = indexing.strided(out_idx, layout.stride)
        name = self.new_name()
        static = all(isinstance(r, int) for r in rranges)
        if (
            static
            and not ranges
            and _numel(rranges) >= SPLIT_MIN
            and _numel(rranges) % SPLIT_PARTS == 0
        ):
            body, rranges = self._split(body, rranges, rtype, acc_dtype)
        self.nodes.append(ir.Reduction(name, ranges, rranges, rtype, body, index, dtype))
        self.buffers.append(ir.Buffer(name, layout, dtype))
        return BufferValue(out_size, dtype, name, layout)

    def _split(self, body: Expr, rranges, rtype: ir.ReductionType, acc: DType):
        """A full reduction as SPLIT_PARTS partial reductions (a parallel loop) whose results
        a second, small reduction combines: (body over r0.. of the partials, (SPLIT_PARTS,))."""
        n = _numel(rranges)
        chunk = n // SPLIT_PARTS
        x0, r0 = ir.loop_vars(1)[0], ir.loop_vars(1, "r")[0]
        flat = x0 * chunk + r0
        sub = dict(zip(ir.loop_vars(len(rranges), "r"), indexing.unflatten(flat, rranges)))
        env = {x0: SPLIT_PARTS, r0: chunk}

        def fix(index: sympy.Expr) -> sympy.Expr:
            return indexing.simplify(index.xreplace(sub), env)

        part_body = ir.map_loads(body, lambda ld: ir.reindex(ld, fix), fix)
        name = self.new_name()
        self.nodes.append(ir.Reduction(name, (SPLIT_PARTS,), (chunk,), rtype, part_body, x0, acc))
        self.buffers.append(ir.Buffer(name, Layout.contiguous((SPLIT_PARTS,)), acc))
        return ir.Load(name, r0, acc), (SPLIT_PARTS,)

    def add_extern(self, call: ir.ExternCall, layouts: Sequence[Layout], dtypes) -> None:
        self.nodes.append(call)
        for name, layout, dtype in zip(call.outputs, layouts, dtypes):
            self.buffers.append(ir.Buffer(name, layout, dtype))


def _reduced_body(x: Value, idx: list, red: list[int], ranges: tuple[int, ...], acc: DType):
    """(body, reduction ranges) of reducing `x` over dims `red`, `idx` holding the kept
    dims' variables. Several reduced dims that one index variable walks without div/mod (a
    bias gradient summed over batch and sequence) become one reduction loop, so the
    reduction is a single loop down columns (which codegen reads in row order) instead of
    a loop nest of strided reads."""
    sizes = tuple(x.size[d] for d in red)
    if len(red) > 1:
        merged = list(idx)
        for d, v in zip(red, indexing.unflatten(ir.loop_vars(1, "r")[0], sizes)):
            merged[d] = v
        body = simplified(cast(x.load(merged), acc), ranges, (_numel(sizes),))
        if not any(ld.index.has(indexing.FloorDiv, indexing.ModIdx) for ld in ir.loads(body)):
            return body, (_numel(sizes),)
    for d, v in zip(red, ir.loop_vars(len(red), "r")):
        idx[d] = v
    return simplified(cast(x.load(idx), acc), ranges, sizes), sizes


SPLIT_MIN = 1 << 16  # elements of a full reduction worth splitting across threads
SPLIT_PARTS = 64


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for v in sizes:
        n *= v
    return n


def iteration(
    size: Sequence[int], stride: Sequence[int] | None = None
) -> tuple[list[sympy.Expr], tuple[int, ...]]:
    """Index list over `size`: one loop variable per non-unit dimension, outermost first in
    memory order (largest stride first) so that the innermost loop walks contiguous memory."""
    dims = [d for d, s in enumerate(size) if s != 1]
    if stride is not None:
        dims.sort(key=lambda d: -hint(stride[d]))  # loop order: speed only
    idx: list[sympy.Expr] = [sympy.Integer(0)] * len(size)
    for k, d in enumerate(dims):
        idx[d] = sympy.Symbol(f"x{k}", integer=True, nonnegative=True)
    return idx, tuple(size[d] for d in dims)


def cast(e: Expr, dtype: DType) -> Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, ir.Const):
        return ir.Const(e.value, dtype)
    return ir.Cast(e, dtype)


def simplified(body: Expr, ranges: tuple[int, ...], rranges: tuple[int, ...]) -> Expr:
    """`body` with the div/mod its loop ranges make exact removed from every load index."""
    env = dict(zip(ir.loop_vars(len(ranges)), ranges))
    env.update(zip(ir.loop_vars(len(rranges), "r"), rranges))

    def fix(ld: ir.Load) -> Expr:
        if ld.mask:
            return ir.reindex(ld, _masked_simplifier(ld.mask, env))
        new = indexing.simplify(ld.index, env)
        return ld if new is ld.index else ir.Load(ld.buffer, new, ld.dtype)

    return ir.map_loads(body, fix)


def _masked_simplifier(masks: tuple[ir.Mask, ...], env: dict):
    """Simplification of a masked load's indices that uses the narrower range its masks
    give a loop variable (a piece of a concatenation at 256 <= x2 < 512 reads with
    x2 - 256 in [0, 256), which lets a reshape's div/mod go): the variable is shifted to
    start at 0, simplified with the masked extent, and shifted back."""
    local, shift, back = dict(env), {}, {}
    for m in masks:
        v = m.value
        static = all(isinstance(b, int) for b in (m.lo, m.hi, env.get(v, 0)))
        if static and isinstance(v, sympy.Symbol) and v in env and v not in shift:
            fresh = sympy.Symbol(f"{v.name}_m", integer=True, nonnegative=True)
            shift[v], back[fresh] = fresh + m.lo, v - m.lo
            local[fresh] = min(m.hi, env[v]) - m.lo

    def simplify(index: sympy.Expr) -> sympy.Expr:
        if not shift:
            return indexing.simplify(index, env)
        return sympy.expand(indexing.simplify(index.xreplace(shift), local).xreplace(back))

    return simplify
