"""Reductions and row kernels from the Triton generator against eager: every reduction kind
over every dim, keepdim, NaN/Inf, integers, empty dims, rows in one tile and rows walked in
chunks, columns; softmax / log_softmax / layer norm / RMS norm as one kernel each; a GEMM
with its fused epilogue; symbolic sizes."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import ember.backend
from ember.backend.codegen import triton_code
from tests.backend.test_reductions import reductions  # every kind over every dim
from tests.triton.helpers import check, extern_ops, kernel_count


@pytest.mark.parametrize("transposed", [False, True])
def test_every_kind_over_every_dim(transposed):
    x = torch.randn(9, 7, 5).permute(2, 1, 0) if transposed else torch.randn(5, 7, 9)
    check(reductions, x, atol=1e-5, rtol=1e-5)


def test_nan_and_inf_propagate():
    x = torch.randn(5, 40)
    x[0, 7], x[2, 0] = float("nan"), -float("inf")
    x[:, 3] = float("inf")  # a column of +inf: every row's max, softmax NaN
    x[4] = -float("inf")  # a row of -inf: softmax NaN, as eager's

    def f(x):
        return x.amax(-1), x.amin(-1), x.sum(-1), torch.softmax(x, -1), x.amax(0), x.amin(0)

    check(f, x)


def test_integer_and_bfloat16_and_empty():
    i = torch.randint(-9, 9, (4, 6))
    b = torch.randn(4, 40).bfloat16()
    e = torch.randn(3, 0)
    check(lambda i: (i.sum(1), i.amax(0), i.amin(1), i.prod(0)), i)
    check(lambda b: (b.sum(-1), b.amax(-1), b.mean(0)), b, atol=1e-2, rtol=1e-2)
    check(lambda h: (h.sum(-1), h.amax(-1), h.mean(0)), b.half(), atol=1e-2, rtol=1e-2)
    check(lambda e: (e.sum(1), e.prod(1), e.mean(0)), e)


def test_argmax_runs_beside_triton_kernels():
    x = torch.randn(5, 11)
    arts = check(lambda x: ((x * 2).argmax(-1), (x * 2).softmax(-1)), x)
    assert any("argmax" in op for op in extern_ops(arts[0]))  # not lowered: an aten call


@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_row_kernels_are_one_kernel(fn):
    x = torch.randn(6, 50)
    w, b = torch.randn(50), torch.randn(50)
    fns = {
        "softmax": lambda x: torch.softmax(x * 0.5, -1),
        "log_softmax": lambda x: F.log_softmax(x, -1),
        "layer_norm": lambda x: F.layer_norm(x, (50,), w, b),
        "rms_norm": lambda x: F.rms_norm(x, (50,), w),
    }
    arts = check(fns[fn], x, atol=1e-5, rtol=1e-5)
    assert kernel_count(arts[0]) == 1
    assert "for roffset" not in arts[0].cpp  # the row fits one tile


def test_long_rows_loop_over_chunks():
    n = triton_code.PERSISTENT_MAX + 904  # longer than one tile: walked in chunks
    x = torch.randn(2, n)
    x[1, 7] = float("nan")

    def f(x):
        return x.sum(-1), x.amax(-1), torch.softmax(x, -1), F.layer_norm(x, (n,))

    arts = check(f, x, atol=1e-5, rtol=1e-4)
    assert "for roffset" in arts[0].cpp


def test_column_reduction():
    x = torch.randn(64, 48)
    arts = check(lambda x: (x.sum(0), x.amax(0), (x * x).mean(0)), x, atol=1e-5, rtol=1e-5)
    assert "columns" in arts[0].ir_text  # the plan's form, shown with the schedule


def test_linear_gelu_epilogue():
    x, w, b = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)
    arts = check(lambda x: F.gelu(F.linear(x, w, b)).sum(-1), x, atol=1e-5, rtol=1e-5)
    ops = extern_ops(arts[0])
    assert any("mm" in op or "linear" in op for op in ops)  # the GEMM is a library call
    assert kernel_count(arts[0]) >= 1


def test_symbolic_sizes():
    def f(x):
        return torch.softmax(x, -1) * 2, x.sum(0)

    arts = check(f, torch.randn(5, 12), dynamic=True, atol=1e-6, rtol=1e-5)
    assert re.search(r"^    s\d+ = ", arts[0].wrapper, re.M)  # sizes read per call
    compiled = torch.compile(f, backend=ember.backend, dynamic=True)
    for shape in [(5, 12), (7, 20), (3, 1100)]:  # one graph, kernels with runtime sizes
        x = torch.randn(*shape)
        for got, want in zip(compiled(x), f(x)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_per_channel_statistics_and_their_consumer():
    """Batch-norm statistics and the normalization in one kernel (fusion.py's inner run)."""
    from tests.backend.test_fusion import _channel_norm

    (art,) = check(_channel_norm, torch.randn(3, 8, 5, 7), torch.randn(8), torch.randn(8))
    assert kernel_count(art) == 1
