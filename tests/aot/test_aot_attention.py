"""Scaled dot-product attention is traced as the kernel eager runs on CPU (the fused flash
kernel where PyTorch's chooser picks it), with eager's exact numbers and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend.compile import record

FLASH = "_scaled_dot_product_flash_attention_for_cpu"


def _qkv(dtype=torch.float32):
    return [torch.randn(2, 3, 16, 8, dtype=dtype) for _ in range(3)]


def bool_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2


def float_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m.float().log(), scale=0.3)


def causal(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(-1)


@pytest.mark.parametrize("fn", [bool_mask, float_mask, causal], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_inference_runs_eagers_fused_kernel(fn, dtype):
    q, k, v = _qkv(dtype)
    m = torch.rand(2, 1, 16, 16) > 0.3
    with torch.no_grad(), record() as arts:
        got = ember.compile(fn)(q, k, v, m)
    torch.testing.assert_close(got, fn(q, k, v, m))
    (art,) = arts
    assert FLASH in art.wrapper and "bmm" not in art.wrapper


@pytest.mark.parametrize("fn", [bool_mask, causal], ids=lambda f: f.__name__)
def test_training_gradients_match_eager(fn):
    q, k, v = _qkv()
    m = torch.rand(2, 1, 16, 16) > 0.3
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ember.compile(fn)(*mine, m).pow(2).sum().backward()
    fn(*ref, m).pow(2).sum().backward()
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_training_through_split_projections():
    # GPT-2's pattern: one projection split into q, k, v views feeding the fused kernel; the
    # partitioner must save the split's items (or recompute them), never the split's list
    proj = torch.nn.Linear(8, 24)

    def f(x):
        q, k, v = (t.view(2, 16, 2, 4).transpose(1, 2) for t in proj(x).split(8, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    x = torch.randn(2, 16, 8, requires_grad=True)
    ember.compile(f)(x).pow(2).sum().backward()
    mine = [x.grad, proj.weight.grad, proj.bias.grad]
    x.grad = proj.weight.grad = proj.bias.grad = None
    f(x).pow(2).sum().backward()
    for a, b in zip(mine, [x.grad, proj.weight.grad, proj.bias.grad], strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_runs_eagers_fused_kernel(causal):
    """Fewer key/value heads than query heads (enable_gqa, as transformers' Llama calls it):
    eager passes them unrepeated to the fused CPU kernel, and so does ember, in inference
    and in training."""
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)

    def gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    with torch.no_grad(), record() as arts:
        got = ember.compile(gqa)(q, k, v)
    torch.testing.assert_close(got, gqa(q, k, v))
    (art,) = arts
    assert FLASH in art.wrapper and "bmm" not in art.wrapper
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ember.compile(gqa)(*mine).pow(2).sum().backward()
    gqa(*ref).pow(2).sum().backward()
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
