"""Reduction lowerings: sum/mean/amax/amin/prod/var, each a `Reduction` node over a value.

The reduced value is inlined into the reduction's body (no intermediate buffer), and results
that are only a pointwise function of a reduction (mean = sum / n) stay lazy so that they are
inlined into their consumers, where the scheduler can fuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ReductionType
from ember.backend.lowering.pointwise import bin_, const
from ember.backend.lowering.registry import LowerCtx, NotLowered, opmath, register
from ember.backend.lowering.values import LazyValue, Value, cast

aten = torch.ops.aten


def norm_dims(dims: Any, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(ndim, 1) for d in dims}) if ndim else []


def reduce(
    ctx: LowerCtx,
    x: Value,
    dims: Sequence[int],
    rtype: ReductionType,
    keepdim: bool,
    out_size: tuple[int, ...],
    dtype: DType,
) -> Value:
    """A reduction node over `x`; `dtype` is the result type (accumulation in its opmath)."""
    if not isinstance(x.dtype, DType):
        raise NotLowered(f"dtype {x.dtype}")
    if rtype in (ReductionType.MAX, ReductionType.MIN) and any(x.size[d] == 0 for d in dims):
        raise NotLowered("max/min of an empty dimension raises in eager")
    return ctx.builder.add_reduction(x, dims, rtype, out_size, keepdim, dtype, opmath(dtype))


def numel(size: Sequence[int], dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= size[d]
    return n


def scale(v: Value, n: Any, dtype: DType) -> LazyValue:
    """`v / n` as a lazy value (a mean is a sum over n), inlined into its consumers."""
    comp = opmath(dtype)

    def load(idx):
        return cast(bin_(B.DIV, cast(v.load(idx), comp), const(n, comp)), dtype)

    return LazyValue(v.size, dtype, load)


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: LowerCtx, x: Value, dims=None, keepdim=False, dtype=None) -> Value:
    d = norm_dims(dims, len(x.size))
    return reduce(ctx, x, d, ReductionType.SUM, keepdim, ctx.out_size, ctx.out_dtype)


@register(aten.prod.dim_int, aten.prod.default)
def _prod(ctx: LowerCtx, x: Value, dim=None, keepdim=False, dtype=None) -> Value:
    d = norm_dims(dim, len(x.size))
    return reduce(ctx, x, d, ReductionType.PROD, keepdim, ctx.out_size, ctx.out_dtype)


@register(aten.amax.default)
def _amax(ctx: LowerCtx, x: Value, dims=(), keepdim=False) -> Value:
    d = norm_dims(dims, len(x.size))
    return reduce(ctx, x, d, ReductionType.MAX, keepdim, ctx.out_size, ctx.out_dtype)


@register(aten.amin.default)
def _amin(ctx: LowerCtx, x: Value, dims=(), keepdim=False) -> Value:
    d = norm_dims(dims, len(x.size))
    return reduce(ctx, x, d, ReductionType.MIN, keepdim, ctx.out_size, ctx.out_dtype)


@register(aten.max.default)
def _max_all(ctx: LowerCtx, x: Value) -> Value:
    d = list(range(len(x.size)))
    return reduce(ctx, x, d, ReductionType.MAX, False, ctx.out_size, ctx.out_dtype)


@register(aten.min.default)
def _min_all(ctx: LowerCtx, x: Value) -> Value:
    d = list(range(len(x.size)))
    return reduce(ctx, x, d, ReductionType.MIN, False, ctx.out_size, ctx.out_dtype)


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx: LowerCtx, x: Value, dims=None, keepdim=False, dtype=None) -> Value:
    out = ctx.out_dtype
    if not out.is_float:
        raise NotLowered("integer mean")
    d = norm_dims(dims, len(x.size))
    s = reduce(ctx, x, d, ReductionType.SUM, keepdim, ctx.out_size, opmath(out))
    return scale(s, numel(x.size, d), out)


def var_parts(
    ctx: LowerCtx, x: Value, d: list[int], out_size: tuple[int, ...], out: DType, keepdim: bool
) -> tuple[LazyValue, Value]:
    """(mean with kept dims, sum of squared deviations): two reductions the scheduler fuses."""
    comp = opmath(out)
    keep_size = tuple(1 if k in d else s for k, s in enumerate(x.size))
    total = reduce(ctx, x, d, ReductionType.SUM, True, keep_size, comp)
    mean = scale(total, numel(x.size, d), comp)

    def sq(idx):
        diff = bin_(B.SUB, cast(x.load(idx), comp), mean.load(_kept(idx, d)))
        return bin_(B.MUL, diff, diff)

    dev = LazyValue(x.size, comp, sq)
    m2 = reduce(ctx, dev, d, ReductionType.SUM, keepdim, out_size, comp)
    return mean, m2


def _kept(idx, dims):
    from sympy import Integer

    return [Integer(0) if k in dims else i for k, i in enumerate(idx)]


@register(aten.var.correction, aten.var.dim)
def _var(ctx: LowerCtx, x: Value, dims=None, *args: Any, **kwargs: Any) -> Value:
    out = ctx.out_dtype
    if not out.is_float:
        raise NotLowered("integer var")
    correction, keepdim = _var_args(ctx, args, kwargs)
    d = norm_dims(dims, len(x.size))
    _, m2 = var_parts(ctx, x, d, ctx.out_size, out, keepdim)
    n = numel(x.size, d) - correction
    return scale(m2, max(n, 0) if isinstance(n, int | float) else n, out)


def _var_args(ctx: LowerCtx, args, kwargs) -> tuple[float, bool]:
    if ctx.node.target is aten.var.dim:
        unbiased = args[0] if args else kwargs.get("unbiased", True)
        keepdim = args[1] if len(args) > 1 else kwargs.get("keepdim", False)
        return (1 if unbiased else 0), keepdim
    correction = kwargs.get("correction", args[0] if args else None)
    keepdim = kwargs.get("keepdim", args[1] if len(args) > 1 else False)
    return (1 if correction is None else correction), keepdim
