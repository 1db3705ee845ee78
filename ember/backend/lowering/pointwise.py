"""Pointwise lowerings: each aten elementwise op becomes a lazy expression over its inputs.

Broadcasting and type promotion follow eager: operands are broadcast by index (size-1 and
missing leading dimensions read index 0), converted to the op's compute type (float for
bfloat16, the promoted type for comparisons), and the result converted to the output dtype.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import BinaryOp as B
from ember.backend.ir.nodes import DType, Expr
from ember.backend.ir.nodes import UnaryOp as U
from ember.backend.lowering.registry import LowerCtx, NotLowered, opmath, register
from ember.backend.lowering.values import BufferValue, LazyValue, Value, cast
from ember.backend.sizes import hints

aten = torch.ops.aten

# ------------------------------------------------------------------ expression helpers


def const(value: Any, dtype: DType) -> Expr:
    """A constant; a symbolic size (an element count a mean divides by) is computed from
    the kernel's size arguments."""
    if isinstance(value, sympy.Expr) and not value.is_number:
        return cast(ir.IndexValue(value, DType.I64), dtype)
    if dtype.is_float:
        return ir.Const(float(value), dtype)
    if dtype == DType.BOOL:
        return ir.Const(bool(value), dtype)
    return ir.Const(int(value), dtype)


def un(op: U, x: Expr) -> Expr:
    boolean = op in (U.ISNAN, U.ISINF, U.LOGICAL_NOT)
    return ir.Unary(op, x, DType.BOOL if boolean else x.dtype)


def bin_(op: B, a: Expr, b: Expr) -> Expr:
    boolean = op in ir.COMPARISONS or op in ir.LOGICAL
    return ir.Binary(op, a, b, DType.BOOL if boolean else a.dtype)


def where(c: Expr, a: Expr, b: Expr) -> Expr:
    return ir.Where(c, a, b, a.dtype)


def broadcast_load(v: Value, idx: Sequence[sympy.Expr], size: Sequence[int]) -> Expr:
    """Load `v` at the index of an element of the broadcast result of shape `size`."""
    lead = len(size) - len(v.size)
    sub = [sympy.Integer(0) if s == 1 else idx[lead + k] for k, s in enumerate(v.size)]
    return v.load(sub)


def operand(a: Any, idx, size, dtype: DType | None) -> Expr:
    """A tensor value or Python scalar as an expression in `dtype` (None: own dtype)."""
    if isinstance(a, BufferValue | LazyValue):
        if not isinstance(a.dtype, DType):
            raise NotLowered(f"dtype {a.dtype}")
        e = broadcast_load(a, idx, size)
        return e if dtype is None else cast(e, dtype)
    if isinstance(a, bool | int | float):
        if dtype is None:
            dtype = DType.BOOL if isinstance(a, bool) else DType.F64
        return const(a, dtype)
    if isinstance(a, sympy.Expr):  # a symbolic size used as a number (x / x.size(0))
        return const(a, dtype or DType.I64)
    raise NotLowered(f"operand {type(a).__name__}")


def pointwise(
    ctx: LowerCtx,
    fn: Callable[..., Expr],
    args: Sequence[Any],
    compute: DType | Sequence[DType | None] | None = None,
) -> LazyValue:
    """A lazy value computing `fn(*operands)` per element of the op's output."""
    out = ctx.out_dtype
    size = ctx.out_size
    if compute is None:
        compute = opmath(out)
    dtypes = list(compute) if isinstance(compute, list | tuple) else [compute] * len(args)

    def load(idx):
        return cast(fn(*[operand(a, idx, size, d) for a, d in zip(args, dtypes)]), out)

    return LazyValue(size, out, load)


def promoted(*args: Any) -> DType:
    """Eager's result type of the operands (tensors by dtype and rank, scalars by kind)."""
    metas = [
        torch.empty(hints(a.size), dtype=a.dtype.torch, device="meta")
        if isinstance(a, BufferValue | LazyValue)
        else 1
        if isinstance(a, sympy.Expr)
        else a
        for a in args
    ]
    d = DType.of(torch.result_type(*metas))
    if d is None:
        raise NotLowered("promotion")
    return opmath(d)


# ------------------------------------------------------------------ unary ops

