"""Fusion is proven by counting kernels in the generated C++, not assumed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.backend.helpers import check, extern_ops, kernel_count


def test_layer_norm_is_one_kernel():
    ln = torch.nn.LayerNorm(64)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()

    def f(x):
        return ln(x)

    (art,) = check(f, torch.randn(32, 64))
    assert kernel_count(art) == 1
    assert "local=['buf" in art.ir_text  # mean and variance never touch memory


def test_hand_written_layer_norm_is_one_kernel():
    w, b = torch.randn(80), torch.randn(80)

    def f(x):
        mean = x.mean(-1, keepdim=True)
        d = x - mean
        var = (d * d).mean(-1, keepdim=True)
        return d / torch.sqrt(var + 1e-5) * w + b

    (art,) = check(f, torch.randn(16, 80))
    assert kernel_count(art) == 1


def test_rms_norm_is_one_kernel():
    w = torch.randn(48)

    def f(x):
        return F.rms_norm(x, (48,), w, 1e-6)

    (art,) = check(f, torch.randn(10, 48))
    assert kernel_count(art) == 1


def test_gelu_after_matmul_is_one_pointwise_kernel_after_the_gemm():
    lin = torch.nn.Linear(32, 64)

    def f(x):
        return F.gelu(lin(x))

    (art,) = check(f, torch.randn(8, 32))
    assert kernel_count(art) == 1
    assert extern_ops(art) == ["torch.mm"]  # bias add moved into the GELU kernel


def test_linear_without_epilogue_keeps_addmm():
    lin = torch.nn.Linear(32, 16)
    (art,) = check(lambda x: lin(x), torch.randn(8, 32))
    assert kernel_count(art) == 0
    assert extern_ops(art) == ["torch.addmm"]


def test_mlp_block_three_dim_input():
    fc1, fc2 = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def f(x):
        return fc2(F.gelu(fc1(x)))

    (art,) = check(f, torch.randn(4, 6, 32), atol=1e-5, rtol=1e-4)
    assert kernel_count(art) == 1


def test_sibling_outputs_share_a_loop():
    def f(x):
        return x.exp(), x.sin()

    (art,) = check(f, torch.randn(100))
    assert kernel_count(art) == 1


def test_buffers_are_reused():
    def f(x):
        a = torch.softmax(x, -1) @ x.t()
        b = torch.softmax(a, -1) @ x
        c = torch.softmax(b, -1) @ x.t()
        return c.sum(-1)

    (art,) = check(f, torch.randn(32, 32), atol=1e-5, rtol=1e-4)
    assert " = buf" in art.wrapper  # a dead buffer's storage taken by a later kernel


def test_column_sum_keeps_its_own_kernel():
    # y.sum(0) walks down columns; fused with y's row-major pointwise kernel (same 64 x 64
    # space) it would iterate y column by column. Alone it takes codegen's column path.
    def f(x, g):
        y = torch.tanh(x) * g
        return y, y.sum(0)

    (art,) = check(f, torch.randn(64, 64), torch.randn(64, 64))
    assert kernel_count(art) == 2
    column = art.cpp[art.cpp.index('extern "C" void kernel0') :]
    assert "xb += 64" in column.split('extern "C"')[1]  # blocks of adjacent columns
