"""Pointwise ops against eager: dtypes, broadcasting, strides, size-0/1 dims, NaN/Inf."""

from __future__ import annotations

import pytest
import torch

from ember.backend.compile import record
from tests.backend.helpers import check, compile_ember, extern_ops, kernel_count

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -3.5, 80.0])


def _floats(dtype: torch.dtype, n: int = 67) -> torch.Tensor:
    x = torch.cat([torch.randn(n - SPECIAL.numel()) * 3, SPECIAL])
    return x.to(dtype)


def unary_all(x):
    return (
        torch.exp(x),
        torch.log(x.abs()),
        torch.tanh(x),
        torch.sigmoid(x),
        torch.erf(x),
        torch.sqrt(x.abs()),
        torch.rsqrt(x.abs() + 1),
        torch.relu(x),
        torch.nn.functional.gelu(x),
        torch.nn.functional.gelu(x, approximate="tanh"),
        torch.nn.functional.silu(x),
        torch.neg(x).abs().floor(),
        torch.clamp(x, -1, 2),
        torch.isnan(x) | torch.isinf(x),
        x.reciprocal(),
        torch.expm1(x) + torch.log1p(x.abs()),
        torch.sin(x) * torch.cos(x),
    )


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str
)
def test_unary_ops_with_special_values(dtype):
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    check(unary_all, _floats(dtype), **tol)


def test_exp_log_tanh_erf_accuracy_over_range():
    x = torch.linspace(-100, 100, 100003)

    def f(x):
        return (
            torch.exp(x),
            torch.log(x.abs() + 1e-38),
            torch.tanh(x),
            torch.erf(x / 10),
            torch.sigmoid(x),
            torch.nn.functional.silu(x / 10),
        )

    check(f, x)


def test_exp_keeps_subnormal_results():
    """exp's results below float's normal range (x in [-104, -87.3]) are the subnormals eager
    gives, not 0, so log(exp(x)) stays finite there as in eager."""
    x = torch.linspace(-103.5, -87.5, 4001)

    def f(x):
        return torch.exp(x)

    check(f, x)  # compiled, not run as aten ops
    got = compile_ember(f)(x)
    assert (got > 0).all()
    torch.testing.assert_close(got, torch.exp(x), rtol=1e-6, atol=3e-45)


def binary_all(a, b):
    return (
        a + b * 2,
        a - b,
        a * b,
        a / b,
        torch.maximum(a, b),
        torch.minimum(a, b),
        a > b,
        a == b,
        torch.where(a > 0, a, b),
        torch.pow(a, 2) + torch.pow(b.abs(), 0.5),
    )


def test_binary_broadcast_and_transposed():
    a = torch.randn(6, 5)
    b = torch.randn(5, 6).t()  # transposed (non-contiguous) operand
    check(binary_all, a, b)
    c = torch.randn(1, 5)  # broadcast along dim 0
    check(binary_all, a, c)


def test_non_contiguous_slices_and_expand():
    x = torch.randn(8, 10)[::2, 1:9]

    def f(x, y):
        return (x * 2).t() + y.expand(8, 4), (x[:, :4] - 1).permute(1, 0)

    check(f, x, torch.randn(1, 4))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (1,), (1, 1, 5), ()])
def test_size_zero_and_one_dims(shape):
    def f(x):
        return torch.exp(x) * 2 + 1, x.sum(-1) if x.dim() else x + 1

    check(f, torch.randn(shape))


def test_integer_and_bool_ops():
    a = torch.randint(-50, 50, (7, 3))
    b = torch.randint(1, 9, (7, 3), dtype=torch.int32)

    def f(a, b):
        return (
            a + b,
            a * 3 - b,
            a / b,
            a & 6,
            torch.maximum(a, b.long()),
            (a > 0) & (b < 5),
            ~(a > 0),
            torch.where(a > b, a, -a),
            a.abs(),
            a.float() * 0.5,
        )

    check(f, a, b)