_FLOAT_UNARY = {
    aten.exp.default: U.EXP,
    aten.expm1.default: U.EXPM1,
    aten.log.default: U.LOG,
    aten.log1p.default: U.LOG1P,
    aten.sqrt.default: U.SQRT,
    aten.rsqrt.default: U.RSQRT,
    aten.tanh.default: U.TANH,
    aten.sigmoid.default: U.SIGMOID,
    aten.erf.default: U.ERF,
    aten.sin.default: U.SIN,
    aten.cos.default: U.COS,
    aten.reciprocal.default: U.RECIPROCAL,
}
_SAME_UNARY = {
    aten.neg.default: U.NEG,
    aten.abs.default: U.ABS,
    aten.relu.default: U.RELU,
    aten.floor.default: U.FLOOR,
    aten.ceil.default: U.CEIL,
    aten.trunc.default: U.TRUNC,
    aten.round.default: U.ROUND,
    aten.bitwise_not.default: U.BITWISE_NOT,
}


def _unary(op: U, arg_dtype: Callable[[LowerCtx, Any], DType | None]):
    def lower(ctx: LowerCtx, x: Value) -> LazyValue:
        return pointwise(ctx, lambda a: un(op, a), [x], arg_dtype(ctx, x))

    return lower


for _aten, _op in _FLOAT_UNARY.items():
    register(_aten)(_unary(_op, lambda ctx, x: opmath(ctx.out_dtype)))
for _aten, _op in _SAME_UNARY.items():
    register(_aten)(_unary(_op, lambda ctx, x: opmath(ctx.out_dtype)))


@register(aten.logical_not.default)
def _logical_not(ctx: LowerCtx, x: Value) -> LazyValue:
    return pointwise(ctx, lambda a: un(U.LOGICAL_NOT, a), [x], DType.BOOL)


@register(aten.isnan.default)
def _isnan(ctx: LowerCtx, x: Value) -> LazyValue:
    return pointwise(ctx, lambda a: un(U.ISNAN, a), [x], [None])


@register(aten.isinf.default)
def _isinf(ctx: LowerCtx, x: Value) -> LazyValue:
    return pointwise(ctx, lambda a: un(U.ISINF, a), [x], [None])


# ------------------------------------------------------------------ binary ops


def _scaled(b: Expr, alpha: Any) -> Expr:
    return b if alpha == 1 else bin_(B.MUL, b, const(alpha, b.dtype))


@register(aten.add.Tensor, aten.add.Scalar)
def _add(ctx: LowerCtx, a, b, alpha=1) -> LazyValue:
    return pointwise(ctx, lambda x, y: bin_(B.ADD, x, _scaled(y, alpha)), [a, b])


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(ctx: LowerCtx, a, b, alpha=1) -> LazyValue:
    return pointwise(ctx, lambda x, y: bin_(B.SUB, x, _scaled(y, alpha)), [a, b])


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx: LowerCtx, a, b, alpha=1) -> LazyValue:
    return pointwise(ctx, lambda x, y: bin_(B.SUB, y, _scaled(x, alpha)), [a, b])


@register(aten.div.Tensor, aten.div.Scalar)
def _div(ctx: LowerCtx, a, b) -> LazyValue:
    return pointwise(ctx, lambda x, y: bin_(B.DIV, x, y), [a, b])


_SIMPLE_BINARY = {
    aten.mul.Tensor: B.MUL,
    aten.mul.Scalar: B.MUL,
    aten.maximum.default: B.MAXIMUM,
    aten.minimum.default: B.MINIMUM,
    aten.atan2.default: B.ATAN2,
    aten.bitwise_and.Tensor: B.BITWISE_AND,
    aten.bitwise_and.Scalar: B.BITWISE_AND,
    aten.bitwise_or.Tensor: B.BITWISE_OR,
    aten.bitwise_or.Scalar: B.BITWISE_OR,
    aten.bitwise_xor.Tensor: B.BITWISE_XOR,
    aten.bitwise_xor.Scalar: B.BITWISE_XOR,
}
_COMPARE = {
    aten.eq.Tensor: B.EQ,
    aten.eq.Scalar: B.EQ,
    aten.ne.Tensor: B.NE,
    aten.ne.Scalar: B.NE,
    aten.lt.Tensor: B.LT,
    aten.lt.Scalar: B.LT,
    aten.le.Tensor: B.LE,
    aten.le.Scalar: B.LE,
    aten.gt.Tensor: B.GT,
    aten.gt.Scalar: B.GT,
    aten.ge.Tensor: B.GE,
    aten.ge.Scalar: B.GE,
}
_LOGICAL = {
    aten.logical_and.default: B.LOGICAL_AND,
    aten.logical_or.default: B.LOGICAL_OR,
    aten.logical_xor.default: B.LOGICAL_XOR,
}


