"""Fusion is proven by counting kernels in the generated C++, not assumed."""

from __future__ import annotations

import copy
import re

import torch
import torch.nn.functional as F

from ember.backend.codegen.build import SPLIT
from tests.backend.helpers import check, compile_ember, extern_ops, kernel_count


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
    assert "xb += 64" in art.cpp  # blocks of adjacent columns


def test_pointwise_kernel_overwrites_a_dying_input_in_place():
    # mm's result dies in the GELU kernel, which reads each element once, at the element it
    # writes: the kernel writes into the GEMM's buffer instead of a new one
    def f(a, b):
        return F.gelu(a @ b) * 2

    (art,) = check(f, torch.randn(32, 48), torch.randn(48, 64))
    (ptrs,) = _kernel_pointers(art)
    assert len(ptrs) == 2 and ptrs[0] == ptrs[1]  # the same storage read and written
    # one storage behind two parameters: neither may be declared non-aliasing (with
    # __restrict__ gcc may reload a value after the store that replaced it)
    assert "__restrict__" not in art.cpp.split(SPLIT)[1].split("{")[0]


def test_small_in_place_kernel_is_right():
    """A batch norm over (3, 12) features: its statistics kernel is small (no parallel
    region) and overwrites the dying sums it reads; with both pointers declared
    __restrict__, gcc's vector code read a sum after overwriting it (running_var off by 4.7)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.BatchNorm1d(12))
    twin = copy.deepcopy(model)
    x = torch.randn(3, 8)
    model(x).square().mean().backward()
    compile_ember(twin)(x).square().mean().backward()
    for a, b in zip(model.state_dict().values(), twin.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad)


def _kernel_pointers(art) -> list[list[str]]:
    """The variables each kernel call of the wrapper passes."""
    calls = [ln for ln in art.wrapper.split("def call_boxed")[0].splitlines() if "_kernel" in ln]
    return [re.findall(r"(\w+)\.data_ptr", ln) for ln in calls]


def test_no_in_place_where_the_kernel_reads_other_elements():
    # y + y.t(): element (i, j) of the output reads y at (j, i), which a parallel row may
    # already have overwritten; and a buffer the kernel reads in a later loop (after a
    # reduction over its row) must survive the first loop's stores
    def f(a, b):
        y = a @ b
        z = a @ b.t()
        return (y + y.t()).relu(), z - z.amax(-1, keepdim=True)

    (art,) = check(f, torch.randn(40, 40), torch.randn(40, 40))
    assert all(len(set(p)) == len(p) for p in _kernel_pointers(art))


def test_gemm_operand_read_through_a_transpose_is_realized_once():
    # gelu's value feeds a GEMM through a transpose and is returned: one kernel writes it
    # once, in eager's layout, and the GEMM reads that buffer transposed
    def f(x, w):
        y = F.gelu(x)
        return y, y.t() @ w

    x, w = torch.randn(64, 32), torch.randn(64, 16)
    (art,) = check(f, x, w)
    assert kernel_count(art) == 1
    kernels = art.cpp[art.cpp.index('extern "C"') :]
    assert kernels.count("erfcf") == 1  # one erfc per element, in one kernel


def test_bias_gradient_over_two_dims_is_one_column_reduction():
    # summing (batch, seq, d) over batch and seq walks both as one row index: the column path
    def f(g):
        return g.sum((0, 1))

    (art,) = check(f, torch.randn(8, 96, 80), atol=1e-4, rtol=1e-5)
    assert "xb += 64" in art.cpp


def test_column_reduction_with_per_row_values():
    # layer norm's weight gradient: sum over rows of g * (x - mean[row]) * rstd[row]
    def f(g, x, mean, rstd):
        return (g * ((x - mean) * rstd)).sum(0)

    g, x = torch.randn(300, 48), torch.randn(300, 48)
    mean, rstd = torch.randn(300, 1), torch.rand(300, 1)
    (art,) = check(f, g, x, mean, rstd, atol=1e-4, rtol=1e-5)
    assert "xb += 64" in art.cpp


def test_multi_pass_row_kernel_prefetches_the_next_row():
    """Softmax reads each row three times: the first pass from memory, the later ones from
    cache. The second pass prefetches the next row's cache lines (one per block of 16 floats)
    so the first pass of the next row finds it in cache; small inputs stay in cache anyway
    and get no prefetch, and neither does a column walk."""

    def f(x):
        return torch.softmax(x, -1)

    (art,) = check(f, torch.randn(512, 1000))  # 2 MB
    body = art.cpp[art.cpp.index('extern "C" void kernel') :]
    fetches = re.findall(r"__builtin_prefetch\(&in0\[(.*)\], 0, 3\);", body)
    assert fetches == ["(1000 + rb + (1000*x0))"], fetches
    (small,) = check(f, torch.randn(64, 100))
    (cols,) = check(lambda x: torch.softmax(x, 0), torch.randn(1000, 512))
    assert "__builtin_prefetch" not in small.cpp + cols.cpp


def test_transcendental_table_read_broadcast_is_computed_once():
    """Rotary embeddings compute cos/sin of a (seq, dim) table and multiply them into every
    batch and head: the table is stored once (512 cos and sin), not recomputed for each of
    the 16384 elements that read it."""
    pos, inv = torch.arange(32.0), torch.rand(16)

    def rotary(q):
        angle = pos[:, None] * inv[None, :]
        return q * angle.cos() + q.flip(-1) * angle.sin()

    (art,) = check(rotary, torch.randn(4, 8, 32, 16))
    kernels = art.cpp.split("// ember: translation unit boundary")
    with_cos = [k for k in kernels if "__builtin_cosf" in k]
    assert len(with_cos) == 1
    (table,) = with_cos  # a 32 x 16 loop nest: 512 elements
    assert table.count("for (") == 2 and "x0 < 32;" in table and "x1 < 16;" in table


def test_small_static_kernels_open_no_parallel_region():
    """A kernel whose work is known at compile time to be below the threading threshold is
    a plain loop nest (a parallel region under a false `if` still costs an outlined
    function); a large or symbolic one keeps its region."""
    (small,) = check(lambda x: (x * 2).relu(), torch.randn(4, 64))
    (large,) = check(lambda x: (x * 2).relu(), torch.randn(512, 1024))
    assert "omp parallel" not in small.cpp and "omp simd" in small.cpp
    assert "omp parallel for" in large.cpp and "if(" not in large.cpp


def _channel_norm(x, w, b):
    """Batch-norm statistics over (N, H, W) and the normalization that reads them per
    channel, with the ReLU after it."""
    mean = x.mean((0, 2, 3), keepdim=True)
    var = x.var((0, 2, 3), keepdim=True, unbiased=False)
    return torch.relu((x - mean) * torch.rsqrt(var + 1e-5) * w[:, None, None] + b[:, None, None])


def test_per_channel_statistics_and_their_consumer_are_one_kernel():
    """The consumer of a per-channel statistic iterates (N, C, H, W): with C as the kernel's
    outer loop and (N, H, W) inner, it joins the statistics' kernel (Inductor's batch norm
    is one kernel too); a channel's slice is read again from cache."""
    x, w, b = torch.randn(3, 8, 5, 7), torch.randn(8), torch.randn(8)
    (art,) = check(_channel_norm, x, w, b)
    assert kernel_count(art) == 1
    (art,) = check(lambda x: F.batch_norm(x, None, None, training=True).relu(), x)
    assert kernel_count(art) == 1


def test_per_channel_consumer_of_a_last_dim_run_keeps_its_own_kernel():
    """(N, C) over outer (C,) would walk its innermost loop down a column: not fused."""

    def f(x):
        return x - x.mean(0)

    (art,) = check(f, torch.randn(64, 32))
    assert kernel_count(art) == 2
