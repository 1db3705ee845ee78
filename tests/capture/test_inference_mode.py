"""Compiled code called under `torch.inference_mode()`, against eager.

Inference tensors have no version counter, which the capture reads to find in-place
writes: ember.compile used to raise "Inference tensors do not track version counter" at
the first op. The capture now runs outside inference mode (with the caller's grad mode),
the compiled code inside it, and `torch.is_inference_mode_enabled()` in traced code is
the caller's mode, guarded."""

from __future__ import annotations

import torch
from torch import nn

import ember
from ember.testing import CountingBackend


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def test_module_under_inference_mode_matches_eager():
    model, x = _net(), torch.randn(3, 8)
    counter = CountingBackend("ember")
    compiled = ember.compile(model, backend=counter)
    with torch.inference_mode():
        want = model(x)
        got, again = compiled(x), compiled(x)
    for out in (got, again):
        torch.testing.assert_close(out, want)
        assert out.is_inference()
    assert counter.frame_count == 1
    assert ember.stats()["eager_frames"] == 0 and ember.stats()["graph_breaks"] == 0


def test_in_place_writes_to_inference_tensors():
    def f(x, y):
        x.add_(1)
        y.mul_(x)
        return x.sum() + y.sum()

    with torch.inference_mode():
        a, b = torch.randn(5), torch.randn(5)
        a2, b2 = a.clone(), b.clone()
        want = f(a, b)
        got = ember.compile(f, backend=CountingBackend("ember"))(a2, b2)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(a2, a)
    torch.testing.assert_close(b2, b)


def test_branch_on_inference_mode_is_guarded():
    def f(x):
        if torch.is_inference_mode_enabled():
            return x + 1
        return x - 1

    counter = CountingBackend("ember")
    compiled = ember.compile(f, backend=counter)
    x = torch.randn(4)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), x + 1)
    with torch.no_grad():  # grad mode as under inference mode: only the new guard differs
        torch.testing.assert_close(compiled(x), x - 1)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), x + 1)
    assert counter.frame_count == 2


def test_grad_enabled_inside_inference_mode_is_kept():
    # enable_grad inside inference_mode: grad mode is on, yet nothing records autograd
    model, x = _net(), torch.randn(3, 8)
    compiled = ember.compile(model, backend=CountingBackend("ember"))
    with torch.inference_mode(), torch.enable_grad():
        want = model(x)
        got = compiled(x)
    torch.testing.assert_close(got, want)
    assert got.is_inference() and not got.requires_grad


def test_is_inference_is_asked_of_the_real_tensor():
    # was a wrong answer: is_inference was read from the trace's example tensor
    def f(x):
        with torch.inference_mode():
            y = x * 2
        v = x[1:]
        return y + 1, y.is_inference(), x.is_inference(), v.is_inference()

    x = torch.randn(3)
    with torch.inference_mode():
        x_inf = torch.randn(3)
    compiled = ember.compile(f, backend=CountingBackend("ember"))
    for arg in (x, x_inf, x):
        want, got = f(arg), compiled(arg)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
