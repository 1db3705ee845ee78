"""`ember.compile`'s contract: call form and decorators, the module wrapper, reset, disable,
the recompile limit, backends by name and callable, backend failures, empty graphs, and
seed 000's captured graph."""

from __future__ import annotations

import functools
import logging
import warnings

import pytest
import torch
import torch._dynamo.testing
from torch import nn

import ember
from ember.capture import cache as frame_cache
from ember.capture.frame import graph_code
from ember.testing import CompileCounter, assert_same

bias = torch.randn(4)
LIMITED = 0


def seed_f(x, y):
    return (x @ y + bias).relu()


def test_seed_000_graph_code():
    counter = CompileCounter()
    compiled = ember.compile(seed_f, backend=counter, fullgraph=True)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(compiled(x, y), seed_f(x, y))
    (gm,) = counter.graphs
    text = graph_code(gm)
    assert 'L_x_: "f32[4, 4]"' in text
    assert 'L_y_: "f32[4, 4]"' in text
    assert 'G_bias_: "f32[4]"' in text
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert [p.lower() for p in placeholders] == ["l_x_", "l_y_", "g_bias_"]
    body = text[text.index("):") :]
    assert body.index("matmul") < body.index("add") < body.index("relu")
    assert "= None" in text  # values released after their last use
    assert "return (relu,)" in text  # always a tuple
    targets = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert len(targets) == 3


def test_seed_000_graph_code_log(caplog):
    ember.set_logs("graph_code", "guards", "recompiles")
    try:
        with caplog.at_level(logging.DEBUG, logger="ember"):
            compiled = ember.compile(seed_f, backend="eager", fullgraph=True)
            compiled(torch.randn(4, 4), torch.randn(4, 4))
            compiled(torch.randn(4, 4).double(), torch.randn(4, 4).double())
    finally:
        ember.set_logs()
    text = caplog.text
    assert 'L_x_: "f32[4, 4]", L_y_: "f32[4, 4]", G_bias_: "f32[4]"' in text
    assert "return (relu,)" in text
    assert "def ___guard(x, y)" in text
    assert "recompiling" in text and "dtype" in text


def test_call_form_and_both_decorator_forms():
    def f(x):
        return x.sin() + 1

    @ember.compile
    def bare(x):
        return x.sin() + 1

    @ember.compile(backend="eager", fullgraph=True)
    def with_args(x):
        return x.sin() + 1

    x = torch.randn(3)
    expected = f(x)
    for fn in (ember.compile(f, backend="eager"), bare, with_args):
        assert_same(fn(x), expected)
        assert_same(fn(x), expected)
    assert bare.__name__ == "bare"


def test_compile_bound_method():
    class Scale:
        def __init__(self):
            self.k = 3.0

        def run(self, x):
            return x * self.k

    s = Scale()
    counter = CompileCounter()
    compiled = ember.compile(s.run, backend=counter, fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), s.run(x))
    assert counter.frame_count == 1


def _shift(shift, x, scale=1.0):
    return (x + shift) * scale


def _seeded_linear():
    torch.manual_seed(0)
    return nn.Linear(3, 3)


class Doubler:
    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x * 2


@pytest.mark.parametrize(
    ("make", "count"),
    [
        (lambda: functools.partial(_shift, 1.5, scale=2.0), None),
        (lambda: functools.partial(functools.partial(_shift, 1.5), scale=3.0), None),
        (Doubler, "calls"),
        (lambda: torch.sin, None),
        (lambda: functools.partial(_seeded_linear()), None),
    ],
    ids=["partial", "nested partial", "callable object", "builtin", "partial of a module"],
)
def test_any_callable_compiles_as_under_torch_compile(make, count):
    """torch.compile takes any callable: partials, objects with __call__, builtins. Each
    is one graph under ember, as under Dynamo, and its Python state is eager's."""
    eager_fn, compiled_fn = make(), make()
    x = torch.randn(3)
    counter = CompileCounter()
    compiled = ember.compile(compiled_fn, backend=counter, fullgraph=True)
    for _ in range(2):
        assert_same(compiled(x), eager_fn(x))
    assert counter.frame_count == 1
    if count:
        assert getattr(compiled_fn, count) == getattr(eager_fn, count) == 2
    dynamo = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    torch.compile(make(), backend=dynamo, fullgraph=True)(x)
    assert dynamo.frame_count == counter.frame_count


def test_compile_refuses_what_is_not_callable():
    with pytest.raises(TypeError, match="expects a callable, got int"):
        ember.compile(3)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.tag = "net"

    def forward(self, x):
        return self.drop(self.lin(x))


def test_module_wrapper_passes_everything_through():
    net = Net()
    counter = CompileCounter()
    compiled = ember.compile(net, backend=counter, fullgraph=True)
    assert isinstance(compiled, nn.Module)
    assert compiled._orig_mod is net
    assert compiled.tag == "net"
    assert compiled.lin is net.lin
    assert [n for n, _ in compiled._orig_mod.named_parameters()] == ["lin.weight", "lin.bias"]
    assert list(compiled.state_dict()) == list(net.state_dict())
    assert all(a is b for a, b in zip(compiled.parameters(), net.parameters()))
    compiled.eval()
    assert not net.training and not net.drop.training
    x = torch.randn(2, 4)
    assert_same(compiled(x), net(x))
    compiled.train()
    assert net.training and net.drop.training
    compiled.tag = "renamed"
    assert net.tag == "renamed"
    state = {k: torch.zeros_like(v) for k, v in net.state_dict().items()}
    compiled.load_state_dict(state)
    assert net.lin.weight.abs().sum() == 0
    compiled.eval()
    assert_same(compiled(x), net(x))  # new parameter values, no recompile needed
    assert counter.frame_count == 1


