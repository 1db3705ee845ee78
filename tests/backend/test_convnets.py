"""Convolution nets against eager: batch norm and pooling lowered, in eval and training.

Each test compiles through `torch.compile(backend=ember.backend)` and compares values,
gradients and the BatchNorm buffers (running statistics, batch counter) after training steps
with eager's, and asserts the normalization and pooling ops are no longer aten fallbacks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.backend.compile import record, stats
from tests.backend.helpers import compile_ember, extern_ops

TOL = {
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
}


class Block(nn.Module):
    """conv-BN-ReLU, conv-BN plus the shortcut, ReLU (a ResNet basic block)."""

    def __init__(self, c: int = 8, affine: bool = True, stats: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c, affine=affine, track_running_stats=stats)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c, affine=affine, track_running_stats=stats)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


def _fallbacks(arts) -> list[str]:
    """Normalization and pooling ops the wrappers still call as aten ops."""
    names = ("batch_norm", "group_norm", "pool", "max_pool")
    return [op for art in arts for op in extern_ops(art) if any(n in op for n in names)]


def _close(got, want, dtype):
    torch.testing.assert_close(got, want, **TOL[dtype])


def _train_steps(model, x, steps: int = 2, dtype=torch.float32):
    """Run `steps` SGD steps on eager and compiled copies; compare losses, gradients,
    parameters and buffers after each; return the compiled artifacts."""
    twin = copy.deepcopy(model)
    compiled = compile_ember(twin)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    before = stats["graph_fallbacks"]
    with record() as arts:
        for _ in range(steps):
            losses = []
            for m, run, opt in ((model, model, opts[0]), (twin, compiled, opts[1])):
                out = run(x)
                loss = out.float().square().mean()
                loss.backward()
                losses.append(out)
                grads = [p.grad for p in m.parameters()]
                opt.step()
                opt.zero_grad()
                m._grads = grads
            _close(losses[1], losses[0], dtype)
            for a, b in zip(model._grads, twin._grads):
                _close(b, a, dtype)
            for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
                assert a.dtype == b.dtype, name
                _close(b, a, dtype)
    assert stats["graph_fallbacks"] == before
    assert not _fallbacks(arts), _fallbacks(arts)
    return arts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_batch_norm_block_training_steps(dtype):
    torch.manual_seed(0)
    model = Block().to(dtype)
    _train_steps(model, torch.randn(4, 8, 10, 10, dtype=dtype), dtype=dtype)


@pytest.mark.parametrize("batch", [1, 3])
def test_batch_norm_channels_last(batch):
    torch.manual_seed(0)
    model = Block().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 8, 6, 7).contiguous(memory_format=torch.channels_last)
    _train_steps(model, x)
    model.eval()
    with torch.no_grad():
        # values only: ember.aot traces convolutions on meta tensors, whose outputs are
        # contiguous where eager's CPU convolution returns channels-last (notes/backend.md)
        _eval_matches(model, x, strides=False)


def test_batch_norm_without_affine_or_running_stats():
    torch.manual_seed(0)
    _train_steps(Block(affine=False), torch.randn(3, 8, 5, 5))
    _train_steps(Block(stats=False), torch.randn(3, 8, 5, 5))


def test_batch_norm_1d_on_features_and_sequences():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 3))
    _train_steps(mlp, torch.randn(5, 6))
    seq = nn.Sequential(nn.Conv1d(4, 6, 3), nn.BatchNorm1d(6), nn.ReLU())
    _train_steps(seq, torch.randn(2, 4, 9))


def _eval_matches(model, x, strides: bool = True):
    want = model(x)
    compiled = compile_ember(model)
    before = stats["graph_fallbacks"]
    with record() as arts:
        got = compiled(x)
    _close(got, want, x.dtype)
    assert got.stride() == want.stride() or not strides
    assert stats["graph_fallbacks"] == before
    assert not _fallbacks(arts), _fallbacks(arts)
    return arts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_batch_norm_eval_is_an_epilogue(dtype):
    """Eval batch norm with running statistics fuses with its ReLU and the residual add:
    after each convolution there is one kernel (plus the tiny per-channel scale/shift)."""
    torch.manual_seed(0)
    model = Block().to(dtype)
    for bn in (model.bn1, model.bn2):  # non-trivial running statistics
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    model.eval()
    with torch.no_grad():
        (art,) = _eval_matches(model, torch.randn(2, 8, 9, 9, dtype=dtype))
    assert "relu" not in art.wrapper and art.cpp.count("__builtin_sqrt") >= 2


def test_batch_norm_eval_mode_gradients():
    """Frozen batch norm (eval mode) in a training step: its eval backward path."""
    torch.manual_seed(0)
    model = Block()
    model.bn1.running_var.uniform_(0.5, 2)
    model.eval()
    _train_steps(model, torch.randn(2, 8, 6, 6))