def _binary(op: B):
    def lower(ctx: LowerCtx, a, b) -> LazyValue:
        if op.name.startswith("BITWISE") and ctx.out_dtype.is_float:
            raise NotLowered("bitwise on floats")
        return pointwise(ctx, lambda x, y: bin_(op, x, y), [a, b])

    return lower


def _compare(op: B):
    def lower(ctx: LowerCtx, a, b) -> LazyValue:
        return pointwise(ctx, lambda x, y: bin_(op, x, y), [a, b], promoted(a, b))

    return lower


def _logical(op: B):
    def lower(ctx: LowerCtx, a, b) -> LazyValue:
        return pointwise(ctx, lambda x, y: bin_(op, x, y), [a, b], DType.BOOL)

    return lower


for _aten, _bop in _SIMPLE_BINARY.items():
    register(_aten)(_binary(_bop))
for _aten, _bop in _COMPARE.items():
    register(_aten)(_compare(_bop))
for _aten, _bop in _LOGICAL.items():
    register(_aten)(_logical(_bop))


@register(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx: LowerCtx, a, exponent) -> LazyValue:
    special: dict[float, Callable[[Expr], Expr]] = {
        1: lambda x: x,
        2: lambda x: bin_(B.MUL, x, x),
        3: lambda x: bin_(B.MUL, bin_(B.MUL, x, x), x),
        0.5: lambda x: un(U.SQRT, x),
        -0.5: lambda x: un(U.RSQRT, x),
        -1: lambda x: un(U.RECIPROCAL, x),
        -2: lambda x: un(U.RECIPROCAL, bin_(B.MUL, x, x)),
    }
    if isinstance(exponent, int | float) and exponent in special:
        if not ctx.out_dtype.is_float and exponent not in (1, 2, 3):
            raise NotLowered("integer pow")
        return pointwise(ctx, special[exponent], [a])
    if not ctx.out_dtype.is_float:
        raise NotLowered("integer pow")
    return pointwise(ctx, lambda x, y: bin_(B.POW, x, y), [a, exponent])


@register(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx: LowerCtx, a, b) -> LazyValue:
    if not ctx.out_dtype.is_float:
        raise NotLowered("integer pow")
    return pointwise(ctx, lambda x, y: bin_(B.POW, x, y), [a, b])


# ------------------------------------------------------------------ selection and clamps


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: LowerCtx, cond, a, b) -> LazyValue:
    d = opmath(ctx.out_dtype)
    return pointwise(ctx, where, [cond, a, b], [DType.BOOL, d, d])


def _clamp_expr(x: Expr, lo: Expr | None, hi: Expr | None) -> Expr:
    # NaN in x propagates: comparisons with NaN are false, so x is kept
    if lo is not None:
        x = where(bin_(B.LT, x, lo), lo, x)
    if hi is not None:
        x = where(bin_(B.GT, x, hi), hi, x)
    return x


@register(aten.clamp.default)
def _clamp(ctx: LowerCtx, x, min=None, max=None) -> LazyValue:  # noqa: A002
    args = [x] + [v for v in (min, max) if v is not None]

    def fn(a, *bounds):
        it = iter(bounds)
        lo = next(it) if min is not None else None
        hi = next(it) if max is not None else None
        return _clamp_expr(a, lo, hi)

    return pointwise(ctx, fn, args)


@register(aten.clamp_min.default)
def _clamp_min(ctx: LowerCtx, x, lo) -> LazyValue:
    return pointwise(ctx, lambda a, b: _clamp_expr(a, b, None), [x, lo])


@register(aten.clamp_max.default)
def _clamp_max(ctx: LowerCtx, x, hi) -> LazyValue:
    return pointwise(ctx, lambda a, b: _clamp_expr(a, None, b), [x, hi])


@register(aten.hardtanh.default)
def _hardtanh(ctx: LowerCtx, x, lo=-1.0, hi=1.0) -> LazyValue:
    return pointwise(ctx, lambda a, b, c: _clamp_expr(a, b, c), [x, lo, hi])


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: LowerCtx, x, mask, value) -> LazyValue:
    d = opmath(ctx.out_dtype)
    return pointwise(ctx, lambda a, m, v: where(m, v, a), [x, mask, value], [d, DType.BOOL, d])


# ------------------------------------------------------------------ activations