def test_reset_forgets_cache_entries():
    def f(x):
        return x * 2

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    compiled(torch.randn(3))
    compiled(torch.randn(3))
    assert counter.frame_count == 1
    ember.reset()
    assert frame_cache.cache_for(f.__code__).entries == []
    compiled(torch.randn(3))
    compiled(torch.randn(3))
    assert counter.frame_count == 2


def test_disable_marks_a_function_never_to_capture():
    calls = []

    @ember.disable
    def python_only(x):
        calls.append(1)
        return x + 1

    counter = CompileCounter()
    compiled = ember.compile(python_only, backend=counter)
    assert_same(compiled(torch.ones(2)), torch.ones(2) + 1)
    assert counter.frame_count == 0
    assert calls == [1]
    assert ember.compile(lambda x: x, disable=True) is not None


def test_recompile_limit_falls_back_to_eager_with_warning():
    def f(x):
        return x * LIMITED

    global LIMITED
    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter)  # fullgraph=True raises instead
    saved = LIMITED
    try:
        with ember.config.patch(recompile_limit=2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for value in range(5):
                    LIMITED = value
                    x = torch.randn(3)
                    assert_same(compiled(x), f(x))
    finally:
        LIMITED = saved
    assert counter.frame_count == 2
    messages = [str(w.message) for w in caught]
    assert any("recompile limit" in m and "['LIMITED'] == " in m for m in messages), messages


def test_backend_by_name_and_callable():
    def f(x):
        return torch.tanh(x) * 2

    x = torch.randn(3, 3)
    seen = []

    def my_backend(gm, example_inputs):
        seen.append([tuple(t.shape) for t in example_inputs])
        return gm.forward

    for backend in ("eager", "aot_eager", my_backend):
        ember.reset()
        compiled = ember.compile(f, backend=backend, fullgraph=True)
        assert_same(compiled(x), f(x))
        assert_same(compiled(x), f(x))
    assert seen == [[(3, 3)]]
    with pytest.raises(ValueError, match="unknown backend"):
        ember.compile(f, backend="no_such_backend")


def test_backend_failure_names_backend_and_shows_graph():
    def broken_backend(gm, example_inputs):
        raise RuntimeError("boom")

    compiled = ember.compile(seed_f, backend=broken_backend, fullgraph=True)
    with pytest.raises(ember.BackendCompilerFailed) as info:
        compiled(torch.randn(4, 4), torch.randn(4, 4))
    message = str(info.value)
    assert "broken_backend" in message
    assert "boom" in message
    assert "L_x_" in message and "matmul" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_empty_graph_skips_the_backend():
    def f(x, n):
        shape = x.shape
        return {"rows": shape[0] * n, "name": f"t{n}"}, x

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(3, 2)
    for _ in range(2):
        got = compiled(x, 4)
        assert got == ({"rows": 12, "name": "t4"}, x)
        assert got[1] is x
    assert counter.frame_count == 0
    (entry,) = frame_cache.cache_for(f.__code__).entries
    assert entry.graph is None


def test_compiled_function_is_installed_as_global():
    counter = CompileCounter()
    compiled = ember.compile(seed_f, backend=counter, fullgraph=True)
    compiled(torch.randn(4, 4), torch.randn(4, 4))
    (entry,) = frame_cache.cache_for(seed_f.__code__).entries
    assert entry.compiled_name.startswith("__compiled_fn_")
    assert entry.compiled_name in seed_f.__globals__
    assert entry.compiled_name in entry.code.co_names
    assert isinstance(entry.code, type(seed_f.__code__))


@ember.compile(backend="eager")
def _compiled_helper(x):
    return x.sin() * 2


@ember.disable
def _python_only(x):
    return x.cos()


def test_compiled_function_called_from_compiled_code_is_inlined():
    def f(x):
        return _compiled_helper(x) + 1

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(3)
    for _ in range(2):
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1
    assert counter.op_count == 3  # sin, mul, add: one graph


def test_disabled_function_called_from_compiled_code_runs_in_python():
    def f(x):
        return _python_only(x) + 1

    with pytest.raises(ember.Unsupported):
        ember.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    compiled = ember.compile(f, backend="eager")
    x = torch.randn(3)
    assert_same(compiled(x), f(x))


def test_compiled_module_used_inside_compiled_function():
    net = Net().eval()
    inner = ember.compile(net, backend="eager")

    def f(x):
        return inner(x).relu()

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(2, 4)
    for _ in range(2):
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1


def test_options_are_checked():
    with pytest.raises(ValueError, match="mode"):
        ember.compile(seed_f, mode="fastest-please")
    with pytest.raises(RuntimeError):
        ember.compile(seed_f, mode="default", options={"a": 1})
    with pytest.raises(ValueError, match=r"unknown options 'max_autotune', 'x'.*known options"):
        ember.compile(seed_f, options={"x": 1, "max_autotune": True})
    for mode in (None, "default", "reduce-overhead", "max-autotune"):
        compiled = ember.compile(seed_f, backend="eager", mode=mode)
        x, y = torch.randn(4, 4), torch.randn(4, 4)
        assert_same(compiled(x, y), seed_f(x, y))
