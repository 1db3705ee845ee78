"""Copies that place one tensor's elements into another: slice_scatter and select_scatter
(what functionalization makes of `out[:, 1:] = src` and `out[:, 0] = v`, as in transformers'
`shift_tokens_right`) and repeat, as lazy values.

Each output element reads the piece where its position falls inside it and the base
elsewhere (repeat: the source at its position modulo the source's size), so the copy is
written by one kernel together with what produces or consumes it, instead of an aten call
per piece. Codegen evaluates both sides of the choice for every element: the piece's loads
are masked to its range, and an integer piece is read from memory as is (a computed one,
evaluated outside its range on masked-out zeros, could divide by zero).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from ember.backend import indexing
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import DType, Expr
from ember.backend.lowering.pointwise import in_range, masked, where
from ember.backend.lowering.registry import LowerCtx, NotLowered, register
from ember.backend.lowering.values import LazyValue, Value, cast

aten = torch.ops.aten


def _placed(
    ctx: LowerCtx,
    base: Value,
    piece: Value,
    d: int,
    lo: int,
    hi: int,
    piece_index: Callable[[list[sympy.Expr]], list[sympy.Expr]],
) -> LazyValue:
    """The base with positions lo <= idx[d] < hi taken from `piece` at piece_index(idx)."""
    out, size = ctx.out_dtype, ctx.out_size
    if not isinstance(base.dtype, DType) or not isinstance(piece.dtype, DType):
        raise NotLowered("scatter operand")
    if not out.is_float:
        piece = ctx.builder.realize(piece)

    def load(idx: list[sympy.Expr]) -> Expr:
        pos = idx[d]
        inside = masked(cast(piece.load(piece_index(idx)), out), (ir.Mask(pos, lo, hi),))
        return where(in_range(pos, lo, hi), inside, cast(base.load(idx), out))

    return LazyValue(size, out, load)


@register(aten.slice_scatter.default)
def _slice_scatter(
    ctx: LowerCtx, base: Value, src: Value, dim: int = 0, start=None, end=None, step: int = 1
) -> LazyValue:
    size = ctx.out_size
    d = dim % len(size)
    bounds = (size[d], start, end, step)
    if not all(isinstance(v, int | None) for v in bounds) or step != 1:
        raise NotLowered("slice_scatter with symbolic bounds or a step")
    lo, hi, _ = slice(start, end, step).indices(size[d])
    hi = max(hi, lo)

    def piece_index(idx: list[sympy.Expr]) -> list[sympy.Expr]:
        return [*idx[:d], idx[d] - lo, *idx[d + 1 :]]

    return _placed(ctx, base, src, d, lo, hi, piece_index)


@register(aten.select_scatter.default)
def _select_scatter(ctx: LowerCtx, base: Value, src: Value, dim: int, index: int) -> LazyValue:
    size = ctx.out_size
    d = dim % len(size)
    if not isinstance(size[d], int) or not isinstance(index, int):
        raise NotLowered("select_scatter with a symbolic size or index")
    at = index % size[d]
    return _placed(ctx, base, src, d, at, at + 1, lambda idx: [*idx[:d], *idx[d + 1 :]])


@register(aten.repeat.default)
def _repeat(ctx: LowerCtx, x: Value, repeats: Any) -> LazyValue:
    """out[i] = x[i mod x's size] per dim (x's dims are the trailing ones of the output)."""
    out, size = ctx.out_dtype, ctx.out_size
    lead = len(size) - len(x.size)
    if not all(isinstance(s, int) for s in (*x.size, *size)):
        raise NotLowered("repeat with symbolic sizes")

    def source(i: sympy.Expr, k: int) -> sympy.Expr:
        n = x.size[k]
        if size[lead + k] == n:
            return i
        return sympy.Integer(0) if n == 1 else indexing.ModIdx(i, n)

    def load(idx: list[sympy.Expr]) -> Expr:
        return cast(x.load([source(i, k) for k, i in enumerate(idx[lead:])]), out)

    return LazyValue(size, out, load)
