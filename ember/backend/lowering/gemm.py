"""Library GEMMs: MKL's sgemm through `torch.mm`/`addmm`, or oneDNN's linear where faster.

A linear layer reaches the backend as `mm(x, W.t())` (or `addmm(b, x, W.t())`) with `W` a
row-major (out, in) weight. oneDNN's `mkldnn._linear_pointwise(x, W, b)` computes the same
product from `W` as it lies; measured here it is 5-15% faster than `torch.mm` for a small
batch against a large weight (256 x 1024 @ 1024 x 4096, the MLP block's layers) and 3-7%
slower for tall, thin products (1024 x 256 @ 256 x 768), with no simple rule in between. So,
as Inductor's autotuning does for its GEMM templates, each candidate shape is timed once per
process (the two calls alternated, best of five each, on random data) and oneDNN kept only
if it wins by 3%. The choice is written into the generated wrapper, so a graph loaded
from the cache keeps it without timing again.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from ember import torch_compat
from ember.backend.ir.nodes import DType, ExternKind, Layout
from ember.backend.lowering.fallback import extern
from ember.backend.lowering.registry import LowerCtx
from ember.backend.lowering.values import BufferValue, Value
from ember.backend.sizes import exprs_of

aten = torch.ops.aten

MIN_FLOPS = 1 << 26  # smaller products: oneDNN's per-call setup (~20 us) outweighs any gain
MARGIN = 0.97  # oneDNN must take at most this share of torch.mm's time
ROUNDS = 5  # timed calls of each, alternated; the best of each counts


def gemm(ctx: LowerCtx, a: Value, b: Value, bias: Value | None = None) -> Any:
    """`a @ b (+ bias)` as a library call: oneDNN's linear when `b` is a transposed
    row-major weight and oneDNN is measurably faster for this shape, else torch.mm/addmm."""
    weight = _weight(a, b, bias)
    if weight is not None and not isinstance(a.size[0], int):
        # a dynamic batch: chosen per size bucket at run time (linear_by_size)
        return extern(ctx, linear_by_size, (a, weight, bias), {}, ExternKind.LIBRARY)
    if weight is not None and _onednn_faster(*a.size, b.size[1], bias is not None):
        op = torch_compat.onednn_linear()
        return extern(ctx, op, (a, weight, bias, "none", [], ""), {}, ExternKind.LIBRARY)
    if bias is None:
        return extern(ctx, aten.mm.default, (a, b), {}, ExternKind.LIBRARY)
    return extern(ctx, aten.addmm.default, (bias, a, b), {}, ExternKind.LIBRARY)


def batched(ctx: LowerCtx, a: Value, b: Value) -> Any:
    """bmm(a, b), computed as bmm(b^T, a^T) when only its transpose is read."""
    if _read_transposed(ctx.node):
        at, bt = (_swap(ctx.builder.realize(v)) for v in (a, b))
        meta = ctx.meta.transpose(-2, -1).contiguous()
        sub = LowerCtx(ctx.builder, meta, ctx.node)
        return _swap(extern(sub, aten.bmm.default, (bt, at), {}, ExternKind.LIBRARY))
    return extern(ctx, aten.bmm.default, (a, b), {}, ExternKind.LIBRARY)


def _swap(v: BufferValue) -> BufferValue:
    """The view of `v` with its last two dims swapped."""
    size, stride = list(v.size), list(v.layout.stride)
    size[-2:], stride[-2:] = size[:-3:-1], stride[:-3:-1]
    layout = Layout(tuple(size), tuple(stride), v.layout.offset)
    return BufferValue(layout.size, v.dtype, v.buffer, layout)


RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_VIEWS = (*RESHAPES, aten.transpose.int, aten.permute.default, aten.t.default)
_COPIES = (aten.clone.default, aten.cat.default)  # write their result contiguously


def _read_transposed(node: torch.fx.Node) -> bool:
    """Whether a product's only reader is a transpose of its two matrix dims (reached
    through reshapes that keep those dims, like a batch split into batch x heads) that ends,
    through more views, in a copy to a fresh contiguous tensor (clone, cat): that copy walks
    the transposed layout. (A pointwise reader instead keeps eager's transposed strides.)"""
    rows_cols = exprs_of(node.meta["val"].shape[-2:])
    transposed = False
    while len(node.users) == 1:
        (user,) = node.users
        if user.op != "call_function":
            return False
        if transposed:
            if user.target in _COPIES:
                return True
            if user.target not in _VIEWS:
                return False
        else:
            meta = user.meta["val"]
            n = meta.dim()
            if user.target is aten.transpose.int:
                transposed = {user.args[1] % n, user.args[2] % n} == {n - 2, n - 1}
            elif user.target is aten.permute.default:
                transposed = [d % n for d in user.args[1]][-2:] == [n - 1, n - 2]
            if not transposed and not (
                user.target in RESHAPES and exprs_of(meta.shape[-2:]) == rows_cols
            ):
                return False
        node = user
    return False


def _weight(a: Value, b: Value, bias: Value | None) -> BufferValue | None:
    """`b` as the row-major (out, in) matrix it is a transpose of, when the product is one
    oneDNN's linear computes: float32, `a` read row-major, a 1-d bias or none."""
    if not (_available() and a.dtype == DType.F32 and b.dtype == DType.F32):
        return None
    if not isinstance(b, BufferValue) or len(a.size) != 2 or len(b.size) != 2:
        return None
    (m, k), n = a.size, b.size[1]
    if not (isinstance(k, int) and isinstance(n, int)) or b.layout.stride != (1, k):
        return None  # the weight's sizes are static; a dynamic batch is chosen at run time
    if isinstance(m, int) and 2 * m * k * n < MIN_FLOPS:
        return None
    if isinstance(a, BufferValue) and a.layout.stride != (k, 1):
        return None
    if bias is not None and not (
        isinstance(bias, BufferValue) and bias.size == (n,) and bias.layout.stride == (1,)
    ):
        return None
    return BufferValue((n, k), b.dtype, b.buffer, Layout((n, k), (k, 1), b.layout.offset))


_BY_BUCKET: dict[tuple[int, int, int, bool], bool] = {}
"""The library per power-of-two bucket of the batch (and k, n, bias): set by the first
timing of a size in the bucket, a static graph's or a dynamic one's."""


def linear_by_size(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x @ w.t() (+ b) for a batch whose size varies (called from generated wrappers): oneDNN
    or torch.mm/addmm, decided once per power-of-two bucket of the batch (timed at the first
    size met in the bucket, unless a static graph of the process timed a size of it), never
    again per size."""
    m, (n, k) = x.shape[0], w.shape
    key = (m.bit_length(), k, n, b is not None)
    onednn = _BY_BUCKET.get(key)
    if onednn is None:
        onednn = 2 * m * k * n >= MIN_FLOPS and _onednn_faster(m, k, n, b is not None)
        _BY_BUCKET[key] = onednn
    if onednn:
        return torch_compat.onednn_linear()(x, w, b, "none", [], "")
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


@functools.cache
def _available() -> bool:
    return torch_compat.onednn_linear() is not None


@functools.cache
def _onednn_faster(m: int, k: int, n: int, with_bias: bool) -> bool:
    """Timed once per shape in a process; the answer also serves its batch's bucket."""
    faster = _time_onednn(m, k, n, with_bias)
    _BY_BUCKET.setdefault((m.bit_length(), k, n, with_bias), faster)
    return faster


def _time_onednn(m: int, k: int, n: int, with_bias: bool) -> bool:
    """oneDNN's linear against torch.mm/addmm on random data of this shape."""
    x, w = torch.randn(m, k), torch.randn(n, k)
    b = torch.randn(n) if with_bias else None
    onednn = torch_compat.onednn_linear()

    def library() -> Any:
        return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())

    def linear() -> Any:
        return onednn(x, w, b, "none", [], "")

    best = {library: float("inf"), linear: float("inf")}
    with torch.no_grad():
        for fn in best:
            fn()  # first calls: allocation, oneDNN's primitive creation
        for _ in range(ROUNDS):
            for fn in best:
                start = time.perf_counter()
                fn()
                best[fn] = min(best[fn], time.perf_counter() - start)
    return best[linear] <= MARGIN * best[library]
