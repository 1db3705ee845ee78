"""The generated wrapper's buffers come from one allocator call, `_new(size, stride,
dtype)` (torch_compat.empty_strided_cpu on the CPU): whatever the dtype, rank or layout,
the results are eager's."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.backend.compile import record


def _many_buffers(x: torch.Tensor, y: torch.Tensor):
    m = x.amax(dim=1)  # a reduction: a buffer of its own
    idx = x.argmax(dim=1)  # int64
    pos = (x > 0).sum()  # a 0-d int64
    z = (x.t() * 2).contiguous(memory_format=torch.contiguous_format)
    return x.softmax(1) + y, m, idx, pos, z, (x > 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_wrapper_buffers_of_every_kind(dtype):
    torch.manual_seed(0)
    x, y = torch.randn(6, 5, dtype=dtype), torch.randn(6, 5, dtype=dtype)
    want = _many_buffers(x, y)
    with record() as arts:
        got = ember.compile(_many_buffers)(x, y)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
        assert g.dtype == w.dtype and g.shape == w.shape
    source = "\n".join(a.wrapper for a in arts)
    assert "_new(" in source and "torch.empty" not in source, source


def test_channels_last_buffers_through_training():
    """A channels-last activation and a training step's buffers: values and gradients."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 7, 7).contiguous(memory_format=torch.channels_last)

    def f(x):
        return torch.relu(conv(x)).square().mean()

    want = f(x)
    want.backward()
    grads = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    got = ember.compile(f)(x)
    got.backward()
    torch.testing.assert_close(got, want)
    for p, g in zip(conv.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g)
