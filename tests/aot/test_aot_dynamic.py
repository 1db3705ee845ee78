"""ember's aot stage on graphs with symbolic sizes (Dynamo's dynamic=True).

The trace runs on meta tensors with the ShapeEnv's SymInts: one functional graph, with size
placeholders, serves every size. Checked against eager over many sizes with PyTorch's
kernels running the graphs (aot_eager) and with a recording compile_aten: the backward of a
variable batch, and sizes saved for the backward (passed as ints beside the tensors).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.aot import aot_compile, aot_eager, eager_compile_aten

SIZES = [2, 3, 7, 17, 33, 64]


class Recording:
    """compile_aten that records each graph and its example inputs, then runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[tuple[torch.fx.GraphModule, list]] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return eager_compile_aten(gm, example_inputs)


def _dynamo(fn, compile_aten):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_compile(gm, example_inputs, compile_aten)

    return torch.compile(fn, backend=backend, dynamic=True), graphs


def test_inference_one_trace_for_every_size():
    fn = lambda x, y: torch.softmax(x @ y, -1).view(x.shape[0], -1, 2).sum(1)  # noqa: E731
    rec = Recording()
    compiled, graphs = _dynamo(fn, rec)
    for n in SIZES:
        x, y = torch.randn(n, 8), torch.randn(8, 6)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert len(graphs) == 1 and len(rec.graphs) == 1
    gm, examples = rec.graphs[0]
    kinds = [type(v).__name__ for v in examples]
    assert "SymInt" in kinds  # the size inputs reach the backend as SymInts
    code = gm.code
    assert "sym_size" in code or "primals_1" in code


def test_backward_of_a_variable_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    compiled, graphs = _dynamo(model, eager_compile_aten)
    for n in SIZES:
        x = torch.randn(n, 8)
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
        out.square().sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad)
        model.zero_grad()
    assert len(graphs) == 1


def test_sizes_saved_for_the_backward():
    """sum(0)'s backward expands the gradient to the input's shape, whose batch size only
    the input knows: the forward hands that size to the backward instead of the input."""
    rec = Recording()
    compiled, _ = _dynamo(lambda x: (x * 3).sum(0), rec)
    for n in SIZES:
        x = torch.randn(n, 5, requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((n, 5), 3.0))
    forward, backward = (gm for gm, _ in rec.graphs)
    saved_ints = [
        n
        for n in backward.graph.find_nodes(op="placeholder")
        if isinstance(n.meta["val"], torch.SymInt)
    ]
    assert saved_ints, backward.code
    backward_tensors = [
        n
        for n in backward.graph.find_nodes(op="placeholder")
        if isinstance(n.meta["val"], torch.Tensor) and n.meta["val"].dim() == 2
    ]
    assert not backward_tensors  # x itself is not saved


@pytest.mark.parametrize("n", [3, 17])
def test_no_specialization_of_the_traced_sizes(n):
    """Tracing adds no guard that pins a size: a later size does not recompile. (Widths
    differ from the batch sizes: Dynamo's duck sizing would tie equal sizes together.)"""
    compiled, graphs = _dynamo(lambda x: torch.cat([x, x * 2]).relu(), eager_compile_aten)
    for m in (n, n + 1, 2 * n + 5):
        x = torch.randn(m, 5, requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(x.grad, (x > 0) * 3.0)
    assert len(graphs) == 1


def test_aot_eager_backend_with_automatic_dynamic():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    fn = lambda x: x.exp().mean(-1)  # noqa: E731
    compiled = torch.compile(fn, backend=backend)
    for n in SIZES:
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(graphs) == 2  # static, then symbolic


def _scaled(x):
    return x * x.shape[1] ** -0.5  # a float of a symbolic size when dim 1 is dynamic


def test_symbolic_float_runs_uncompiled_with_a_reason():
    from ember import config

    compiled, graphs = _dynamo(_scaled, eager_compile_aten)
    with pytest.raises(Exception, match="symbolic float"):  # EMBER_STRICT=1 (the suite's)
        compiled(torch.randn(3, 4))
    torch._dynamo.reset()
    with config.patch(strict=False):
        compiled, graphs = _dynamo(_scaled, eager_compile_aten)
        for n in (3, 5, 9):
            x = torch.randn(n, n + 1)
            torch.testing.assert_close(compiled(x), _scaled(x))
    assert len(graphs) == 1
