"""Inference path of ember's aot: functional aten graphs differential against eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

from ember.aot import aot_compile, aot_eager, eager_compile_aten
from ember.aot.program import trace_inference
from ember.aot.trace import TraceError, check_functional


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _check(fn, args):
    """Run eager and aot_eager on copies; compare outputs, strides and mutated inputs."""
    gm = fn if isinstance(fn, fx.GraphModule) else fx.symbolic_trace(fn)
    eager_args = _clone(args)
    ref = gm(*eager_args)
    compiled = aot_eager(gm, _clone(args))
    for _ in range(2):  # the second call exercises the cached runtime
        aot_args = _clone(args)
        out = compiled(*aot_args)
    ref_l = ref if isinstance(ref, tuple) else (ref,)
    out_l = out if isinstance(out, tuple) else (out,)
    assert len(ref_l) == len(out_l)
    for r, o in zip(ref_l, out_l, strict=True):
        torch.testing.assert_close(o, r)
        assert o.stride() == r.stride()
    for a, b in zip(eager_args, aot_args, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(b, a)
    return gm, aot_args, out


def test_graph_is_functional_aten_with_meta():
    def f(x, y):
        a = x + y
        a.mul_(2)
        a[0].add_(1)
        return a.t().sin(), a

    prog = trace_inference(fx.symbolic_trace(f), [torch.randn(3, 3), torch.randn(3, 3)])
    check_functional(prog.gm.graph)
    targets = [n.target for n in prog.gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.add.Tensor in targets
    assert torch.ops.aten.select_scatter.default in targets
    for n in prog.gm.graph.nodes:
        if n.op == "call_function" and n.target.__module__ != "_operator":
            assert isinstance(n.target, torch._ops.OpOverload)
        if n.op != "output":
            assert "val" in n.meta


def test_view_mutation_regenerates_views():
    def f(x, y):
        a = x * y
        v = a[1:]
        w = a.t()
        v.mul_(3)
        a.add_(1)
        return v + 0, w.exp(), a.view(-1) + 0

    _check(f, [torch.randn(4, 3), torch.randn(4, 3)])


def test_input_mutation_copied_back_and_aliasing_output():
    def f(x, y):
        x.add_(y)
        x[0].zero_()
        return x, x.view(-1), x.t(), y * 2

    gm, args, out = _check(f, [torch.randn(3, 3), torch.randn(3, 3)])
    assert out[0] is args[0]
    assert out[1]._base is args[0] and out[2]._base is args[0]


def test_out_variant_and_dtype_of_inplace():
    def f(x, y, buf):
        torch.add(x, y, out=buf)
        z = torch.zeros(3, 4, dtype=torch.float32)
        z.add_(y.double())
        return buf * 2, z

    _check(f, [torch.randn(3, 4), torch.randn(3, 4), torch.empty(3, 4)])


def test_transposed_and_expanded_outputs_keep_strides():
    def f(x):
        return (x.t() * 2), x.sum(0).expand(5, 4) + 1, x.permute(1, 0).contiguous()

    _check(f, [torch.randn(5, 4)])


def test_batchnorm_train_buffers_no_grad():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    m2 = copy.deepcopy(m)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        compiled = aot_eager(fx.symbolic_trace(m2), [x])
        for _ in range(2):
            torch.testing.assert_close(compiled(x), m(x))
    for name, b in m.named_buffers():
        torch.testing.assert_close(dict(m2.named_buffers())[name], b)


def test_torch_compile_front_end():
    def f(x, w):
        y = torch.nn.functional.gelu(x @ w)
        x.mul_(2)
        return y.softmax(-1), x[1:]

    x, w = torch.randn(4, 4), torch.randn(4, 4)
    cf = torch.compile(f, backend=aot_eager, dynamic=False)
    x1, x2 = x.clone(), x.clone()
    ref = f(x1, w)
    out = cf(x2, w)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])
    torch.testing.assert_close(x2, x1)
    assert out[1]._base is x2


def test_int_inputs_are_specialized_per_value():
    class G(torch.nn.Module):
        def forward(self, x, n):
            return (x * n,)

    gm = fx.symbolic_trace(G())
    fn = aot_compile(gm, [torch.ones(2), 3], eager_compile_aten)
    torch.testing.assert_close(fn(torch.ones(2), 3)[0], torch.full((2,), 3.0))
    torch.testing.assert_close(fn(torch.ones(2), 5)[0], torch.full((2,), 5.0))


def test_aliased_inputs_rejected_clearly():
    def f(x, y):
        x.add_(1)
        return (y + 1,)

    base = torch.randn(4)
    with pytest.raises(TraceError, match="shares memory"):
        aot_eager(fx.symbolic_trace(f), [base, base.view(2, 2)])
    fn = aot_eager(fx.symbolic_trace(f), [torch.randn(4), torch.randn(2, 2)])
    with pytest.raises(TraceError, match="shares memory"):  # checked at run time too
        fn(base, base.view(2, 2))


def test_each_mutated_input_checked_against_inputs_before_and_after_it():
    """The one-pass check finds a clash whichever side the mutated input is on, and two
    mutated inputs sharing memory."""

    def f(a, b, c):
        b.add_(1)
        c.mul_(2)
        return (a + 1,)

    fresh = [torch.randn(4), torch.randn(4), torch.randn(4)]
    fn = aot_eager(fx.symbolic_trace(f), _clone(fresh))
    base = torch.randn(4)
    for args in ([base, base.view(4), torch.randn(4)], [torch.randn(4), base, base[:2]]):
        with pytest.raises(TraceError, match="shares memory"):
            fn(*args)
    a, b, c = _clone(fresh)
    fn(a, b, c)
    torch.testing.assert_close((b, c), (fresh[1] + 1, fresh[2] * 2))


def test_aliasing_check_fast_path_and_its_exceptions():
    """The C-level pass (program.py `_distinct_storages`) accepts distinct storages; where
    it cannot tell (a storage shared with an empty view, a symbolic-size-like int input
    among the tensors) the exact check decides: an empty view shares no memory."""

    def f(a, b, c):
        b.add_(1)
        return (a + c.sum(),)

    fresh = [torch.randn(4), torch.randn(4), torch.randn(3)]
    fn = aot_eager(fx.symbolic_trace(f), _clone(fresh))
    a, b, c = _clone(fresh)
    fn(a, b, c)
    torch.testing.assert_close(b, fresh[1] + 1)
    empty = b[:0]  # same storage as b, no elements
    out = fn(a, b, empty)[0]
    torch.testing.assert_close((out, b), (a.clone(), fresh[1] + 2))
    with pytest.raises(TraceError, match="shares memory"):
        fn(a, b, b[1:])


def test_aliased_inputs_that_are_only_read_are_fine():
    def f(x, y):
        return (x * 2 + y.view(-1),)

    base = torch.randn(4)
    fn = aot_eager(fx.symbolic_trace(f), [base, base.view(2, 2)])
    torch.testing.assert_close(fn(base, base.view(2, 2))[0], 3 * base)


def test_data_dependent_rejected_clearly():
    def f(x):
        return (x.nonzero(),)

    with pytest.raises(TraceError, match="data-dependent"):
        aot_eager(fx.symbolic_trace(f), [torch.randn(4)])


def test_inference_fast_path_still_switches_to_training():
    def f(x):
        return (x.sin() * 2,)

    gm = fx.symbolic_trace(f)
    with torch.no_grad():
        fn = aot_eager(gm, [torch.randn(3)])
    x = torch.randn(3)
    torch.testing.assert_close(fn(x)[0], x.sin() * 2)  # the fast path
    xg = x.clone().requires_grad_()
    (y,) = fn(xg)
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(xg.grad, 2 * x.cos())
    with pytest.raises(TypeError):
        fn(torch.randn(3), 1)  # a different arity takes the general path, like the gm would


def test_tracing_does_not_import_dynamo():
    """FakeTensorMode and PyTorch's Python meta kernels would import torch._dynamo (seconds of
    first-call latency); ember.aot traces without it, inference and training alike."""
    import subprocess
    import sys

    code = (
        "import sys, torch, torch.fx as fx, ember.aot\n"
        "def f(x, w):\n"
        "    return (torch.nn.functional.gelu(x @ w).softmax(-1),)\n"
        "gm = fx.symbolic_trace(f)\n"
        "x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)\n"
        "ember.aot.aot_eager(gm, [x, w.detach()])\n"
        "ember.aot.aot_eager(gm, [x, w])(x, w)[0].sum().backward()\n"
        "assert w.grad is not None\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_symbolic_sizes_traced_once_for_every_size():
    """dynamic=True: one trace serves every size (tests/aot/test_aot_dynamic.py has more)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    fn = lambda x: (x * 2).sum(0)  # noqa: E731
    f = torch.compile(fn, backend=backend, dynamic=True)
    for rows in (3, 5, 17):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(f(x), fn(x))
    assert len(graphs) == 1


def _shift_in_place(b):
    b <<= 1
    return b


def _vector_matmul_no_grad(x, w):
    with torch.no_grad():
        return x @ w


@pytest.mark.parametrize(
    "fn,args",
    [
        (_shift_in_place, [torch.arange(6)]),  # aten.__ilshift__ -> __lshift__ + copy back
        # matmul's decomposition squeezes its own intermediate in place (squeeze_)
        (_vector_matmul_no_grad, [torch.randn(3), torch.randn(3, 2)]),
    ],
    ids=["ilshift", "vector_matmul_no_grad"],
)
def test_in_place_dunders_and_in_place_views_of_intermediates(fn, args):
    _check(fn, args)
