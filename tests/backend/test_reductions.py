"""Reductions against eager over every dim, keepdim, NaN, integers, empty dims."""

from __future__ import annotations

import pytest
import torch

from ember.backend.compile import record
from tests.backend.helpers import check, compile_ember, kernel_count


def reductions(x):
    out = []
    for d in range(x.dim()):
        out += [
            x.sum(d),
            x.mean(d, keepdim=True),
            x.amax(d),
            x.amin(d, keepdim=True),
            x.var(d),
        ]
    return out + [x.sum(), x.amax(), x.mean((0, 2)), x.prod(1), x.std(-1, correction=0)]


@pytest.mark.parametrize("transposed", [False, True])
def test_every_dim(transposed):
    x = torch.randn(5, 7, 9)
    if transposed:
        x = torch.randn(9, 7, 5).permute(2, 1, 0)
    check(reductions, x)


def test_nan_and_inf_propagate():
    x = torch.randn(6, 33)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3, :] = -float("inf")

    def f(x):
        return x.amax(-1), x.amin(-1), x.sum(-1), torch.softmax(x, -1), x.amax(0)

    check(f, x)


def test_integer_and_bool_reductions():
    x = torch.randint(-100, 100, (4, 50), dtype=torch.int32)

    def f(x):
        return x.sum(-1), x.amax(0), (x > 0).sum(1), x.long().prod(0) % 7

    check(f, x)


def test_empty_reduction_dims():
    def f(x):
        return x.sum(1), x.mean(1), x.sum(0)

    check(f, torch.randn(3, 0))


def test_large_sum_accuracy():
    x = torch.rand(1 << 20) + 1.0

    def f(x):
        return x.sum(), x.view(1024, 1024).sum(0)

    check(f, x, rtol=1e-5, atol=1e-2)


def test_softmax_variants_fuse_to_one_kernel():
    def f(x):
        return torch.softmax(x, -1), torch.log_softmax(x, -1)

    (art,) = check(f, torch.randn(64, 100))
    assert kernel_count(art) == 1


def test_softmax_computes_exp_once_and_keeps_it_in_the_output():
    (art,) = check(lambda x: torch.softmax(x, -1), torch.randn(64, 100))
    kernel = art.cpp[art.cpp.index('extern "C" void kernel') :]
    # the exp-and-sum loop (vector body + tail) writes exp into the output row, which the
    # normalizing loop then scales in place: no second exp, no scratch array
    assert kernel.count("ember_expf_shifted(") == 2
    assert "scratch" not in kernel
    # two outputs of the same row: one can hold exp, so a scratch array is still needed
    (art,) = check(lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1)), torch.randn(8, 9))
    assert "scratch" in art.cpp


def test_softmax_with_underflowing_exps():
    # scores 0..200 apart: exp(x - max) leaves float's normal range (and underflows to 0)
    x = torch.linspace(-200.0, 0.0, 400).reshape(4, 100) * torch.tensor([[1.0], [0.5], [0.1], [2]])
    check(lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1)), x)


def test_safe_softmax_zeros_fully_masked_rows_in_one_kernel():
    # SDPA's math path: masked scores, then aten._safe_softmax (all -inf rows give 0, not NaN)
    x = torch.randn(3, 4, 8)
    x[2, 0, 0] = float("nan")
    mask = torch.rand(3, 4, 8) > 0.5
    mask[0, 1] = True
    mask[1, 2, :3] = True

    def f(x, mask):
        return torch.ops.aten._safe_softmax(x.masked_fill(mask, float("-inf")) * 2, -1)

    (art,) = check(f, x, mask)
    assert kernel_count(art) == 1
    assert "_safe_softmax" not in art.wrapper  # lowered, not a fallback


def test_softmax_over_leading_dim():
    check(lambda x: torch.softmax(x, 0), torch.randn(33, 20))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int64])
def test_other_dtypes(dtype):
    x = (torch.randn(6, 10) * 10).to(dtype)

    def f(x):
        out = [x.sum(0), x.sum(1), x.amax(1), x.amin(0), (x * 2).sum()]
        if x.is_floating_point():
            out += [x.mean(-1), torch.softmax(x, 0), torch.nn.functional.layer_norm(x, (10,))]
        return out

    tol = {"atol": 5e-2, "rtol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    check(f, x, **tol)


def test_column_reductions_read_rows_in_order():
    x = torch.randn(300, 70)

    def f(x):
        return x.sum(0), x.amax(0), (x * 2).mean(0)

    (art,) = check(f, x, atol=1e-4, rtol=1e-5)
    assert "for (int64_t xb = 0;" in art.cpp  # the interchanged (row-order) form


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_softmax_backward_is_lowered(op, dim, dtype):
    from ember.backend.compile import record
    from tests.backend.helpers import compile_ember

    x = torch.randn(7, 9, 5, dtype=dtype)
    x[0, 0, 0] = -float("inf")
    grad = torch.randn_like(x)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()

    def f(x):
        return getattr(torch, op)(x * 2, dim)

    with record() as arts:
        compile_ember(f)(mine).backward(grad)
    f(ref).backward(grad)
    torch.testing.assert_close(mine.grad, ref.grad, equal_nan=True)
    assert "_backward_data" not in arts[-1].wrapper


@pytest.mark.parametrize("shape,normalized", [((6, 5, 8), (8,)), ((4, 6, 10), (6, 10))])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_layer_norm_backward_is_lowered(shape, normalized, affine, dtype):
    m = torch.nn.LayerNorm(normalized, elementwise_affine=affine).to(dtype)
    if affine:
        with torch.no_grad():
            m.weight.normal_()
            m.bias.normal_()
    x, grad = torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    with record() as arts:
        compile_ember(m)(mine).backward(grad)
    got = [mine.grad] + [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(ref).backward(grad)
    want = [ref.grad] + [p.grad for p in m.parameters()]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert "layer_norm_backward" not in arts[-1].wrapper
