"""Training path of ember's aot: gradients, optimizer steps and buffers against eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ember.aot import aot_eager

DTYPES = [torch.float32, torch.float64]


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {}


def _compile(module, inputs, via):
    if via == "fx":
        return aot_eager(fx.symbolic_trace(module), inputs)
    return torch.compile(module, backend=aot_eager, dynamic=False)


def check_module(factory, make_inputs, dtype, *, via="fx", steps=2, loss=None):
    """Two SGD steps eager vs compiled: outputs, input and parameter grads, params, buffers."""
    torch.manual_seed(0)
    ref = factory().to(dtype)
    mod = copy.deepcopy(ref)
    inputs = make_inputs(dtype)
    compiled = _compile(mod, [i.detach().clone() for i in inputs], via)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_mod = torch.optim.SGD(mod.parameters(), lr=0.1, momentum=0.9)
    loss = loss or (lambda out: (out.float() ** 2).mean())
    for _ in range(steps):
        in_ref = [i.detach().clone().requires_grad_(i.requires_grad) for i in inputs]
        in_mod = [i.detach().clone().requires_grad_(i.requires_grad) for i in inputs]
        out_ref, out_mod = ref(*in_ref), compiled(*in_mod)
        torch.testing.assert_close(out_mod, out_ref, **_tol(dtype))
        loss(out_ref).backward()
        loss(out_mod).backward()
        for a, b in zip(in_ref, in_mod, strict=True):
            if a.requires_grad:
                torch.testing.assert_close(b.grad, a.grad, **_tol(dtype))
        for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, **_tol(dtype), msg=name)
        opt_ref.step()
        opt_mod.step()
        opt_ref.zero_grad()
        opt_mod.zero_grad()
    for (name, p), q in zip(ref.named_parameters(), mod.parameters(), strict=True):
        torch.testing.assert_close(q, p, **_tol(dtype), msg=name)
    for (name, b), c in zip(ref.named_buffers(), mod.buffers(), strict=True):
        torch.testing.assert_close(c, b, **_tol(dtype), msg=name)


def _randn(*shape, grad=False):
    return lambda dtype: [torch.randn(*shape, dtype=dtype, requires_grad=grad)]


class MLP(nn.Module):
    def __init__(self, d=16, h=64):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return x + self.proj(y)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x)))).flatten(1)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.norm = nn.Embedding(20, 8), nn.LayerNorm(8)
        self.head = nn.Linear(8, 20)

    def forward(self, idx):
        return F.cross_entropy(self.head(self.norm(self.emb(idx))).flatten(0, 1), idx.flatten())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("via", ["fx", "dynamo"])
def test_mlp(dtype, via):
    check_module(MLP, _randn(8, 16, grad=True), dtype, via=via)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_block(dtype):
    check_module(Attention, _randn(2, 6, 16, grad=True), dtype, via="dynamo")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("via", ["fx", "dynamo"])
def test_conv_batchnorm_train_updates_running_stats(dtype, via):
    check_module(ConvBN, _randn(4, 3, 6, 6, grad=True), dtype, via=via, steps=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_cross_entropy(dtype):
    def inputs(dtype):
        return [torch.randint(0, 20, (3, 5))]

    check_module(Embed, inputs, dtype, loss=lambda out: out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transformer_encoder_layer_dynamo(dtype):
    def factory():
        return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    check_module(factory, _randn(2, 5, 16, grad=True), dtype, via="dynamo")


class OpFamilies(nn.Module):
    """Pointwise, reductions, views, indexing, matmuls, in-place on intermediates."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6) * 0.3)

    def forward(self, x):
        a = torch.sigmoid(x) * torch.tanh(x) + x.exp().clamp(max=3.0) - x.abs().sqrt()
        b = torch.where(x > 0, x.pow(2), torch.sin(x)).relu_()
        c = torch.cat([a, b], dim=0).reshape(-1, 6) @ self.w
        d = torch.bmm(c.view(2, -1, 6), self.w.expand(2, 6, 6)).transpose(1, 2)
        e = d.logsumexp(-1).sum() + d.var(dim=1).mean() + d.amax(dim=(0, 2)).sum()
        f = torch.gather(c, 1, torch.zeros(8, 2, dtype=torch.long)).sum()
        g = torch.einsum("ij,jk->ik", x, self.w).log_softmax(-1)[:, 1::2].mean()
        h = c.index_select(0, torch.arange(0, 8, 2)).norm()
        return e + f + g + h + F.mse_loss(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_op_families(dtype):
    check_module(OpFamilies, _randn(4, 6, grad=True), dtype, loss=lambda out: out)


class WithBreak(nn.Module):
    """A graph break splits the step into two compiled regions, each its own autograd node."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h).sigmoid()


def test_graph_break_regions_backward_across_break():
    counter = {"n": 0}

    def counting(gm, inputs):
        counter["n"] += 1
        return aot_eager(gm, inputs)

    torch.manual_seed(0)
    ref = WithBreak().double()
    mod = copy.deepcopy(ref)
    compiled = torch.compile(mod, backend=counting, dynamic=False)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref(x).sum().backward()
    compiled(x2).sum().backward()
    assert counter["n"] == 2
    torch.testing.assert_close(x2.grad, x.grad)
    for p, q in zip(ref.parameters(), mod.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)
