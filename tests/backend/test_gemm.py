"""Library GEMM choice: oneDNN's linear or torch.mm/addmm, values against eager either way.

Which one runs is decided by timing (lowering/gemm.py); these tests force each answer so
both call paths are checked deterministically. Each test uses its own shapes: the graph
cache (shared by the session) keys on the graph, not on the timing's outcome.
"""

from __future__ import annotations

import pytest
import torch

from ember.backend.lowering import gemm
from tests.backend.helpers import check, extern_ops

needs_onednn = pytest.mark.skipif(not gemm._available(), reason="torch built without oneDNN")


@pytest.fixture
def onednn_wins(monkeypatch):
    monkeypatch.setattr(gemm, "_onednn_faster", lambda *shape: True)


@pytest.fixture
def onednn_loses(monkeypatch):
    monkeypatch.setattr(gemm, "_onednn_faster", lambda *shape: False)


@needs_onednn
def test_linear_layers_call_onednn_when_it_is_faster(onednn_wins):
    mlp = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)
    )
    (art,) = check(mlp, torch.randn(64, 512), atol=1e-4, rtol=1e-4)
    ops = extern_ops(art)
    assert len(ops) == 2 and all("_linear_pointwise" in op for op in ops)
    # the first layer's bias joins the GELU kernel; the second passes its bias to oneDNN
    assert "None, 'none'" in art.wrapper and art.wrapper.count("'none'") == 4


@needs_onednn
def test_matmul_by_a_transposed_weight_calls_onednn(onednn_wins):
    def f(x, w):
        return x @ w.t()

    (art,) = check(f, torch.randn(80, 512), torch.randn(1024, 512), atol=1e-4, rtol=1e-4)
    assert any("_linear_pointwise" in op for op in extern_ops(art))


def test_linear_keeps_torch_addmm_when_onednn_is_slower(onednn_loses):
    lin = torch.nn.Linear(512, 1056)
    (art,) = check(lin, torch.randn(72, 512), atol=1e-4, rtol=1e-4)
    assert extern_ops(art) == ["torch.addmm"]


@pytest.mark.parametrize(
    "case",
    ["small", "float64", "a transposed", "weight not transposed"],
)
def test_products_oneDNN_does_not_take(case, onednn_wins):
    x, w = torch.randn(96, 512), torch.randn(1088, 512)
    if case == "small":
        x, w = torch.randn(8, 16), torch.randn(24, 16)
    elif case == "float64":
        x, w = x.double(), w.double()
    elif case == "a transposed":
        x = torch.randn(512, 96).t()

    def f(x, w):
        if case == "weight not transposed":
            return x @ w.t().contiguous()
        return x @ w.t()

    (art,) = check(f, x, w, atol=1e-4, rtol=1e-4)
    assert extern_ops(art) == ["torch.mm"]


def test_batched_product_copied_transposed_is_computed_transposed():
    # (a @ b) is only read through a transpose by a contiguous copy: bmm(b^T, a^T) writes it
    # in the layout the copy walks, so the copy reads it contiguously
    def f(a, b):
        return (a @ b).transpose(1, 2).contiguous()

    a, b = torch.randn(3, 20, 12), torch.randn(3, 12, 24)
    (art,) = check(f, a, b, atol=1e-5, rtol=1e-5)
    call = next(ln for ln in art.wrapper.splitlines() if "= _op" in ln)
    assert call.split("(", 1)[1].startswith("_alias(in1, (3, 24, 12)")


@pytest.mark.parametrize("consumer", ["pointwise", "direct"])
def test_batched_product_read_otherwise_is_left_alone(consumer):
    # a pointwise op on the transpose keeps eager's transposed strides: it walks the
    # product in its own layout
    def f(a, b):
        p = a @ b
        return p.transpose(1, 2) * 2 if consumer == "pointwise" else p * 2

    (art,) = check(f, torch.randn(3, 20, 12), torch.randn(3, 12, 24), atol=1e-5, rtol=1e-5)
    call = next(ln for ln in art.wrapper.splitlines() if "= _op" in ln)
    assert call.split("(", 1)[1].startswith("in0, in1")


def test_read_only_operands_at_storage_offsets():
    # FSDP1's parameters are views of one flat parameter at offsets, and a sliced input
    # starts inside its storage: the extern ops' read-only aliases (_reinterpret_tensor
    # adds its offset to the tensor's own) must land where each operand starts.
    flat = torch.randn(7 + 24 * 16 + 16 + 16 * 8)
    w1 = flat[7 : 7 + 24 * 16].view(16, 24)
    b1 = flat[7 + 24 * 16 : 7 + 24 * 16 + 16]
    w2 = flat[7 + 24 * 16 + 16 :].view(8, 16)

    def f(x, w1, b1, w2):
        h = torch.nn.functional.linear(x, w1, b1).relu()
        return h @ w2.t(), torch.mm(x[2:], w1.t())

    x = torch.randn(10, 24)[1:]
    assert x.storage_offset() == 24 and w1.storage_offset() == 7
    (art,) = check(f, x, w1, b1, w2, atol=1e-5, rtol=1e-5)
    assert "_alias(" in art.wrapper  # the path under test