def test_dtype_conversions():
    x = torch.randn(33) * 100

    def f(x):
        return x.to(torch.int64), x.to(torch.bfloat16), x.to(torch.float64), x.to(torch.bool)

    check(f, x)
    # float16 both ways: round to nearest even, overflow to inf, subnormals kept
    y = torch.cat([x * 1000, torch.tensor([65504.0, 65520.0, 1e-7, 3e-8, float("nan")])])
    (art,) = check(lambda y: (y.half(), y.half().float() * 2, y.half().to(torch.bfloat16)), y)
    assert extern_ops(art) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_inputs_compute_in_float(dtype):
    a = torch.randn(40, 17).to(dtype)
    b = torch.randn(17).to(dtype)

    def f(a, b):
        return torch.nn.functional.gelu(a * b + 1), torch.softmax(a, -1)

    (art,) = check(f, a, b, atol=1e-2, rtol=1e-2)
    assert extern_ops(art) == []  # kernels of their own, not aten
    assert ("ember_f16" if dtype == torch.float16 else "ember_bf16") in art.cpp


def test_pointwise_chain_is_one_kernel():
    def f(x, y):
        return torch.relu(x * 2 + y).sigmoid() - x

    (art,) = check(f, torch.randn(1000), torch.randn(1000))
    assert kernel_count(art) == 1


def test_views_are_index_arithmetic_not_copies():
    def f(x):
        y = x.view(4, 6).t().reshape(2, 12)  # the reshape cannot be a strided view
        return (y * 2).sum(0), x.view(2, 12)[1:, ::3] + 1

    (art,) = check(f, torch.randn(24))
    assert "clone" not in art.wrapper and "copy" not in art.wrapper


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gelu_backward_is_one_fused_kernel(approximate, dtype):
    x = torch.randn(64, 33, dtype=dtype) * 3
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    grad = torch.randn_like(x)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()

    def f(x):
        return torch.nn.functional.gelu(x, approximate=approximate)

    with record() as arts:
        compile_ember(f)(mine).backward(grad)
    f(ref).backward(grad)
    torch.testing.assert_close(mine.grad, ref.grad, equal_nan=True)
    backward = arts[-1]
    assert "gelu_backward" not in backward.wrapper and kernel_count(backward) == 1


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str
)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_is_one_kernel_with_its_pointwise_producers(dim, dtype):
    def f(a, b, c):
        return torch.cat([a * 2, b.transpose(0, 1).exp(), c], dim) + 1

    shape = [6, 5, 7]
    sizes = (3, 4, 2)
    a, b, c = (torch.randn(*shape[: dim % 3], n, *shape[dim % 3 + 1 :]) for n in sizes)
    b = b.transpose(0, 1).contiguous()  # read transposed inside the kernel
    a.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
    (art,) = check(f, a, b, c)
    assert kernel_count(art) == 1 and "cat" not in art.wrapper


def test_cat_promotes_and_skips_empty_pieces():
    def f(a, b, empty, legacy):
        return torch.cat([a, empty, b, legacy], 1)

    a, b = torch.randn(4, 3), torch.arange(8, dtype=torch.int64).view(4, 2)
    (art,) = check(f, a, b, torch.randn(4, 0), torch.randn(0))
    assert "cat" not in art.wrapper


