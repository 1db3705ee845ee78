"""torch.autocast, against eager: `with torch.autocast(...)` blocks in traced code and
compiled code called under the caller's autocast.

Before, every op under autocast was a graph break (meta tensors ignore autocast's dtype
policy, so the trace would have been float32 where the run is bfloat16): 0 graphs where
Dynamo makes one. Now autocast's casts become explicit `.to(dtype)` nodes of the graph
(capture/autocast.py); the results must have eager's dtypes and values. The "eager" backend
runs the same ops as eager autocast does, so its results must match to float tolerance;
ember's own kernels may fuse a bfloat16 rounding away (as Inductor's do), so they are
compared at bfloat16's precision."""

from __future__ import annotations

import torch
from torch import nn

import ember
from ember.testing import CountingBackend, assert_same
from tests.capture.fidelity_harness import check, tensors

BF16 = {"rtol": 2e-2, "atol": 5e-2}  # a few units in bfloat16's last place


def _block(x, w, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, w, b)  # lower precision: bfloat16
        p = torch.softmax(y, -1)
        z = torch.cat([y, x])  # promote: y cast to float32
        lsm = torch.log_softmax(x @ w.t(), -1)
    return p, z, lsm, y.dtype, (y.float() * 2).sum()


def test_autocast_block_matches_eager_and_dynamo():
    counts = check(_block, tensors((4, 16), (16, 16), (16,)))
    assert counts.graphs == 1 and counts.breaks == 0


def test_autocast_block_records_casts_in_the_graph():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x, w, b = tensors((4, 16), (16, 16), (16,))()
    ember.compile(_block, backend=backend)(x, w, b)
    (gm,) = graphs
    casts = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert {n.args[1] for n in casts} == {torch.bfloat16, torch.float32}, gm.code


def test_autocast_block_with_ember_backend():
    make = tensors((4, 16), (16, 16), (16,))
    want = _block(*make())
    counter = CountingBackend("ember")
    got = ember.compile(_block, backend=counter)(*make())
    assert_same(got, want, **BF16)
    assert counter.frame_count == 1


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def test_module_called_under_callers_autocast():
    model, x = _net(), torch.randn(3, 8)
    counter = CountingBackend("ember")
    compiled = ember.compile(model, backend=counter)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        got, again = compiled(x), compiled(x)
    assert want.dtype == torch.bfloat16
    assert_same(got, want, **BF16)
    assert_same(again, want, **BF16)
    assert counter.frame_count == 1
    assert ember.stats()["graph_breaks"] == 0 and ember.stats()["eager_frames"] == 0


def test_callers_autocast_state_is_guarded():
    """The same compiled function outside autocast, under bfloat16 and under float16: each a
    graph of its own with eager's dtypes, none reused for another state."""
    model, x = _net(), torch.randn(3, 8)
    counter = CountingBackend("eager")
    compiled = ember.compile(model, backend=counter)
    states = [None, torch.bfloat16, torch.float16, None, torch.bfloat16]
    for dtype in states:
        if dtype is None:
            got, want = compiled(x), model(x)
        else:
            with torch.autocast("cpu", dtype=dtype):
                got, want = compiled(x), model(x)
        assert got.dtype == want.dtype, dtype
        assert_same(got, want)
    assert counter.frame_count == 3


def test_block_disabling_the_callers_autocast():
    def f(x, w):
        y = x @ w
        with torch.autocast("cpu", enabled=False):
            z = x @ w
        return y, z

    x, w = tensors((4, 8), (8, 8))()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = f(x, w)
        got = ember.compile(f, backend=CountingBackend("eager"))(x, w)
    assert [t.dtype for t in want] == [torch.bfloat16, torch.float32]
    assert_same(got, want)


def test_nested_autocast_blocks():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
            with torch.autocast("cpu", dtype=torch.float16):
                b = x @ w
            with torch.autocast("cpu", enabled=False):
                c = x @ w
            d = x @ w
        return a, b, c, d, x @ w

    counts = check(f, tensors((4, 8), (8, 8)))
    assert counts.graphs == 1 and counts.breaks == 0


def test_break_inside_autocast_block():
    """At a break inside the block, break code enters autocast for real after the graph;
    the resume function captures the rest of the block under it and leaves it after its
    graph: two graphs and one break, as Dynamo."""

    def f(x, w):
        y = x.sin()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = x @ w
            print("inside")
            b = a @ w
        return y, a, b, (x @ w).dtype

    counts = check(f, tensors((4, 8), (8, 8)))
    assert (counts.graphs, counts.breaks) == (2, 1)
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_state_setters_break():
    """Setting autocast's state by hand is not modelled: a break, and the call runs in
    Python, so the ops after it see the state it set."""

    def f(x, w):
        torch.set_autocast_enabled("cpu", True)
        try:
            y = x @ w
        finally:
            torch.set_autocast_enabled("cpu", False)
        return y, x @ w

    x, w = tensors((4, 8), (8, 8))()
    want = f(x, w)
    got = ember.compile(f, backend=CountingBackend("eager"))(x, w)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    assert_same(got, want)
    assert not torch.is_autocast_enabled("cpu")
    assert "changes autocast's state" in " ".join(ember.stats()["break_reasons"])


def test_autocast_decorated_forward():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        @torch.autocast("cpu", dtype=torch.bfloat16)
        def forward(self, x):
            return self.lin(x).relu()

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 8)
    counter = CountingBackend("eager")
    got, want = ember.compile(model, backend=counter)(x), model(x)
    assert want.dtype == torch.bfloat16
    assert_same(got, want)
    assert counter.frame_count == 1


def test_training_step_under_autocast():
    """Gradients of a step taken under autocast (the casts are differentiable ops of the
    graph, so aot's backward casts the gradients back as eager's does)."""
    model, x = _net(), torch.randn(6, 8)
    target = torch.randn(6, 4)
    reference = _net()
    compiled = ember.compile(model)
    for run in (reference, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(run(x).float(), target)
        loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad.dtype == q.grad.dtype == torch.float32, name
        torch.testing.assert_close(p.grad, q.grad, **BF16, msg=name)
