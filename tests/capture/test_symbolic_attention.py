"""The capture's shape rule for `F.scaled_dot_product_attention` on symbolic sizes
(ember/aot/symbolic_meta.py `attention`): the layout torch's meta kernel gives, on many
shapes; the graphs captured with the rule node for node those captured without it; every
output eager's, over many sizes."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot import symbolic_meta
from ember.testing import CountingBackend, assert_same
from tests.capture.test_dynamic_capture import _capture_layouts


def _m(*size, dtype=torch.float32, t=False):
    x = torch.empty(*size, dtype=dtype, device="meta")
    return x.transpose(-3, -2) if t else x


def _cases():
    """(args, kwargs, whether the rule must answer): sizes 1 and primes, transposed
    operands (GPT-2's q/k/v are (B, L, H, E) transposed), ranks 3-5, masks of each rank and
    dtype, and arguments the rule leaves to the meta kernel (broadcast batches, a mask that
    widens the result, dropout, grouped heads, mixed dtypes, a mask with is_causal)."""
    for (b, h, lq, s, e, ev), t in itertools.product(
        [(2, 3, 5, 7, 8, 6), (1, 1, 1, 1, 1, 1), (3, 2, 1, 13, 4, 4), (2, 4, 17, 17, 16, 16)],
        [False, True],
    ):
        q, k, v = _m(b, lq, h, e, t=t), _m(b, s, h, e, t=t), _m(b, s, h, ev, t=t)
        if not t:
            q, k, v = _m(b, h, lq, e), _m(b, h, s, e), _m(b, h, s, ev)
        yield (q, k, v), {}, True
        yield (q, k, v), {"is_causal": True, "scale": 0.3}, True
        for mask in (_m(lq, s), _m(b, 1, lq, s), _m(1, h, 1, s), _m(b, h, lq, s)):
            yield (q, k, v), {"attn_mask": mask}, True
            yield (q, k, v, mask.bool()), {}, True
        yield (q, k, v), {"attn_mask": _m(b, 1, 9, s)}, False  # widens the result (or raises)
        yield (q, k, v), {"dropout_p": 0.5}, False
        yield (q, k, v), {"attn_mask": _m(lq, s), "is_causal": True}, False
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        qkv = (_m(2, 3, 5, 8, dtype=dtype),) * 3
        yield qkv, {}, True
        yield qkv, {"attn_mask": _m(5, 5, dtype=dtype)}, True
        yield qkv, {"attn_mask": _m(5, 5)}, False  # float32 mask for another dtype: torch raises
    yield (_m(3, 5, 8), _m(3, 7, 8), _m(3, 7, 2)), {}, True
    yield (_m(2, 2, 3, 5, 8), _m(2, 2, 3, 7, 8), _m(2, 2, 3, 7, 2)), {}, True
    yield (_m(2, 3, 5, 8), _m(1, 3, 7, 8), _m(1, 3, 7, 8)), {}, False  # broadcast batch
    yield (_m(2, 4, 5, 8), _m(2, 2, 7, 8), _m(2, 2, 7, 8)), {"enable_gqa": True}, False
    yield (_m(2, 3, 5, 8), _m(2, 3, 7, 8, dtype=torch.float64), _m(2, 3, 7, 8)), {}, False
    yield (_m(5, 8), _m(7, 8), _m(7, 8)), {}, False  # unbatched
    yield (_m(2, 3, 5, 8, dtype=torch.int64),) * 3, {}, False


def test_attention_rule_gives_the_meta_kernels_layout():
    answered = 0
    for args, kwargs, expected in _cases():
        got = symbolic_meta.attention(args, kwargs)
        assert (got is not None) == expected, (args, kwargs)
        if got is None:
            continue
        want = F.scaled_dot_product_attention(*args, **kwargs)
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
        assert got.storage_offset() == 0 and not got._is_view()
        answered += 1
    assert answered > 80


def _attentions(x, bias, keep):
    """GPT-2's shapes: q/k/v split from one projection and transposed; a causal call, a
    float mask and a broadcast bool mask, a scale, and a value narrower than the keys."""
    b, t, _ = x.shape
    q, k, v = (z.view(b, t, 2, 4).transpose(1, 2) for z in x.split(8, dim=2))
    return [
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:t, :t]),
        F.scaled_dot_product_attention(q, k, v[..., :3], attn_mask=keep[:, None, None, :t]),
        F.scaled_dot_product_attention(q * 2, k, v, scale=0.25) + 1,
    ]


@pytest.mark.parametrize("grad", [False, True])
def test_captured_attention_graphs_are_the_meta_kernels(monkeypatch, grad):
    """With and without the rule (and with grad, where the rule stays out: the meta
    kernel's result has autograd history): the same graphs, node for node; each call's
    outputs eager's over sizes 0, 1, primes and others."""
    torch.manual_seed(0)
    bias = torch.randn(40, 40)
    traced = {}
    for enabled in (True, False):
        monkeypatch.setattr(symbolic_meta, "ENABLED", enabled)
        symbolic_meta.stats.clear()
        ember.reset()
        counter = CountingBackend("eager")
        compiled = ember.compile(_attentions, backend=counter)
        for t in (2, 3, 0, 1, 5, 7, 13, 17, 33):
            x = torch.randn(2, t, 24, requires_grad=grad)
            keep = torch.rand(2, 40) > 0.3
            keep[:, 0] = True
            with torch.set_grad_enabled(grad):
                assert_same(compiled(x, bias, keep), _attentions(x, bias, keep), atol=1e-5)
        traced[enabled] = [_capture_layouts(gm) for gm in counter.graphs]
        if enabled:
            assert symbolic_meta.stats["attention"] == (0 if grad else 4)
    assert len(traced[True]) <= 4  # static 2, dynamic, then 0 and 1 each a specialization
    assert traced[True] == traced[False]
