"""Memory behaviour of compiled training steps: what the backward's generated code keeps
alive, and buffer reuse that must not raise a graph's peak."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

backend = pytest.importorskip("ember.backend")
from ember.backend.compile import record  # noqa: E402
from ember.backend.scheduler import memory  # noqa: E402


class Block(nn.Module):
    """Pre-norm attention + MLP block: layer norm backward (a tuple-returning fallback),
    softmax, GELU, residuals: many buffers for the planner to reuse and free."""

    def __init__(self, d: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _boxed_body(wrapper: str) -> list[str]:
    return wrapper.split("def call_boxed(args):\n", 1)[1].splitlines()


def _names_outliving_last_use(body: list[str]) -> list[str]:
    """Locals (buffers, inputs, result tuples) whose last mention is not a `del` or the
    return: such a name keeps its storage alive to the end of the call."""
    last: dict[str, int] = {}
    for i, line in enumerate(body):
        for name in re.findall(r"\b(?:buf\d+|in\d+|_r)\b", line):
            last[name] = i
    bad = []
    for name, i in last.items():
        line = body[i].strip()
        if line.startswith("return") or (line.startswith("del ") and name in line):
            continue
        if i == 0 and name.startswith("in"):
            continue  # an input the graph never reads (unpacked only)
        bad.append(f"{name}: {line}")
    return bad


@pytest.mark.parametrize("factory,shape", [(Block, (2, 16, 32))], ids=["block"])
def test_backward_wrapper_frees_every_buffer_after_its_last_use(factory, shape):
    torch.manual_seed(0)
    ref = factory()
    mod = copy.deepcopy(ref)
    compiled = torch.compile(mod, backend=backend, dynamic=False)
    x = torch.randn(shape)
    with record() as arts:
        compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(mod.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    assert len(arts) == 2  # forward and backward
    for art in arts:
        body = _boxed_body(art.wrapper)
        assert _names_outliving_last_use(body) == [], art.wrapper
    reuses = [line for art in arts for line in _boxed_body(art.wrapper) if "# reuses" in line]
    for art in arts:
        body = _boxed_body(art.wrapper)
        for i, line in enumerate(body):
            if "# reuses the storage of" in line:
                donor = line.split("=")[1].split("#")[0].strip()
                assert body[i + 1].strip() == f"del {donor}"
    assert reuses, "expected some buffer reuse in a block's graphs"


def test_reuse_is_refused_when_holding_the_donor_would_raise_the_peak():
    # step 0 frees a 4-byte donor; step 1 allocates the peak; step 2 could take the donor
    live = [4, 10, 6]  # bytes held while each step runs, with no reuse
    held = [0, 0, 0]
    donors = [("buf0", 0)]
    assert memory._take(donors, 2, live, held, peak=10, size=4) is None
    assert donors == [("buf0", 0)]
    # with room under the peak at step 1 the donor is kept and the step is charged
    live = [4, 6, 6]
    assert memory._take(donors, 2, live, held, peak=10, size=4) == "buf0"
    assert held == [0, 4, 0] and donors == []


def _wide_mlp():
    # weights (4 MiB each) dominate the activations: the step's peak is the last
    # weight-gradient GEMM, where one backward node would still hold the output gradient
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))


@pytest.fixture
def always_split(monkeypatch):
    """Split every backward that can be split, whatever the memory estimate says."""
    from ember.aot import schedule

    monkeypatch.setattr(schedule, "MIN_SPLIT_GAIN", -(1 << 60))


def test_backward_split_in_two_nodes_when_the_tangent_would_raise_the_peak():
    import torch.fx as fx

    from ember.aot.joint import trace_joint
    from ember.aot.partition import partition

    x = torch.randn(128, 512)
    joint = trace_joint(fx.symbolic_trace(_wide_mlp()), [x])
    parts = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs)
    split = parts.split
    assert split is not None and split.peak < split.unsplit_peak
    tangents = {n.name for n in joint.gm.graph.nodes if n.name.startswith("tangents")}
    second_inputs = {n.name for n in split.second.graph.find_nodes(op="placeholder")}
    assert not tangents & second_inputs  # the second stage never sees the tangent
    one = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs, split_stages=False)
    assert one.split is None


@pytest.mark.parametrize("via", ["aot_eager", "ember"])
def test_split_backward_gradients_retain_graph_and_double_backward(via, always_split, caplog):
    import logging

    from ember.aot import aot_eager

    caplog.set_level(logging.DEBUG, logger="ember.aot")

    torch.manual_seed(0)
    ref = _wide_mlp()
    mod = copy.deepcopy(ref)
    compiled = torch.compile(
        mod, backend=aot_eager if via == "aot_eager" else backend, dynamic=False
    )
    x = torch.randn(128, 512)
    xr, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_r, out_m = ref(xr), compiled(xm)
    assert "backward in two autograd nodes" in caplog.text
    torch.testing.assert_close(out_m, out_r, atol=1e-5, rtol=1e-4)
    for _ in range(2):  # retain_graph: both stages keep their saved values
        out_r.square().mean().backward(retain_graph=True)
        out_m.square().mean().backward(retain_graph=True)
    tol = {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(xm.grad, xr.grad, **tol)
    for p, q in zip(mod.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **tol)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(compiled(xm).sum(), xm, create_graph=True)
    # an output whose gradient is None (unused) still gets the first stage's zeros
    mod.zero_grad()
    ref.zero_grad()
    (compiled(xm) * 0).sum().backward()
    for p in mod.parameters():
        assert p.grad is not None and not p.grad.any()