def test_integer_cat_stays_a_fallback():
    def f(a, b):
        return torch.cat([a, b // 2], 0)

    a, b = torch.arange(6).view(2, 3), torch.arange(9).view(3, 3)
    (art,) = check(f, a, b)
    assert "cat" in art.wrapper


def test_cat_along_the_innermost_dim_splits_the_loop_instead_of_masking():
    def f(a, b):
        return torch.cat([a.sigmoid(), b], -1)

    (art,) = check(f, torch.randn(8, 40), torch.randn(8, 24))
    kernel = art.cpp[art.cpp.index('extern "C"') :]
    assert "x1 = 40; x1 < 64" in kernel  # the second piece's own loop
    assert "<= x1 &&" not in kernel  # no masked loads left


def test_innermost_dim_split_by_a_view_is_walked_in_blocks():
    # heads x head_dim merged back into one dim: out[b, s, h*16 + d] = x[b, h, s, d]. Read
    # through div/mod of the innermost variable the loop would not vectorize; split into
    # blocks of 16, every index is affine in the inner variable
    def f(x):
        return x.transpose(1, 2).reshape(2, 8, 64) * 2

    (art,) = check(f, torch.randn(2, 4, 8, 16))
    kernel = art.cpp[art.cpp.index('extern "C"') :]
    assert "x2b < 4" in kernel and "x2l < 16" in kernel
    assert " / " not in kernel and " % " not in kernel


def _shift_right(ids):
    """transformers' shift_tokens_right: a new_zeros, a slice_scatter and a select_scatter
    after functionalization."""
    out = ids.new_zeros(ids.shape)
    out[:, 1:] = ids[:, :-1].clone()
    out[:, 0] = 7
    return out * 2


def _scatter_sin(x, y):
    return torch.slice_scatter(x, y.sin(), 1, 2, 5)


@pytest.mark.parametrize(
    "fn, args",
    [
        (_shift_right, (torch.randint(0, 100, (3, 9)),)),
        (_shift_right, (torch.randn(3, 9),)),
        (lambda x: x.repeat(2, 3) + 1, (torch.randn(4, 5),)),
        (lambda x: x.repeat(2, 1, 3).exp(), (torch.randn(4, 5),)),
        (lambda x: x.repeat(3), (torch.randn(1),)),
        (lambda x: x.t().repeat(1, 2), (torch.randn(4, 5),)),
        (_scatter_sin, (torch.randn(4, 8), torch.randn(4, 3))),
        (lambda x, y: torch.slice_scatter(x, y, 0, -3), (torch.randn(5, 2), torch.randn(3, 2))),
        (lambda x, y: torch.select_scatter(x, y * 3, 0, -1), (torch.randn(4, 8), torch.randn(8))),
        (lambda x: x.new_full((2, 3), 2.5) + x.sum(), (torch.randn(4),)),
        (lambda x: x.new_ones((2, 3), dtype=torch.int64) * 3, (torch.randn(4),)),
    ],
    ids=lambda v: "" if isinstance(v, tuple) else None,
)
def test_scatters_repeat_and_new_factories_are_lowered(fn, args):
    (art,) = check(fn, *args)
    assert extern_ops(art) == []


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str
)
def test_hardtanh_backward_is_lowered(dtype):
    """ReLU6's backward (MobileNetV2's training step called it 35 times as aten): zero at
    and outside the bounds, the gradient inside. (NaN: eager's answer depends on whether
    the element falls in its vector loop or its scalar tail; ember gives the vector loop's.)"""
    x = torch.tensor([-1.0, 0.0, 0.5, 6.0, 7.0, -float("inf"), float("inf"), 3.0], dtype=dtype)
    x = torch.cat([x, torch.randn(40, dtype=dtype) * 4])
    g = torch.randn(x.shape, dtype=dtype)
    (art,) = check(lambda g, x: torch.ops.aten.hardtanh_backward(g, x, 0.0, 6.0), g, x)
    assert extern_ops(art) == []
    (art,) = check(lambda g, x: torch.ops.aten.hardtanh_backward(g, x, -1.0, 1.0) * 2, g, x)
    assert extern_ops(art) == []


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str
)
def test_sigmoid_backward_is_lowered(dtype):
    """The sigmoid's backward (RegNet's squeeze-excitation): no aten call left, values as
    eager's, also fused with what reads it; and a training step through torch.sigmoid."""
    y = torch.sigmoid(torch.cat([torch.tensor([-50.0, 0.0, 50.0]), torch.randn(45) * 4]))
    y, g = y.to(dtype), torch.randn(48, dtype=dtype)
    (art,) = check(lambda g, y: torch.ops.aten.sigmoid_backward(g, y), g, y)
    assert extern_ops(art) == []
    (art,) = check(lambda g, y: torch.ops.aten.sigmoid_backward(g * 2, y).exp(), g, y)
    assert extern_ops(art) == []
    x = torch.randn(6, 7, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    (x * torch.sigmoid(x)).sum().backward()
    compile_ember(lambda x: x * torch.sigmoid(x))(x2).sum().backward()
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    torch.testing.assert_close(x2.grad, x.grad, **tol)
