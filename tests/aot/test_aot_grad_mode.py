"""Graphs that turn grad mode on inside, called under no_grad: results require grad exactly
when eager's do, through every backend that runs ember's aot stage."""

from __future__ import annotations

import pytest
import torch

import ember


def _set_grad_inside(x):
    torch.set_grad_enabled(True)
    return x * 3


def _enable_grad_block(x):
    with torch.enable_grad():
        y = x.sin()
    return y * 2


@pytest.mark.parametrize("fn", [_set_grad_inside, _enable_grad_block])
@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_grad_enabled_inside_graph_under_no_grad(fn, backend):
    compiled = ember.compile(fn, backend=backend, fullgraph=True)
    x = torch.randn(4, requires_grad=True)
    for arg in (x, x.detach(), x):
        with torch.no_grad():
            expected = fn(arg)
            torch.set_grad_enabled(False)
            result = compiled(arg)
            torch.set_grad_enabled(False)
        torch.testing.assert_close(result, expected)
        assert result.requires_grad == expected.requires_grad
    if expected.requires_grad:
        result.sum().backward()
        grad = x.grad.clone()
        x.grad = None
        expected.sum().backward()
        torch.testing.assert_close(grad, x.grad)
