"""Batch norm and group norm (forward) lowered to ember's reductions and lazy pointwise values.

Batch norm normalizes each channel (dim 1) over every other dim. Its statistics are two
reductions over (N, spatial) per channel (sum, then the sum of squared deviations: a
two-pass kernel with the channel as its outer space, as eager's CPU kernel computes them);
the per-channel results a normalization needs (scale = weight * invstd, shift = bias -
mean * scale, the updated running statistics) are small pointwise nodes over the channels
that join that kernel, and the normalized output `x * scale[c] + shift[c]` stays lazy, so
the ReLU, residual add or anything else pointwise after it is one kernel with it. In eval
mode the scale and shift come from the running statistics (one tiny kernel) and the whole
batch norm is a multiply-add inlined into its neighbours.

The backward is two per-channel sums (of the gradient, and of the gradient times the
centred input) in one kernel, and the input gradient a lazy per-element expression over
per-channel coefficients, so the ReLU's backward before it and the residual gradient's add
inline into both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from ember.backend.indexing import FloorDiv, unflatten
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, Expr, ReductionType
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.lowering import pointwise as pw
from ember.backend.lowering.reductions import numel, reduce, var_parts
from ember.backend.lowering.registry import LowerCtx, NotLowered, opmath, register
from ember.backend.lowering.values import BufferValue, LazyValue, Value, cast
from ember.backend.lowering.views import reshape

aten = torch.ops.aten

# eval batch norms of at most this many elements compute their scale and shift per element
INLINE_MAX = 1 << 14


def _inline(x: Value) -> bool:
    """Whether an eval batch norm's per-channel scale and shift (an rsqrt, two multiplies)
    are computed per element in its epilogue instead of by a (C,) kernel of their own: on a
    small activation the extra kernel's call costs more than the per-element arithmetic
    (MobileNetV2's 52 batch norms: notes/backend.md "mobilenet_v2 in the sweep")."""
    n = numel(x.size, range(len(x.size)))
    return isinstance(n, int) and n <= INLINE_MAX


def _float(x: Value) -> DType:
    if not isinstance(x.dtype, DType) or not x.dtype.is_float or len(x.size) < 2:
        raise NotLowered("batch/group norm of a non-float or of fewer than 2 dims")
    return x.dtype


def _dtype(meta: Any) -> DType:
    d = DType.of(meta.dtype)
    if d is None:
        raise NotLowered(f"dtype {meta.dtype}")
    return d


class _Channels:
    """Per-channel values of an (N, C, *) input: expressions over the channel index."""

    def __init__(self, ctx: LowerCtx, x: Value, comp: DType) -> None:
        self.ctx, self.x, self.comp = ctx, x, comp
        self.c = x.size[1]
        self.dims = [0, *range(2, len(x.size))]
        self.n = numel(x.size, self.dims)

    def at(self, v: Value | None, c: sympy.Expr, default: float | None = None) -> Expr:
        """v[c] in the compute type (a missing weight or bias is its default)."""
        if v is None:
            return pw.const(default, self.comp)
        return cast(v.load([c]), self.comp)

    def const(self, value: Any) -> Expr:
        return pw.const(value, self.comp)

    def value(self, fn: Callable[[sympy.Expr], Expr], dtype: DType | None = None) -> Value:
        """A lazy (C,) value computing fn(channel)."""
        out = dtype or self.comp
        return LazyValue((self.c,), out, lambda idx: cast(fn(idx[0]), out))

    def realized(self, fn: Callable[[sympy.Expr], Expr]) -> Value:
        """A (C,) buffer of fn(channel): per-channel coefficients computed once, not per
        element (their rsqrt and divisions)."""
        return self.ctx.builder.realize(self.value(fn))

    def sum(self, fn: Callable[[list], Expr]) -> Value:
        """Per-channel sum over (N, spatial) of fn(element index). A channels-last input is
        summed as its (N * spatial, C) view, a column reduction that reads memory in order
        (indexing's recombination turns the view's index back into one flat offset); over
        the NCHW dims the planner would make one strided pass over the tensor per channel."""
        x = self.x
        if isinstance(x, BufferValue) and len(x.size) > 2 and x.layout.stride[1] == 1:
            outer = [x.size[d] for d in self.dims]

            def by_row(idx):
                n, *spatial = unflatten(idx[0], outer)
                return fn([n, idx[1], *spatial])

            body = LazyValue((self.n, self.c), self.comp, by_row)
            return reduce(self.ctx, body, [0], ReductionType.SUM, False, (self.c,), self.comp)
        body = LazyValue(self.x.size, self.comp, fn)
        return reduce(self.ctx, body, self.dims, ReductionType.SUM, False, (self.c,), self.comp)

    def elementwise(self, fn: Callable[[list], Expr], dtype: DType) -> LazyValue:
        return LazyValue(self.x.size, dtype, lambda idx: cast(fn(idx), dtype))

    def load_x(self, idx) -> Expr:
        return cast(self.x.load(idx), self.comp)


def _stats(ch: _Channels) -> tuple[Value, Value]:
    """(mean, sum of squared deviations) per channel: two reductions fused in one kernel."""
    total = ch.sum(ch.load_x)
    n = ch.const(ch.n)
    mean = ch.value(lambda c: pw.bin_(B.DIV, total.load([c]), n))

    def sq(idx):
        d = pw.bin_(B.SUB, ch.load_x(idx), mean.load([idx[1]]))
        return pw.bin_(B.MUL, d, d)

    return mean, ch.sum(sq)


def _normalized(ch: _Channels, scale: Value, shift: Value, dtype: DType) -> LazyValue:
    """x * scale[c] + shift[c], eager's form of the normalization and affine map."""

    def fn(idx):
        c = idx[1]
        return pw.bin_(B.ADD, pw.bin_(B.MUL, ch.load_x(idx), scale.load([c])), shift.load([c]))

    return ch.elementwise(fn, dtype)


def _affine(
    ch: _Channels, weight, bias, mean: Value, invstd: Value, realize: bool = True
) -> tuple[Value, Value]:
    per = ch.realized if realize else ch.value
    scale = per(lambda c: pw.bin_(B.MUL, ch.at(weight, c, 1.0), invstd.load([c])))
    shift = per(
        lambda c: pw.bin_(
            B.SUB, ch.at(bias, c, 0.0), pw.bin_(B.MUL, mean.load([c]), scale.load([c]))
        )
    )
    return scale, shift


def _running_invstd(ch: _Channels, running_var: Value, eps: float) -> Callable:
    return lambda c: pw.un(U.RSQRT, pw.bin_(B.ADD, ch.at(running_var, c), ch.const(eps)))


def _empty(meta: Any) -> LazyValue:
    """The size-0 statistics eval-mode batch norm returns."""
    d = _dtype(meta)
    return LazyValue(tuple(meta.shape), d, lambda idx: pw.const(0, d))


def _eval(ctx: LowerCtx, x, weight, bias, running_mean, running_var, eps) -> list[Value]:
    if running_mean is None or running_var is None:
        raise NotLowered("eval batch norm without running statistics")
    ch = _Channels(ctx, x, opmath(_float(x)))
    mean = ch.value(lambda c: ch.at(running_mean, c))
    invstd = ch.value(_running_invstd(ch, running_var, eps))
    scale, shift = _affine(ch, weight, bias, mean, invstd, realize=not _inline(x))
    y = _normalized(ch, scale, shift, _dtype(ctx.meta[0]))
    return [y, *(_empty(m) for m in ctx.meta[1:])]


def _train(ctx: LowerCtx, x, weight, bias, running_mean, running_var, momentum, eps):
    """[y, save_mean, save_invstd, new running mean, new running var] (the last two None
    without running statistics)."""
    ch = _Channels(ctx, x, opmath(_float(x)))
    if isinstance(ch.n, int) and ch.n <= 1 and running_var is not None:
        raise NotLowered("batch norm statistics of one value per channel")
    mean, m2 = _stats(ch)
    invstd = ch.value(
        lambda c: pw.un(
            U.RSQRT, pw.bin_(B.ADD, pw.bin_(B.DIV, m2.load([c]), ch.const(ch.n)), ch.const(eps))
        )
    )
    scale, shift = _affine(ch, weight, bias, mean, invstd)
    y = _normalized(ch, scale, shift, _dtype(ctx.meta[0]))
    out: list[Any] = [y, ch.value(lambda c: mean.load([c]), _dtype(ctx.meta[1]))]
    out.append(ch.value(lambda c: invstd.load([c]), _dtype(ctx.meta[2])))
    if running_mean is None or running_var is None:
        return [*out, None, None]
    m, keep = ch.const(momentum), ch.const(1.0 - momentum)

    def update(old: Value, new: Callable) -> Value:
        return ch.value(
            lambda c: pw.bin_(
                B.ADD, pw.bin_(B.MUL, m, new(c)), pw.bin_(B.MUL, keep, ch.at(old, c))
            ),
            old.dtype,
        )

    unbiased = ch.n - 1
    new_mean = update(running_mean, lambda c: mean.load([c]))
    new_var = update(running_var, lambda c: pw.bin_(B.DIV, m2.load([c]), ch.const(unbiased)))
    return [*out, new_mean, new_var]


@register(aten.native_batch_norm.default)
def _native_batch_norm(
    ctx: LowerCtx, x, weight, bias, running_mean, running_var, training, momentum, eps
) -> list[Value]:
    if not training:
        return _eval(ctx, x, weight, bias, running_mean, running_var, eps)
    if running_mean is not None:
        raise NotLowered("native_batch_norm updating running statistics in place")
    return _train(ctx, x, weight, bias, None, None, momentum, eps)[:3]


@register(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_no_training(
    ctx: LowerCtx, x, weight, bias, running_mean, running_var, momentum, eps
) -> list[Value]:
    return _eval(ctx, x, weight, bias, running_mean, running_var, eps)


@register(aten._native_batch_norm_legit_functional.default)
def _batch_norm_functional(
    ctx: LowerCtx, x, weight, bias, running_mean, running_var, training, momentum, eps
) -> list[Value]:
    if not training:
        y, a, b = _eval(ctx, x, weight, bias, running_mean, running_var, eps)
        return [y, a, b, _copy(running_mean), _copy(running_var)]
    return _train(ctx, x, weight, bias, running_mean, running_var, momentum, eps)


def _copy(v: Value) -> LazyValue:
    return LazyValue(v.size, v.dtype, v.load)


@register(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(ctx: LowerCtx, x, weight, bias, training, momentum, eps) -> list[Value]:
    if not training:
        raise NotLowered("eval batch norm without running statistics")
    return _train(ctx, x, weight, bias, None, None, momentum, eps)[:3]


@register(aten.native_batch_norm_backward.default)
def _batch_norm_backward(
    ctx: LowerCtx,
    grad,
    x,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    mask,
) -> list[Value | None]:
    """dx = (g - mean(g) - (x - mean) * k) * invstd * w with k = sum(g * (x - mean)) *
    invstd^2 / n in training (eager's CPU formula); g * invstd * w in eval. dw = sum(g *
    (x - mean)) * invstd, db = sum(g), all sums per channel over (N, spatial)."""
    ch = _Channels(ctx, x, opmath(_float(x)))
    if train:
        if save_mean is None or save_invstd is None:
            raise NotLowered("training batch norm backward without saved statistics")
        mean, invstd = save_mean, save_invstd
    else:
        if running_mean is None or running_var is None:
            raise NotLowered("eval batch norm backward without running statistics")
        mean = running_mean
        invstd = ch.realized(_running_invstd(ch, running_var, eps))

    def g(idx):
        return cast(grad.load(idx), ch.comp)

    def centred(idx):
        return pw.bin_(B.SUB, ch.load_x(idx), ch.at(mean, idx[1]))

    need_dot = train or mask[1]
    sum_g = ch.sum(g) if (train or mask[2]) else None
    dot = ch.sum(lambda idx: pw.bin_(B.MUL, g(idx), centred(idx))) if need_dot else None
    out: list[Value | None] = [None, None, None]
    if mask[0]:

        def a(c):
            # per element (one multiply): a realized coefficient that reads nothing of the
            # sums' kernel would start a kernel of its own and take k and gm with it
            return pw.bin_(B.MUL, ch.at(invstd, c), ch.at(weight, c, 1.0))

        if train:
            n = ch.const(ch.n)
            k = ch.realized(
                lambda c: pw.bin_(
                    B.DIV,
                    pw.bin_(B.MUL, dot.load([c]), pw.bin_(B.MUL, *[ch.at(invstd, c)] * 2)),
                    n,
                )
            )
            gm = ch.realized(lambda c: pw.bin_(B.DIV, sum_g.load([c]), n))

            def dx(idx):
                c = idx[1]
                v = pw.bin_(B.SUB, g(idx), gm.load([c]))
                v = pw.bin_(B.SUB, v, pw.bin_(B.MUL, centred(idx), k.load([c])))
                return pw.bin_(B.MUL, v, a(c))

        else:

            def dx(idx):
                return pw.bin_(B.MUL, g(idx), a(idx[1]))

        out[0] = ch.elementwise(dx, _dtype(ctx.meta[0]))
    if mask[1]:
        out[1] = ch.value(
            lambda c: pw.bin_(B.MUL, dot.load([c]), ch.at(invstd, c)), _dtype(ctx.meta[1])
        )
    if mask[2]:
        out[2] = ch.value(lambda c: sum_g.load([c]), _dtype(ctx.meta[2]))
    return out


@register(aten.native_group_norm.default)
def _group_norm(ctx: LowerCtx, x, weight, bias, n, c, hw, group: int, eps: float) -> list[Value]:
    """Statistics per (sample, group) as a row reduction over the group's channels and
    positions (the input viewed as (N, G, C/G * HxW), two passes like layer norm), the
    output a lazy value over the per-channel weight and bias, fused with what follows.
    The backward stays eager's (`native_group_norm_backward`)."""
    dtype = _float(x)
    if not all(isinstance(s, int) for s in (*x.size, n, c, hw)) or c % group:
        raise NotLowered("group norm with symbolic sizes")
    comp = opmath(dtype)
    per_group = c // group
    rows = reshape(ctx, x, (n, group, per_group * hw))
    mean, m2 = var_parts(ctx, rows, [2], (n, group, 1), comp, True)
    zero = sympy.Integer(0)

    def rstd(i, g) -> Expr:
        var = pw.bin_(B.DIV, m2.load([i, g, zero]), pw.const(per_group * hw, comp))
        return pw.un(U.RSQRT, pw.bin_(B.ADD, var, pw.const(eps, comp)))

    def norm(idx):
        i, g = idx[0], FloorDiv(idx[1], per_group)
        v = pw.bin_(B.SUB, cast(x.load(idx), comp), mean.load([i, g, zero]))
        v = pw.bin_(B.MUL, v, rstd(i, g))
        if weight is not None:
            v = pw.bin_(B.MUL, v, cast(weight.load([idx[1]]), comp))
        if bias is not None:
            v = pw.bin_(B.ADD, v, cast(bias.load([idx[1]]), comp))
        return cast(v, dtype)

    stat = _dtype(ctx.meta[1])
    means = LazyValue((n, group), stat, lambda idx: cast(mean.load([*idx, zero]), stat))
    rstds = LazyValue((n, group), stat, lambda idx: cast(rstd(*idx), stat))
    return [LazyValue(tuple(x.size), _dtype(ctx.meta[0]), norm), means, rstds]
