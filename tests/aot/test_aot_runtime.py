"""Autograd semantics of the compiled training runtime and the partitioner's choices."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ember.aot import aot_eager
from ember.aot.joint import trace_joint
from ember.aot.partition import partition
from ember.aot.trace import check_functional


def _compile(fn, *inputs):
    return aot_eager(fx.symbolic_trace(fn), list(inputs))


def test_non_differentiable_and_unused_outputs():
    def f(x, w):
        y = x @ w
        return y.argmax(-1), y.sum(-1), (y * 2).relu()

    x, w = torch.randn(4, 5), torch.randn(5, 3, requires_grad=True)
    fn = _compile(f, x, w)
    idx, s, r = fn(x, w)
    assert not idx.requires_grad and idx.dtype == torch.long
    s.sum().backward()  # r gets no gradient: its tangent is None
    w_ref = w.detach().clone().requires_grad_()
    f(x, w_ref)[1].sum().backward()
    torch.testing.assert_close(w.grad, w_ref.grad)
    torch.testing.assert_close(idx, f(x, w_ref)[0])


def test_inputs_without_grad_get_none_and_retain_graph():
    def f(a, b, c):
        return (a * b + c.exp(),)

    a = torch.randn(3, requires_grad=True)
    b, c = torch.randn(3), torch.randn(3, requires_grad=True)
    fn = _compile(f, a, b, c)
    (out,) = fn(a, b, c)
    out.sum().backward(retain_graph=True)
    out.sum().backward()  # saved values survive retain_graph; grads accumulate
    assert b.grad is None
    torch.testing.assert_close(a.grad, 2 * b)
    torch.testing.assert_close(c.grad, 2 * c.exp())
    with pytest.raises(RuntimeError):
        out.sum().backward()  # buffers freed after a backward without retain_graph


def test_double_backward_is_a_clear_error():
    def f(x):
        return (x.sin() ** 2,)

    x = torch.randn(4, requires_grad=True)
    (y,) = _compile(f, x)(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(y.sum(), x)  # first order still works
    torch.testing.assert_close(g, 2 * x.sin() * x.cos())


def test_grad_of_intermediate_input_flows_to_earlier_graph():
    lin = nn.Linear(4, 4)

    def f(h):
        return (torch.tanh(h) * 3,)

    x = torch.randn(2, 4)
    h = lin(x)
    fn = _compile(f, h)
    fn(h)[0].sum().backward()
    ref = nn.Linear(4, 4)
    ref.load_state_dict(lin.state_dict())
    (torch.tanh(ref(x)) * 3).sum().backward()
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)


def test_input_view_output_keeps_autograd_and_aliasing():
    def f(x, w):
        return x.t(), (x * w).sum()

    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    xt, s = _compile(f, x, w)(x, w)
    assert xt._base is x
    (xt.sum() * 2 + s).backward()
    torch.testing.assert_close(x.grad, 2 + w)
    torch.testing.assert_close(w.grad, x.detach())


def test_dropout_mask_same_as_eager_with_same_seed():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return F.gelu(F.dropout(self.lin(x), 0.5, training=True)) * 2

    torch.manual_seed(0)
    ref = M()
    mod = M()
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(16, 8)
    fn = _compile(mod, x)
    for seed in (1, 2):
        torch.manual_seed(seed)
        out_ref = ref(x)
        torch.manual_seed(seed)
        out = fn(x)
        torch.testing.assert_close(out, out_ref)
        out_ref.square().sum().backward()
        out.square().sum().backward()
        torch.testing.assert_close(mod.lin.weight.grad, ref.lin.weight.grad)


class GeluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 128), nn.Linear(128, 32)

    def forward(self, x):
        return (self.fc2(F.gelu(self.fc1(x))),)


def test_partitioner_recomputes_gelu_instead_of_saving(caplog):
    # activations (512 x 128) dominate the weights: saving the GELU output would raise the
    # step's peak (the backward starts with every saved activation alive)
    x = torch.randn(512, 32)
    joint = trace_joint(fx.symbolic_trace(GeluMLP()), [x])
    naive = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs, recompute=False)
    with caplog.at_level(logging.DEBUG, logger="ember.aot"):
        cut = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs)
    assert cut.saved_bytes < naive.saved_bytes == cut.naive_saved_bytes
    act = 512 * 128 * 4
    assert naive.saved_bytes - cut.saved_bytes >= act  # the GELU output is not saved
    bwd_targets = [n.target for n in cut.backward.graph.nodes]
    assert torch.ops.aten.gelu.default in bwd_targets  # recomputed from the saved matmul
    assert f"{cut.saved_bytes} bytes" in caplog.text
    for graph in (cut.forward.graph, cut.backward.graph, joint.gm.graph):
        check_functional(graph)


def test_partitioner_saves_gelu_when_the_peak_is_elsewhere(caplog):
    """Weights dominate (an MLP at small batch): the step's peak is the last weight-gradient
    GEMM, where saved activations are already freed, so recomputing GELU (an erf pass in the
    backward) would buy no memory; it is saved, and the estimated peak does not change."""
    mod = nn.Sequential(nn.Linear(256, 2048), nn.GELU(), nn.Linear(2048, 256))
    x = torch.randn(64, 256)  # activations 512 KiB, weights 2 MiB each
    joint = trace_joint(fx.symbolic_trace(mod), [x])
    with caplog.at_level(logging.DEBUG, logger="ember.aot"):
        cut = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs)
    bwd_targets = [n.target for n in cut.backward.graph.nodes]
    assert torch.ops.aten.gelu.default not in bwd_targets
    assert "saving" in caplog.text and "step peak stays" in caplog.text
    gelu = [n.name for n in joint.gm.graph.nodes if n.target is torch.ops.aten.gelu.default]
    assert gelu[0] in cut.saved
    # and training through it still gives eager's gradients
    ref = copy.deepcopy(mod)
    compiled = torch.compile(mod, backend=aot_eager, dynamic=False)
    xr = torch.randn(64, 256)
    compiled(xr).square().sum().backward()
    ref(xr).square().sum().backward()
    for p, q in zip(mod.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_partitioner_never_recomputes_random_ops():
    def f(x, w):
        return (F.dropout(x @ w, 0.3, training=True).sin(),)

    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    joint = trace_joint(fx.symbolic_trace(f), [x, w])
    cut = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs)
    for node in cut.backward.graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload):
            assert torch.Tag.nondeterministic_seeded not in node.target.tags


def test_non_leaf_input_mutated_under_grad_runs_as_eager():
    """Its history is rebased onto the in-place op: the graph runs uncompiled, so the
    gradient reaching the caller's leaf is eager's (a compiled pair would halve it)."""

    def f(x):
        x.mul_(2)
        return ((x * x).sum(),)

    a = torch.randn(3, requires_grad=True)
    a_ref = a.detach().clone().requires_grad_()
    x = a * 1.5
    (out,) = _compile(f, x)(x)
    (out + x.sum()).backward()
    x_ref = a_ref * 1.5
    (ref,) = f(x_ref)
    (ref + x_ref.sum()).backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(a.grad, a_ref.grad)


def test_views_of_an_intermediate_alias_and_get_gradients():
    def f(x, w):
        h = x @ w
        return h.view(-1), h.t(), h[0]

    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()
    a, b, c = _compile(f, x, w)(x, w)
    ra, rb, rc = f(x, w_ref)
    assert a._base is b._base is c._base and a._base is not None
    assert (a.stride(), b.stride(), c.stride()) == (ra.stride(), rb.stride(), rc.stride())
    (a.sin().sum() + (b * 2).sum() + c.exp().sum()).backward()
    (ra.sin().sum() + (rb * 2).sum() + rc.exp().sum()).backward()
    torch.testing.assert_close(w.grad, w_ref.grad)


def test_scaled_dot_product_attention_training():
    def f(q, k, v):
        return (F.scaled_dot_product_attention(q, k, v, is_causal=True),)

    qkv = [torch.randn(2, 2, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    ref = [t.detach().clone().requires_grad_() for t in qkv]
    (out,) = _compile(f, *qkv)(*qkv)
    (expected,) = f(*ref)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for a, b in zip(qkv, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_backward_order_releases_activation_grads_early():
    """The bias-grad reduction runs before the weight-grad matmul that would otherwise
    allocate while the (same-sized) activation gradient is still alive."""
    x = torch.randn(16, 32)
    joint = trace_joint(fx.symbolic_trace(GeluMLP()), [x])
    cut = partition(joint.gm, joint.num_primals, joint.num_fwd_outputs)
    nodes = list(cut.backward.graph.nodes)
    gb = next(n for n in nodes if n.target is torch.ops.aten.gelu_backward.default)
    reduce = next(n for n in gb.users if n.target is torch.ops.aten.sum.dim_IntList)
    view = next(n for n in gb.users if n.target is torch.ops.aten.t.default)
    (weight_mm,) = list(view.users)
    assert nodes.index(reduce) < nodes.index(weight_mm)


def test_saved_values_reach_backward_with_traced_strides():
    """A backend may lay out the forward's outputs its own way; the backward still gets the
    strides it was compiled for (a stride-baking backend would misread them otherwise)."""
    from ember.aot import aot_compile, eager_compile_aten

    def column_major(t):
        return t.t().contiguous().t() if t.dim() == 2 else t

    def compile_aten(gm, example_inputs):
        runner = eager_compile_aten(gm, example_inputs)
        strides = [t.stride() for t in example_inputs]

        def run(*args):
            assert [a.stride() for a in args] == strides
            return [column_major(o) for o in runner(*args)]

        return run

    mlp = GeluMLP()
    ref = copy.deepcopy(mlp)
    x = torch.randn(16, 32)
    fn = aot_compile(fx.symbolic_trace(mlp), [x], compile_aten)
    fn(x)[0].square().sum().backward()
    ref(x)[0].square().sum().backward()
    for p, q in zip(ref.parameters(), mlp.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad)


def test_outputs_needing_no_grad_with_grad_inputs():
    def f(x, w):
        return (x @ w).argmax(-1), x.t()

    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 2, requires_grad=True)
    idx, xt = _compile(f, x, w)(x, w)
    assert not idx.requires_grad
    torch.testing.assert_close(idx, (x @ w).argmax(-1))
    xt.sum().backward()  # the input view still carries autograd, as in eager
    torch.testing.assert_close(x.grad, torch.ones(3, 4))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_dropout_is_traced_as_the_kernel_eager_runs_on_the_device(device):
    """Eager's torch.dropout draws bernoulli_ on the CPU and runs the fused native_dropout on
    accelerators (a different random stream): a trace for a GPU records the fused op, so a
    seeded compiled program drops what eager drops (checked on a GPU by bench/gpu.py). No
    GPU is needed to trace: the tracer runs on meta stand-ins and only records the device."""
    from ember.aot.trace import Tracer

    tracer = Tracer(torch.device(device))
    x = tracer.to_fake(torch.randn(4, 8))
    tracer.placeholder("x", x)
    with tracer.recording():
        F.dropout(x, 0.5, training=True)
        F.dropout(x, 0.5, training=False)
        F.dropout(x, 1.0, training=True)
    ops = {str(n.target) for n in tracer.graph.nodes if n.op == "call_function"}
    fused = {"aten.native_dropout.default"}
    assert (fused <= ops) == (device == "cuda")
    assert any("bernoulli" in op for op in ops) == (device == "cpu")


def test_cpu_scalar_tensor_beside_tensors_on_another_device():
    """Eager lets a 0-dim CPU tensor take part in ops on any device (x_cuda * torch.tensor(2.)
    is common); the aot stage traces such a graph for the other device instead of refusing
    it. meta stands in for cuda here: the graph runs as its aten ops there."""
    import ember

    half = torch.tensor(0.5)

    def scaled(x):
        return (x * half).sin() + half

    x = torch.randn(4, 3)
    out = ember.compile(scaled)(x.to("meta"))
    assert out.device.type == "meta" and out.shape == (4, 3)
    torch.testing.assert_close(ember.compile(scaled)(x), scaled(x))


def test_graph_on_several_devices_runs_uncompiled_as_eager():
    """A graph whose inputs live on two devices (a copy from one to the other inside it) is
    valid eager code: it runs as the captured torch-level graph, with eager's answer,
    instead of failing (meta stands in for a GPU: the copy is `.to("meta")`)."""
    import ember

    def moves(a, b):
        return a.to("meta") * 2 + b, a.sum()

    a, b = torch.randn(4, 3), torch.randn(4, 3, device="meta")
    got, total = ember.compile(moves)(a, b)
    assert got.device.type == "meta" and got.shape == (4, 3)
    torch.testing.assert_close(total, a.sum())