def gelu_expr(x: Expr, approximate: str = "none", nan_at_inf: bool = False) -> Expr:
    """GELU; `nan_at_inf` follows eager's AVX-512 float kernel (see eager_gelu_nan_at_inf):
    NaN at +inf too (not only at -inf), and x (1 + erf) formed before the halving, so that
    it overflows to inf above half the largest float as eager's does."""
    d = x.dtype
    if approximate == "tanh":
        # x/2 (1 + tanh(u)) written as x sigmoid(2u): the same function without the
        # cancellation of 1 + tanh(u) near -1, which costs eager most of its digits for x < -3
        cube = bin_(B.MUL, bin_(B.MUL, x, x), x)
        inner = bin_(B.ADD, x, bin_(B.MUL, cube, const(0.044715, d)))
        u2 = bin_(B.MUL, inner, const(2 * math.sqrt(2 / math.pi), d))
        return bin_(B.MUL, x, un(U.SIGMOID, u2))
    if not nan_at_inf:
        return bin_(B.MUL, bin_(B.MUL, x, const(0.5, d)), _twice_normal_cdf(x))
    y = bin_(B.MUL, bin_(B.MUL, x, _twice_normal_cdf(x)), const(0.5, d))
    return where(un(U.ISINF, x), const(math.nan, d), y)


@functools.cache
def eager_gelu_nan_at_inf(dtype: torch.dtype) -> bool:
    """Whether eager's erf-form GELU gives NaN at +inf for `dtype` in this process. It does
    with ATen's AVX-512 float kernel and does not with its AVX2 one, so it is asked once
    rather than assumed; the graph cache key holds ATen's CPU capability for this reason."""
    x = torch.full((64,), math.inf, dtype=dtype)
    return bool(torch.nn.functional.gelu(x).isnan().all())


def _gauss(x: Expr) -> Expr:
    """exp(-x^2/2), with the exp that has no overflow path (its argument is <= 0)."""
    return un(U.EXP_SHIFTED, bin_(B.MUL, bin_(B.MUL, x, x), const(-0.5, x.dtype)))


def _twice_normal_cdf(x: Expr) -> Expr:
    """1 + erf(x / sqrt 2), computed as erfc(-x / sqrt 2) so that it keeps its relative
    accuracy where it is tiny (x < -3); given exp(-x^2/2), the expression GELU's derivative
    also needs, so a kernel computing GELU and its gradient runs one exp."""
    return bin_(B.ERFC_GIVEN_EXP, bin_(B.MUL, x, const(-math.sqrt(0.5), x.dtype)), _gauss(x))


@register(aten.gelu.default)
def _gelu(ctx: LowerCtx, x, approximate="none") -> LazyValue:
    nan_at_inf = approximate == "none" and eager_gelu_nan_at_inf(ctx.out_dtype.torch)
    return pointwise(ctx, lambda a: gelu_expr(a, approximate, nan_at_inf), [x])


def gelu_grad_expr(g: Expr, x: Expr, approximate: str = "none") -> Expr:
    """GELU's derivative times the incoming gradient, written as eager's CPU kernel does."""
    d = x.dtype

    def c(v: float) -> Expr:
        return const(v, d)

    def mul(*terms: Expr) -> Expr:
        out = terms[0]
        for t in terms[1:]:
            out = bin_(B.MUL, out, t)
        return out

    if approximate == "tanh":
        x_sq = mul(x, x)
        beta, kappa = math.sqrt(2.0 / math.pi), 0.044715
        inner = mul(c(beta), bin_(B.ADD, x, mul(c(kappa), x_sq, x)))
        t = un(U.TANH, inner)
        left_d = mul(c(0.5), bin_(B.ADD, c(1.0), t))
        tanh_d = bin_(B.SUB, c(1.0), mul(t, t))
        inner_d = mul(c(beta), bin_(B.ADD, c(1.0), mul(c(3 * kappa), x_sq)))
        slope = bin_(B.ADD, left_d, mul(mul(c(0.5), x), tanh_d, inner_d))
    else:
        cdf = mul(c(0.5), _twice_normal_cdf(x))
        pdf = mul(c(1.0 / math.sqrt(2.0 * math.pi)), _gauss(x))
        slope = bin_(B.ADD, cdf, mul(x, pdf))
    return mul(g, slope)


@register(aten.gelu_backward.default)
def _gelu_backward(ctx: LowerCtx, grad, x, approximate="none") -> LazyValue:
    return pointwise(ctx, lambda g, a: gelu_grad_expr(g, a, approximate), [grad, x])


@register(aten.silu.default)
def _silu(ctx: LowerCtx, x) -> LazyValue:
    return pointwise(ctx, lambda a: bin_(B.MUL, a, un(U.SIGMOID, a)), [x])


