"""Pointwise kernels from the Triton generator against eager: every unary and binary op of
the loop IR, NaN/Inf, dtypes, broadcasting, strided inputs, size-0/1 dims, concatenation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.triton.helpers import check, extern_ops, kernel_count

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 2.5, -2.5, 0.5])


def _floats(*shape, dtype=torch.float32):
    x = torch.randn(*shape)
    x.view(-1)[: len(SPECIAL)] = SPECIAL[: x.numel()]
    return x.to(dtype)


def unary_ops(x):
    return (
        x.exp(),
        x.log(),
        x.abs().sqrt(),
        x.rsqrt(),
        x.tanh(),
        x.sigmoid(),
        x.erf(),
        x.expm1(),
        x.log1p(),
        x.sin(),
        x.cos(),
        x.floor(),
        x.ceil(),
        x.trunc(),
        x.round(),
        -x,
        x.reciprocal(),
        x.relu(),
        x.sign(),
        x.isnan(),
        x.isinf(),
        F.gelu(x),
        F.gelu(x, approximate="tanh"),
        F.silu(x),
    )


def binary_ops(x, y):
    return (
        x + y,
        x - y,
        x * y,
        x / y,
        torch.maximum(x, y),
        torch.minimum(x, y),
        x.abs() ** y,
        torch.atan2(x, y),
        x < y,
        x >= y,
        x == y,
        torch.where(x > 0, x, y),
        torch.clamp(x, -1, 1),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_unary_with_nan_and_inf(dtype):
    # 16-bit floats: torch's default tolerance (one step; each library rounds its own)
    tol = {} if dtype in (torch.bfloat16, torch.float16) else {"atol": 2e-6, "rtol": 2e-5}
    arts = check(unary_ops, _floats(4, 9, dtype=dtype), **tol)
    assert kernel_count(arts[0]) == 1  # every output of one pointwise space: one kernel


def test_binary_broadcasting_nan_inf():
    x, y = _floats(3, 1, 7), _floats(5, 7)
    y.view(-1)[8:16] = SPECIAL
    check(binary_ops, x, y, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_computes_in_float32(dtype):
    x, y = _floats(6, 10, dtype=dtype), _floats(10, dtype=dtype)
    arts = check(lambda a, b: (a * b + a.exp()).tanh() - b, x, y)
    assert kernel_count(arts[0]) == 1 and not extern_ops(arts[0])


def test_float16_conversions_round_to_nearest_even():
    """Stores and casts to float16 round as eager does: ties to even, overflow to inf,
    subnormals kept; values come back to float32 exactly."""
    x = torch.cat([torch.randn(40) * 1000, torch.tensor([65504.0, 65520.0, 1e-7, 3e-8, 2049.0])])
    arts = check(lambda x: (x.half(), (x.half().float() * 3).half(), x.half() + 1), x)
    assert not extern_ops(arts[0])


def test_integers_and_bools():
    a = torch.randint(-50, 50, (4, 6))
    b = torch.randint(1, 9, (6,), dtype=torch.int32)

    def f(a, b):
        return (
            a + b,
            a * 3 - b,
            torch.div(a, b, rounding_mode="trunc"),
            a.abs(),
            a > b,
            (a > 0) & (b < 5),
            (a > 0) | (b < 5),
            ~(a > 0),
            a.to(torch.int8) + 1,
            (a.abs() % 200).to(torch.uint8),
            a.float() / 3,
        )

    check(f, a, b)


def test_strided_and_transposed_inputs():
    base = torch.randn(8, 12)
    x = base.t()  # transposed
    y = base[::2, 1::3]  # sliced with steps
    check(lambda x, y: (x * 2 + 1, y.exp() - y), x, y)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (1, 1), (1, 7), (5, 1)])
def test_size_zero_and_one_dims(shape):
    x = torch.randn(*shape)
    check(lambda x: (x.sigmoid() * 2, x + x.t().t()), x)


def test_cat_reads_masked_pieces():
    a, b, c = torch.randn(4, 3), torch.randn(4, 5), torch.randn(4, 2)
    arts = check(lambda a, b, c: torch.cat([a.exp(), b * 2, c], dim=1) + 1, a, b, c)
    assert kernel_count(arts[0]) == 1


def test_views_that_divide_the_index():
    x = torch.randn(4, 6, 10)
    check(lambda x: x.transpose(1, 2).reshape(4, 60) * 3 + x.reshape(4, 60), x)


def test_large_block_count():
    x = torch.randn(5000)  # several programs of the pointwise tile
    check(lambda x: torch.tanh(x) * x, x)
