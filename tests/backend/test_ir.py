"""The loop IR on its own: printer, verifier, reference interpreter, and codegen against it."""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.aot.program import trace_inference
from ember.backend import compile_aten
from ember.backend.ir import interpreter, printer, verifier
from ember.backend.ir import nodes as ir
from ember.backend.lowering.graph import lower
from ember.backend.scheduler.dependencies import eliminate_dead
from ember.backend.scheduler.fusion import schedule


def aten_graph(fn, *inputs) -> torch.fx.GraphModule:
    return trace_inference(torch.fx.symbolic_trace(fn), list(inputs)).gm


def softmax_ln(x, w):
    return torch.softmax(x * 2, -1), torch.nn.functional.layer_norm(x, (8,), w).t()


def test_printer_shows_fused_structure():
    x, w = torch.randn(4, 8), torch.randn(8)
    g = verifier.verify(lower(aten_graph(softmax_ln, x, w), [x, w]))
    text = printer.graph_str(g)
    assert "max[4]x[8] float32 [x0] <- mul(in0[r0 + 8*x0], 2.0:float32)" in text
    assert "exp_shifted(sub(" in text
    assert text.splitlines()[-1].startswith("return buf")


@pytest.mark.parametrize(
    "fn",
    [
        softmax_ln,
        lambda x, w: (x.view(2, 16).t().reshape(4, 8) + w, x.sum(0), x.amax(1, keepdim=True)),
        lambda x, w: (torch.where(x > 0, x, w) @ x.t(), (x > w).sum(-1)),
        lambda x, w: (torch.cat([x.t(), w.view(2, 4).exp()], 0) * 2,),  # masked loads
    ],
)
def test_interpreter_matches_eager(fn):
    x, w = torch.randn(4, 8), torch.randn(8)
    gm = aten_graph(fn, x, w)
    g = verifier.verify(lower(gm, [x, w]))
    got = interpreter.run(g, [x, w])
    for a, b in zip(got, gm(x, w)):
        torch.testing.assert_close(a, b)


def test_verifier_rejects_broken_graphs():
    x, w = torch.randn(4, 8), torch.randn(8)
    g = lower(aten_graph(softmax_ln, x, w), [x, w])
    node = next(n for n in g.nodes if isinstance(n, ir.Reduction))
    bad_load = dataclasses.replace(node, body=ir.Load("nowhere", sympy.Integer(0), ir.DType.F32))
    with pytest.raises(verifier.IRError, match="undefined buffer"):
        verifier.verify(dataclasses.replace(g, nodes=(bad_load,) + g.nodes[1:]))
    y9 = sympy.Symbol("y9", integer=True)
    bad_var = dataclasses.replace(node, index=y9)
    with pytest.raises(verifier.IRError, match="store index"):
        verifier.verify(dataclasses.replace(g, nodes=(bad_var,) + g.nodes[1:]))
    with pytest.raises(verifier.IRError, match="written twice"):
        verifier.verify(dataclasses.replace(g, nodes=(node,) + g.nodes))


def test_dead_reductions_are_removed():
    x, w = torch.randn(4, 8), torch.randn(8)
    # native_layer_norm also yields mean and rstd; nothing reads them here
    g = eliminate_dead(
        lower(aten_graph(lambda x, w: torch.nn.functional.layer_norm(x, (8,), w), x, w), [x, w])
    )
    s = schedule(g)
    assert len(s.kernels()) == 1 and len(g.nodes) == 3


OPS = {
    "exp": torch.exp,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "square": lambda t: t * t,
}


@settings(max_examples=6, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 40),
    op=st.sampled_from(sorted(OPS)),
    reduce_dim=st.sampled_from([0, 1]),
)
def test_generated_code_matches_interpreter(rows, cols, op, reduce_dim):
    def fn(x):
        y = OPS[op](x) - 1
        return y, y.sum(reduce_dim), y.amax(reduce_dim, keepdim=True)

    x = torch.randn(rows, cols)
    gm = aten_graph(fn, x)
    oracle = interpreter.run(verifier.verify(lower(gm, [x])), [x])
    got = compile_aten(gm, [x])(x)
    for a, b in zip(got, oracle):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_schedule_and_kernels_log_channels():
    import logging

    from ember import logs

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.text: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.text.append(f"{record.name}: {record.getMessage()}")

    def fn(x):
        return torch.softmax(x - 3, -1)

    x = torch.randn(3, 5)
    keep = Keep()
    loggers = [logs.get("schedule"), logs.get("kernels")]
    for lg in loggers:
        lg.addHandler(keep)
        lg.setLevel(logging.DEBUG)
    try:
        compile_aten(aten_graph(fn, x), [x])
    finally:
        for lg in loggers:
            lg.removeHandler(keep)
            lg.setLevel(logging.WARNING)
    text = "\n".join(keep.text)
    assert "ember.schedule: " in text and "kernel0 outer=[3]" in text
    assert "ember.kernels: " in text and 'extern "C" void kernel0' in text


def test_graph_off_the_cpu_runs_as_its_aten_ops():
    """ember's kernels are CPU code: a graph with a tensor or device argument elsewhere (meta
    stands in for cuda here) is not lowered, and runs as its own aten ops on that device."""
    from ember.backend.compile import stats

    def fn(x):
        return torch.softmax(x - 3, -1)

    def with_device(x):
        return x + torch.ones(5, device="meta")

    x = torch.randn(3, 5)
    gm, gm2 = aten_graph(fn, x), torch.fx.symbolic_trace(with_device)
    before = stats["off_cpu_graphs"]
    run = compile_aten(gm, [x.to("meta")])
    assert run == gm.forward and run(x.to("meta"))[0].device.type == "meta"
    assert compile_aten(gm2, [x]) == gm2.forward
    assert stats["off_cpu_graphs"] == before + 2
    torch.testing.assert_close(compile_aten(gm, [x])(x)[0], fn(x))
    assert stats["off_cpu_graphs"] == before + 2