@register(aten.leaky_relu.default)
def _leaky_relu(ctx: LowerCtx, x, slope=0.01) -> LazyValue:
    def fn(a):
        return where(bin_(B.GT, a, const(0, a.dtype)), a, bin_(B.MUL, a, const(slope, a.dtype)))

    return pointwise(ctx, fn, [x])


@register(aten.threshold_backward.default)
def _threshold_backward(ctx: LowerCtx, grad, x, threshold) -> LazyValue:
    """ReLU's backward: the gradient where the input is above the threshold, else 0."""

    def fn(g, a):
        return where(bin_(B.LE, a, const(threshold, a.dtype)), const(0, g.dtype), g)

    return pointwise(ctx, fn, [grad, x])


@register(aten.hardtanh_backward.default)
def _hardtanh_backward(ctx: LowerCtx, grad, x, lo, hi) -> LazyValue:
    """ReLU6's (hardtanh's) backward: the gradient where lo < input < hi, else 0. A NaN
    input gets 0, as in eager's vector loop (its scalar tail passes the gradient: eager's
    answer for NaN depends on the element's position)."""

    def fn(g, a):
        inside = bin_(
            B.LOGICAL_AND, bin_(B.GT, a, const(lo, a.dtype)), bin_(B.LT, a, const(hi, a.dtype))
        )
        return where(inside, g, const(0, g.dtype))

    return pointwise(ctx, fn, [grad, x])


@register(aten.sigmoid_backward.default)
def _sigmoid_backward(ctx: LowerCtx, grad, y) -> LazyValue:
    """The sigmoid's backward from its output y: grad * (1 - y) * y, in eager's order.
    RegNet's squeeze-excitation blocks called it as aten in every training step; lowered,
    it joins the kernel around it."""

    def fn(g, a):
        return bin_(B.MUL, bin_(B.MUL, g, bin_(B.SUB, const(1, a.dtype), a)), a)

    return pointwise(ctx, fn, [grad, y])


@register(aten.threshold.default)
def _threshold(ctx: LowerCtx, x, threshold, value) -> LazyValue:
    def fn(a):
        return where(bin_(B.LE, a, const(threshold, a.dtype)), const(value, a.dtype), a)

    return pointwise(ctx, fn, [x])


# ------------------------------------------------------------------ copies and constants


@register(aten.clone.default, aten.alias_copy.default, aten.lift_fresh_copy.default)
def _clone(ctx: LowerCtx, x, memory_format=None) -> LazyValue:
    return pointwise(ctx, lambda a: a, [x])


@register(aten._to_copy.default)
def _to_copy(ctx: LowerCtx, x, dtype=None, layout=None, device=None, **_: Any) -> LazyValue:
    if device is not None and torch.device(device).type != "cpu":
        raise NotLowered("device copy")
    return pointwise(ctx, lambda a: a, [x], [None])


@register(aten.copy.default)
def _copy(ctx: LowerCtx, dst, src, non_blocking=False) -> LazyValue:
    return pointwise(ctx, lambda a: a, [src], [None])


@register(aten.cat.default)
def _cat(ctx: LowerCtx, tensors, dim: int = 0) -> LazyValue:
    """Concatenation as one lazy value: each output element takes the piece its position
    along `dim` falls in (a chain of `Where`s on that position), and every load of a piece
    is masked to the piece's range, because codegen evaluates all of them for every element.
    Pointwise producers of the pieces fuse into the kernel that writes the result."""
    out, size = ctx.out_dtype, ctx.out_size
    if not out.is_float:
        raise NotLowered("cat of integers (a masked-out piece could divide by zero)")
    d = dim % len(size)
    pieces, lo = [], 0
    for t in tensors:
        if len(t.size) == 1 and t.size[0] == 0 and len(size) != 1:
            continue  # the legacy empty 1-d tensor cat accepts beside any shape
        if not isinstance(t.dtype, DType) or len(t.size) != len(size):
            raise NotLowered("cat operand")
        if not isinstance(t.size[d], int) or t.size[d]:
            pieces.append((t, lo, lo + t.size[d]))
        lo += t.size[d]

    def load(idx):
        pos = idx[d]
        expr = None
        for t, first, end in reversed(pieces):
            sub = list(idx)
            sub[d] = pos - first
            e = masked(cast(t.load(sub), out), (ir.Mask(pos, first, end),))
            if expr is not None:
                inside = bin_(B.LT, ir.IndexValue(pos, DType.I64), const(end, DType.I64))
                e = where(inside, e, expr)
            expr = e
        return expr

    if not pieces:
        raise NotLowered("cat of empty pieces")
    return LazyValue(size, out, load)


