"""ember's decompositions of composite ops into primitives that fuse.

Softmax, log-softmax, layer norm, RMS norm, dropout in eval and addmm-with-epilogue are
written here as compositions of ember's own reductions and lazy pointwise values, so the
scheduler sees one reduction kernel family (softmax: max, sum-of-exp and the normalizing
write in one pass over memory) instead of opaque aten calls.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, ExternKind, ReductionType
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.lowering import pointwise as pw
from ember.backend.lowering.fallback import extern
from ember.backend.lowering.gemm import RESHAPES, batched, gemm
from ember.backend.lowering.reductions import norm_dims, numel, reduce, var_parts
from ember.backend.lowering.registry import LOWERINGS, LowerCtx, NotLowered, opmath, register
from ember.backend.lowering.values import LazyValue, Value, cast

aten = torch.ops.aten


def _kept(idx, dims):
    return [sympy.Integer(0) if k in dims else i for k, i in enumerate(idx)]


def _keep_size(size, dims):
    return tuple(1 if k in dims else s for k, s in enumerate(size))


def _softmax_parts(ctx: LowerCtx, x: Value, dim: int, exp_op: U = U.EXP_SHIFTED):
    """(shifted input, exp of it, sum of exp, dims, row max) of a numerically stable
    softmax over `dim`; `exp_op` EXP_SHIFTED_SUMMAND where only the sum is read."""
    if not isinstance(x.dtype, DType) or not x.dtype.is_float:
        raise NotLowered("softmax of a non-float")
    comp = opmath(ctx.out_dtype)
    d = norm_dims(dim, len(x.size))
    ks = _keep_size(x.size, d)
    m = reduce(ctx, x, d, ReductionType.MAX, True, ks, comp)

    def shifted(idx):
        return pw.bin_(B.SUB, cast(x.load(idx), comp), m.load(_kept(idx, d)))

    sh = LazyValue(x.size, comp, shifted)
    e = LazyValue(x.size, comp, lambda idx: pw.un(exp_op, sh.load(idx)))
    s = reduce(ctx, e, d, ReductionType.SUM, True, ks, comp)
    return sh, e, s, d, m


@register(aten._softmax.default)
def _softmax(ctx: LowerCtx, x: Value, dim: int, half_to_float: bool = False) -> Value:
    return _normalized(ctx, x, dim, safe=False)


@register(aten._safe_softmax.default)
def _safe_softmax(ctx: LowerCtx, x: Value, dim: int, dtype: Any = None) -> Value:
    """Softmax whose rows of only -inf give zeros instead of NaN (SDPA's masked rows): a row
    is all -inf exactly when its max is, so the max that softmax computes anyway decides."""
    if dtype is not None and DType.of(dtype) != x.dtype:
        raise NotLowered("_safe_softmax with a dtype conversion")
    return _normalized(ctx, x, dim, safe=True)


def _normalized(ctx: LowerCtx, x: Value, dim: int, safe: bool) -> Value:
    _, e, s, d, m = _softmax_parts(ctx, x, dim)
    out = ctx.out_dtype

    def load(idx):
        # times the reciprocal, as eager's kernel does (and cheaper than a division)
        inv = pw.un(U.RECIPROCAL, s.load(_kept(idx, d)))
        v = pw.bin_(B.MUL, e.load(idx), inv)
        if safe:
            row_max = m.load(_kept(idx, d))
            all_masked = pw.bin_(B.EQ, row_max, pw.const(float("-inf"), row_max.dtype))
            v = pw.where(all_masked, pw.const(0.0, opmath(out)), v)
        return cast(v, out)

    return LazyValue(x.size, out, load)


@register(aten._log_softmax.default)
def _log_softmax(ctx: LowerCtx, x: Value, dim: int, half_to_float: bool = False) -> Value:
    sh, _, s, d, _ = _softmax_parts(ctx, x, dim, U.EXP_SHIFTED_SUMMAND)
    out = ctx.out_dtype

    def load(idx):
        return cast(pw.bin_(B.SUB, sh.load(idx), pw.un(U.LOG, s.load(_kept(idx, d)))), out)

    return LazyValue(x.size, out, load)


def _row_sum(ctx: LowerCtx, size, dims, comp: DType, load) -> Value:
    """sum over `dims` (kept) of the lazy per-element value `load(idx)`."""
    return reduce(
        ctx,
        LazyValue(size, comp, load),
        dims,
        ReductionType.SUM,
        True,
        _keep_size(size, dims),
        comp,
    )


@register(aten._softmax_backward_data.default)
def _softmax_backward(ctx: LowerCtx, grad: Value, out: Value, dim: int, input_dtype) -> Value:
    """grad_in = out * (grad - sum(grad * out)) over the row, as eager's kernel computes it."""
    comp, res = opmath(ctx.out_dtype), ctx.out_dtype
    d = norm_dims(dim, len(out.size))
    s = _row_sum(
        ctx,
        out.size,
        d,
        comp,
        lambda idx: pw.bin_(B.MUL, cast(grad.load(idx), comp), cast(out.load(idx), comp)),
    )

    def load(idx):
        diff = pw.bin_(B.SUB, cast(grad.load(idx), comp), s.load(_kept(idx, d)))
        return cast(pw.bin_(B.MUL, cast(out.load(idx), comp), diff), res)

    return LazyValue(out.size, res, load)


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward(ctx: LowerCtx, grad: Value, out: Value, dim: int, input_dtype) -> Value:
    """grad_in = grad - exp(out) * sum(grad) over the row."""
    comp, res = opmath(ctx.out_dtype), ctx.out_dtype
    d = norm_dims(dim, len(out.size))
    s = _row_sum(ctx, out.size, d, comp, lambda idx: cast(grad.load(idx), comp))

    def load(idx):
        p = pw.un(U.EXP, cast(out.load(idx), comp))
        scaled = pw.bin_(B.MUL, p, s.load(_kept(idx, d)))
        return cast(pw.bin_(B.SUB, cast(grad.load(idx), comp), scaled), res)

    return LazyValue(out.size, res, load)


def _affine(x_norm: LazyValue, weight, bias, comp: DType, out: DType) -> LazyValue:
    """x_norm * weight + bias, with weight/bias broadcast over the trailing dims."""
    size = x_norm.size

    def load(idx):
        v = x_norm.load(idx)
        if weight is not None:
            v = pw.bin_(B.MUL, v, cast(pw.broadcast_load(weight, idx, size), comp))
        if bias is not None:
            v = pw.bin_(B.ADD, v, cast(pw.broadcast_load(bias, idx, size), comp))
        return cast(v, out)

    return LazyValue(size, out, load)


@register(aten.native_layer_norm.default)
def _layer_norm(ctx: LowerCtx, x: Value, shape, weight, bias, eps: float) -> list[Value]:
    if not isinstance(x.dtype, DType) or not x.dtype.is_float:
        raise NotLowered("layer norm of a non-float")
    out = DType.of(ctx.meta[0].dtype)
    comp = opmath(out)
    d = list(range(len(x.size) - len(shape), len(x.size)))
    ks = _keep_size(x.size, d)
    mean, m2 = var_parts(ctx, x, d, ks, comp, True)
    n = numel(x.size, d)

    def rstd_load(idx):
        var = pw.bin_(B.DIV, m2.load(idx), pw.const(n, comp))
        return pw.un(U.RSQRT, pw.bin_(B.ADD, var, pw.const(eps, comp)))

    rstd = LazyValue(ks, comp, rstd_load)

    def norm(idx):
        k = _kept(idx, d)
        diff = pw.bin_(B.SUB, cast(x.load(idx), comp), mean.load(k))
        return pw.bin_(B.MUL, diff, rstd.load(k))

    y = _affine(LazyValue(x.size, comp, norm), weight, bias, comp, out)
    stat = DType.of(ctx.meta[1].dtype)
    return [y, _as(mean, stat), _as(rstd, stat)]


@register(aten.native_layer_norm_backward.default)
def _layer_norm_backward(
    ctx: LowerCtx, grad: Value, x: Value, shape, mean: Value, rstd: Value, weight, bias, mask
) -> list[Value | None]:
    """Layer norm's input, weight and bias gradients from the saved mean and rstd:
    dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)) over each normalized row (both
    sums in one kernel with the epilogue), dw = sum(g * xhat) and db = sum(g) over the rows."""
    if not isinstance(x.dtype, DType) or not x.dtype.is_float:
        raise NotLowered("layer norm backward of a non-float")
    axis = len(x.size) - len(shape)
    if axis == 0:
        raise NotLowered("layer norm over every dim")
    comp = opmath(x.dtype)
    d, rows = list(range(axis, len(x.size))), list(range(axis))
    n = pw.const(numel(x.size, d), comp)

    def xhat(idx):
        k = _kept(idx, d)
        diff = pw.bin_(B.SUB, cast(x.load(idx), comp), cast(mean.load(k), comp))
        return pw.bin_(B.MUL, diff, cast(rstd.load(k), comp))

    def g(idx):
        return cast(grad.load(idx), comp)

    def gw(idx):
        if weight is None:
            return g(idx)
        return pw.bin_(B.MUL, g(idx), cast(pw.broadcast_load(weight, idx, x.size), comp))

    out: list[Value | None] = [None, None, None]
    if mask[0]:
        s1 = _row_sum(ctx, x.size, d, comp, gw)
        s2 = _row_sum(ctx, x.size, d, comp, lambda idx: pw.bin_(B.MUL, gw(idx), xhat(idx)))

        def dx(idx):
            k = _kept(idx, d)
            v = pw.bin_(B.SUB, gw(idx), pw.bin_(B.DIV, s1.load(k), n))
            v = pw.bin_(B.SUB, v, pw.bin_(B.MUL, xhat(idx), pw.bin_(B.DIV, s2.load(k), n)))
            return cast(pw.bin_(B.MUL, cast(rstd.load(k), comp), v), x.dtype)

        out[0] = LazyValue(x.size, x.dtype, dx)
    param_size = tuple(x.size[axis:])
    if mask[1] and weight is not None:
        prod = LazyValue(x.size, comp, lambda idx: pw.bin_(B.MUL, g(idx), xhat(idx)))
        out[1] = reduce(ctx, prod, rows, ReductionType.SUM, False, param_size, weight.dtype)
    if mask[2] and bias is not None:
        out[2] = reduce(
            ctx, LazyValue(x.size, comp, g), rows, ReductionType.SUM, False, param_size, bias.dtype
        )
    return out


def _as(v: LazyValue, dtype: DType) -> LazyValue:
    return LazyValue(v.size, dtype, lambda idx: cast(v.load(idx), dtype))


def _rms_norm(ctx: LowerCtx, x: Value, shape, weight, eps) -> tuple[LazyValue, LazyValue]:
    if not isinstance(x.dtype, DType) or not x.dtype.is_float:
        raise NotLowered("rms norm of a non-float")
    meta = ctx.meta[0] if isinstance(ctx.meta, tuple | list) else ctx.meta
    out = DType.of(meta.dtype)
    comp = opmath(out)
    d = list(range(len(x.size) - len(shape), len(x.size)))
    ks = _keep_size(x.size, d)
    sq = LazyValue(x.size, comp, lambda idx: pw.bin_(B.MUL, *[cast(x.load(idx), comp)] * 2))
    ss = reduce(ctx, sq, d, ReductionType.SUM, True, ks, comp)
    if eps is None:
        eps = torch.finfo(out.torch).eps

    def rstd_load(idx):
        ms = pw.bin_(B.DIV, ss.load(idx), pw.const(numel(x.size, d), comp))
        return pw.un(U.RSQRT, pw.bin_(B.ADD, ms, pw.const(eps, comp)))

    rstd = LazyValue(ks, comp, rstd_load)

    def norm(idx):
        return pw.bin_(B.MUL, cast(x.load(idx), comp), rstd.load(_kept(idx, d)))

    return _affine(LazyValue(x.size, comp, norm), weight, None, comp, out), rstd


if hasattr(aten, "rms_norm"):

    @register(aten.rms_norm.default)
    def _rms(ctx: LowerCtx, x: Value, shape, weight=None, eps=None) -> Value:
        return _rms_norm(ctx, x, shape, weight, eps)[0]


if hasattr(aten, "_fused_rms_norm"):

    @register(aten._fused_rms_norm.default)
    def _fused_rms(ctx: LowerCtx, x: Value, shape, weight=None, eps=None) -> list[Value]:
        y, rstd = _rms_norm(ctx, x, shape, weight, eps)
        return [y, _as(rstd, DType.of(ctx.meta[1].dtype))]


@register(aten.dropout.default)
def _dropout(ctx: LowerCtx, x: Value, p: float, train: bool) -> Value:
    if train and p > 0:
        raise NotLowered("dropout in training draws random numbers")
    return pw.pointwise(ctx, lambda a: a, [x], [None])


@register(aten.native_dropout.default)
def _native_dropout(ctx: LowerCtx, x: Value, p: float, train: bool | None) -> list[Value]:
    if train:
        raise NotLowered("dropout in training draws random numbers")
    y = pw.pointwise(LowerCtx(ctx.builder, ctx.meta[0], ctx.node), lambda a: a, [x], [None])
    ones = pw.pointwise(
        LowerCtx(ctx.builder, ctx.meta[1], ctx.node), lambda: pw.const(True, DType.BOOL), []
    )
    return [y, ones]


def _feeds_pointwise(node: torch.fx.Node) -> bool:
    """Whether every use of `node` is a pointwise lowering (through reshapes): an epilogue."""
    if not node.users:
        return False
    for user in node.users:
        if user.target in RESHAPES:
            if not _feeds_pointwise(user):
                return False
            continue
        fn = LOWERINGS.get(user.target)
        if fn is None or not fn.__module__.endswith("lowering.pointwise"):
            return False
    return True


@register(aten.mm.default)
def _mm(ctx: LowerCtx, a: Value, b: Value) -> Any:
    return gemm(ctx, a, b)


@register(aten.bmm.default)
def _bmm(ctx: LowerCtx, a: Value, b: Value) -> Any:
    return batched(ctx, a, b)


@register(aten.addmm.default)
def _addmm(ctx: LowerCtx, bias: Value, a: Value, b: Value, beta=1, alpha=1) -> Any:
    """addmm as a library GEMM; its bias joins the following pointwise ops when there are any."""
    if not _feeds_pointwise(ctx.node):
        if (beta, alpha) == (1, 1):
            return gemm(ctx, a, b, bias)
        kwargs = {"beta": beta, "alpha": alpha}
        return extern(ctx, aten.addmm.default, (bias, a, b), kwargs, ExternKind.LIBRARY)
    prod = gemm(ctx, a, b)

    def fn(p, c):
        p = p if alpha == 1 else pw.bin_(B.MUL, p, pw.const(alpha, p.dtype))
        c = c if beta == 1 else pw.bin_(B.MUL, c, pw.const(beta, c.dtype))
        return pw.bin_(B.ADD, p, c)

    return pw.pointwise(ctx, fn, [prod, bias])