def in_range(pos: sympy.Expr, lo: int, hi: int) -> Expr:
    """lo <= pos < hi, for an index position (where a padded or scattered piece lies)."""
    at = ir.IndexValue(pos, DType.I64)
    return bin_(
        B.LOGICAL_AND,
        un(U.LOGICAL_NOT, bin_(B.LT, at, const(lo, DType.I64))),
        bin_(B.LT, at, const(hi, DType.I64)),
    )


def masked(e: Expr, masks: tuple[ir.Mask, ...]) -> Expr:
    """`e` with every load masked by `masks` as well (read only where they all hold)."""
    if not masks:
        return e
    return ir.map_loads(e, lambda ld: ir.Load(ld.buffer, ld.index, ld.dtype, (*ld.mask, *masks)))


@register(aten.constant_pad_nd.default)
def _constant_pad_nd(ctx: LowerCtx, x: Value, pad, value: float = 0.0) -> LazyValue:
    """Padding (or, with negative amounts, cropping) as a lazy value: inside, x at the
    shifted position, with its loads masked to it; outside, `value`. The pointwise ops
    before it (a batch norm and ReLU6 before a convolution that pads "same" by hand, as
    transformers' MobileNetV2 does) are computed in the kernel that writes the padded
    result, not by an aten call and a copy (an all-zero pad is that kernel alone)."""
    out, size = ctx.out_dtype, ctx.out_size
    if not out.is_float or not isinstance(x.dtype, DType):
        raise NotLowered("constant_pad_nd of integers (a masked-out load could divide by zero)")
    n = len(size)
    # pairs (before, after) from the last dim backwards
    amounts = {n - 1 - i // 2: (pad[i], pad[i + 1]) for i in range(0, len(pad), 2)}
    if not all(isinstance(v, int) for pair in amounts.values() for v in pair) or not all(
        isinstance(x.size[d], int) for d in amounts
    ):
        raise NotLowered("constant_pad_nd with symbolic sizes")

    def load(idx):
        sub, masks, inside = list(idx), [], None
        for d, (before, _) in amounts.items():
            sub[d] = idx[d] - before
            lo, hi = max(before, 0), min(x.size[d] + before, size[d])
            if lo == 0 and hi == size[d]:
                continue  # cropped or untouched: every position reads x
            masks.append(ir.Mask(idx[d], lo, hi))
            cond = in_range(idx[d], lo, hi)
            inside = cond if inside is None else bin_(B.LOGICAL_AND, inside, cond)
        e = masked(cast(x.load(sub), out), tuple(masks))
        return e if inside is None else where(inside, e, const(value, out))

    return LazyValue(size, out, load)


@register(aten.full.default, aten.full_like.default, aten.scalar_tensor.default)
def _full(ctx: LowerCtx, size_or_x, fill=None, **_: Any) -> LazyValue:
    value = size_or_x if fill is None else fill
    if not isinstance(value, bool | int | float):
        raise NotLowered("fill value")
    return pointwise(ctx, lambda: const(value, ctx.out_dtype), [])


@register(
    aten.zeros_like.default, aten.ones_like.default, aten.new_zeros.default, aten.new_ones.default
)
def _zeros_ones_like(ctx: LowerCtx, x, *_: Any, **__: Any) -> LazyValue:
    value = 0 if ctx.node.target in (aten.zeros_like.default, aten.new_zeros.default) else 1
    return pointwise(ctx, lambda: const(value, ctx.out_dtype), [])


@register(aten.new_full.default)
def _new_full(ctx: LowerCtx, x, size, fill, **_: Any) -> LazyValue:
    return _full(ctx, size, fill)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx: LowerCtx, *args, **kwargs: Any) -> LazyValue:
    nums = [a for a in args if isinstance(a, int | float | sympy.Expr)]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    if isinstance(start, sympy.Expr) or isinstance(step, sympy.Expr):
        raise NotLowered("arange with a symbolic start or step")
    out, size = ctx.out_dtype, ctx.out_size
    comp = DType.F64 if out.is_float else DType.I64

    def load(idx):
        pos = ir.IndexValue(idx[0], comp)
        v = bin_(B.ADD, const(start, comp), bin_(B.MUL, pos, const(step, comp)))
        return cast(v, out)

    return LazyValue(size, out, load)
