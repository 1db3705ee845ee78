"""Dynamic shapes in ember's own capture (issue 13): `ember.compile(fn, dynamic=...)`, the
marks, size symbols as graph inputs, relation guards, 0/1 specialization, and the logs.

Every result is compared with eager; graph counts come from a counting backend and, where the
question is "no worse than torch.compile", from Dynamo's own count on the same function.
"""

from __future__ import annotations

import copy
import logging
import operator

import pytest
import torch

import ember
from ember.capture import cache as frame_cache
from ember.testing import CompileCounter, CountingBackend, assert_same

SIZES = [2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 64, 127]
"""Primes, powers of two and sizes on both sides of 8- and 16-lane vector widths."""


def rows(x, w):
    n = x.shape[0]
    y = torch.softmax(x @ w, dim=-1) * x.size(1)
    z = y.reshape(n * 2, -1).view(n, -1) + x.sum() / x.numel()
    return z.expand(n, -1) + torch.zeros(x.shape[0], 1)


def symbol_placeholders(gm: torch.fx.GraphModule) -> list[str]:
    return [
        n.name
        for n in gm.graph.find_nodes(op="placeholder")
        if isinstance(n.meta.get("example_value"), torch.SymInt)
    ]


def has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
    return any(
        isinstance(s, torch.SymInt)
        for n in gm.graph.find_nodes(op="placeholder")
        for s in n.meta["example_value"].shape
    )


@pytest.mark.parametrize("backend", ["eager", "ember"])
def test_dynamic_true_one_graph_for_every_size(backend):
    counter = CountingBackend(backend)
    compiled = ember.compile(rows, backend=counter, dynamic=True, fullgraph=True)
    w = torch.randn(6, 4)
    for n in SIZES:
        x = torch.randn(n, 6)
        assert_same(compiled(x, w), rows(x, w), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1
    (gm,) = counter.graphs
    assert len(symbol_placeholders(gm)) == 2  # the batch, and the width x and w share
    assert "Sym(s" in gm.print_readable(print_output=False)


@pytest.mark.parametrize("first", [0, 1])
def test_zero_and_one_are_specialized(first):
    def f(x):
        return x * 2 + x.shape[0]

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [first, first, 5, 9, first]:
        x = torch.randn(n, 3)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 2
    assert symbol_placeholders(counter.graphs[0]) == []  # a size 0 or 1 stays a constant
    assert len(symbol_placeholders(counter.graphs[1])) == 1


def test_automatic_dynamic_at_most_two_graphs_and_no_worse_than_dynamo():
    import torch._dynamo.testing

    w = torch.randn(6, 4)
    counter = CompileCounter()
    compiled = ember.compile(rows, backend=counter)
    dynamo_counter = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    dynamo = torch.compile(rows, backend=dynamo_counter)
    for n in SIZES:
        x = torch.randn(n, 6)
        assert_same(compiled(x, w), rows(x, w))
        dynamo(x, w)
    assert counter.frame_count == 2  # static, then dynamic
    assert symbol_placeholders(counter.graphs[0]) == []
    assert symbol_placeholders(counter.graphs[1]) != []
    assert counter.frame_count <= dynamo_counter.frame_count
    torch._dynamo.reset()


def test_dynamic_false_recompiles_per_size():
    counter = CompileCounter()
    compiled = ember.compile(rows, backend=counter, dynamic=False)
    w = torch.randn(6, 4)
    for n in SIZES[:4]:
        x = torch.randn(n, 6)
        assert_same(compiled(x, w), rows(x, w))
    assert counter.frame_count == 4


def test_relation_guard_flips_and_recompiles_once():
    def f(x):
        if x.shape[0] > 4:
            return x.sin()
        return x.cos()

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [5, 6, 9, 33, 2, 3, 4, 7]:
        x = torch.randn(n)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 2  # one graph per side of the relation, never per value
    cache = frame_cache.cache_for(f.__code__)
    first, second = (entry.guard.conditions for entry in cache.entries)
    assert any("L['x'].size()[0] > 4" in c for c in first)
    assert any("L['x'].size()[0] <= 4" in c for c in second)


def test_baked_size_specializes_with_a_guard():
    def f(x):
        if x.size(0) == 4:
            return x.view(4, -1) * 2
        return x + 1

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [4, 4, 5, 6, 4, 7]:
        x = torch.randn(n, 3)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 2


def test_two_inputs_sizes_related_by_the_trace():
    def f(x, y):
        return (x + y).sum(0), torch.cat([x, y]).shape[0]

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [3, 5, 8]:
        x, y = torch.randn(n, 2), torch.randn(n, 2)
        assert_same(compiled(x, y), f(x, y))
    assert counter.frame_count == 1
    # broadcasting assumed x and y have one size: a call where they differ must recompile
    # (and raise the error eager raises)
    with pytest.raises(RuntimeError):
        compiled(torch.randn(3, 2), torch.randn(4, 2))


def test_int_argument_is_a_symbol():
    def f(x, n):
        return x[:n] * n + x.new_ones(n, 1)

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    x = torch.randn(40, 3)
    for n in [2, 3, 7, 16, 31]:
        assert_same(compiled(x, n), f(x, n))
    assert counter.frame_count == 1
    assert len(symbol_placeholders(counter.graphs[0])) == 1


def test_mark_dynamic_and_mark_static():
    def f(x):
        return x.sum(1) * x.shape[1]

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=False)
    for n in [3, 4, 9]:
        x = torch.randn(2, n)
        ember.mark_dynamic(x, 1)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1

    counter.clear()
    ember.reset()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [3, 4]:
        x = torch.randn(n, 5)
        ember.mark_static(x, 0)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 2  # dim 0 kept static


def test_mark_dynamic_bounds_are_guarded():
    def f(x):
        return x * 2

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=False)
    for n in [3, 8, 9, 20, 5]:
        x = torch.randn(n)
        ember.mark_dynamic(x, 0, min=2, max=8)
        assert_same(compiled(x), f(x))
    # 3, 8 and 5 in range share a graph; 9 and 20 outside it are static (logged)
    assert [has_symbolic_sizes(gm) for gm in counter.graphs] == [True, False, False]


def test_torch_dynamo_marks_are_honored():
    import torch._dynamo

    def f(x):
        return x.relu() + x.shape[0]

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=False)
    for n in [3, 6, 11]:
        x = torch.randn(n, 2)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1

    for mark in (torch._dynamo.maybe_mark_dynamic, ember.maybe_mark_dynamic):
        counter.clear()
        ember.reset()
        compiled = ember.compile(f, backend=counter, dynamic=False)
        for n in [3, 6, 11]:
            x = torch.randn(n, 2)
            mark(x, 0)
            assert_same(compiled(x), f(x))
        assert counter.frame_count == 1

    counter.clear()
    ember.reset()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [3, 6]:
        x = torch.randn(n, 2)
        torch._dynamo.mark_static(x, 0)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 2


def test_logs_name_symbols_guards_and_the_changed_dim(caplog):
    def f(x):
        if x.shape[0] > 2:  # the guard's line
            return x + 1
        return x - 1

    ember.set_logs("dynamic", "recompiles")
    compiled = ember.compile(f, backend="eager")
    with caplog.at_level(logging.DEBUG, logger="ember"):
        compiled(torch.randn(4))
        compiled(torch.randn(5))
    text = caplog.text
    assert "L['x'].size()[0] changed from 4 to 5: the next graph makes it dynamic" in text
    assert "create symbol s" in text and "for L['x'].size()[0]" in text
    assert f"{__file__}:{f.__code__.co_firstlineno + 1}" in text


def test_training_with_a_variable_batch_ember_backend():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    counter = CountingBackend("ember")
    compiled = ember.compile(model, backend=counter)
    for n in [4, 7, 13, 5]:
        x = torch.randn(n, 8)
        out = compiled(x)
        grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
        expected = model(x)
        want = torch.autograd.grad(expected.square().mean(), list(model.parameters()))
        assert_same(out, expected, rtol=1e-4, atol=1e-5)
        for g, e in zip(grads, want, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 2


def test_aot_eager_with_dynamic_true():
    counter = CountingBackend("aot_eager")
    compiled = ember.compile(rows, backend=counter, dynamic=True)
    w = torch.randn(6, 4, requires_grad=True)
    for n in [3, 17, 64]:
        x = torch.randn(n, 6)
        out = compiled(x, w)
        (grad,) = torch.autograd.grad(out.sum(), [w])
        expected = rows(x, w)
        assert_same(out, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad, torch.autograd.grad(expected.sum(), [w])[0])
    assert counter.frame_count == 1


def test_inductor_receives_symbolic_graphs():
    def f(x):
        return (x * x.shape[0]).sin().sum(1)

    counter = CountingBackend("inductor")
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [3, 10, 33]:
        x = torch.randn(n, 5)
        assert_same(compiled(x), f(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1


def test_sizes_read_as_python_values_are_specialized_not_leaked():
    def f(x, n):
        tag = f"rows={x.shape[0]} n={n}"
        kinds = (isinstance(n, int), type(x.shape[0]) is int)
        return x * n, tag, kinds, str(x.shape), {n: 1}

    compiled = ember.compile(f, backend="eager", dynamic=True)
    for n in [3, 4, 7]:
        x = torch.randn(n + 2, 2)
        assert_same(compiled(x, n), f(x, n))


class Counter(torch.nn.Module):
    """Seed 002's counter."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2


def graph_work(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def test_counter_is_no_graph_work_and_no_value_guard():
    """Seed 002's counter, called 10 times: torch.compile guards `self.calls` by value and
    recompiles on every call (up to its limit); ember's graph holds only the mul, and
    `calls + 1` is computed by the code after the graph."""
    import torch._dynamo.testing

    model, reference, dynamo_model = Counter(), Counter(), Counter()
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter)
    dynamo_counter = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    dynamo = torch.compile(dynamo_model, backend=dynamo_counter)
    for _ in range(10):
        x = torch.randn(3)
        assert_same(compiled(x), reference(x))
        dynamo(x)
    assert model.calls == reference.calls == dynamo_model.calls == 10
    # the capture sees it writes `self.calls` back changed: a symbol from the first graph
    assert counter.frame_count == 1
    assert counter.frame_count <= dynamo_counter.frame_count
    for gm in counter.graphs:
        assert graph_work(gm) == [operator.mul]
        assert symbol_placeholders(gm) == []
    (entry,) = frame_cache.cache_for(Counter.forward.__code__).entries
    assert not [c for c in entry.guard.conditions if ".calls ==" in c]
    torch._dynamo.reset()


class Ledger(torch.nn.Module):
    """Reads of a counter before and after its increment, an attribute derived from it, a
    global list the values go to, and the counter in tensor work too."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.total = 0

    def forward(self, x):
        before = self.calls
        self.calls += 1
        self.total = self.total + self.calls * 2
        HISTORY.append(self.calls)
        return x * before, before, self.calls, self.total


HISTORY: list[int] = []


def test_counter_values_are_the_ones_at_entry_whatever_the_replay_writes():
    model, reference = Ledger(), Ledger()
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter)
    for _ in range(6):
        x = torch.randn(3)
        HISTORY.clear()
        got = compiled(x)
        appended = list(HISTORY)
        HISTORY.clear()
        assert_same(got, reference(x))
        assert appended == HISTORY
    assert (model.calls, model.total) == (reference.calls, reference.total) == (6, 42)
    assert counter.frame_count == 1  # the graph takes the counter's symbol (`x * before`)
    (gm,) = counter.graphs
    assert graph_work(gm) == [operator.mul]
    assert len(symbol_placeholders(gm)) == 1


COUNT = 0


def count_globally(x):
    global COUNT
    COUNT += 1
    return x * 2


@pytest.mark.parametrize("dynamic", [None, False])
def test_global_counter_is_a_symbol_unless_dynamic_false(dynamic):
    global COUNT
    COUNT = 0
    counter = CompileCounter()
    compiled = ember.compile(count_globally, backend=counter, dynamic=dynamic)
    for _ in range(4):
        x = torch.randn(3)
        assert_same(compiled(x), x * 2)
    assert COUNT == 4
    # dynamic=False: the value is guarded, every call recompiles (as torch.compile does)
    assert counter.frame_count == (1 if dynamic is None else 4)
    assert all(graph_work(gm) == [operator.mul] for gm in counter.graphs)


def test_returned_size_arithmetic_is_computed_in_python_not_output():
    def f(x):
        n = x.shape[0]
        return x.sin(), n * 2 + 1, x.shape, n // 3 > 1

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [2, 5, 7, 11]:
        x = torch.randn(n, 3)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1
    (gm,) = counter.graphs
    (output,) = gm.graph.find_nodes(op="output")
    assert len(output.args[0]) == 1  # the sine: the numbers are Python's work
    assert symbol_placeholders(gm) == []


def test_shape_tuples_built_from_sizes_stay_symbolic():
    """transformers' GPT-2 builds `(-1,) + input_shape[1:] + (hidden,)` for its output view."""

    def f(x):
        shape = x.shape
        out_shape = (-1,) + shape[1:] + (1,)
        return x.reshape(-1, shape[-1]).cumsum(0).view(out_shape)

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter)
    for n in [3, 5, 8, 17]:
        x = torch.randn(2, n, 4)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 2


def test_size_arithmetic_floordiv_mod_max_slices_and_arange():
    def f(x):
        n = x.shape[0]
        h = n // 2
        halves = x[:h] * (n % 3) + x[h : 2 * h]
        steps = torch.arange(n - h) * max(n, 3)
        flat = x.view(-1, x.shape[1] * x.shape[2]).T.contiguous()
        return halves.sum(0), steps, flat.reshape(x.shape[2], -1, x.shape[1])

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, dynamic=True)
    for n in [4, 5, 6, 7, 9, 12]:
        x = torch.randn(n, 3, 2)
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1


def test_an_int_attribute_read_twice_is_one_symbol():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2

        def forward(self, x):
            return x * self.k + self.k

    model = Scaled()
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter)
    for k in [2, 3, 4, 5]:
        model.k = k
        x = torch.randn(3)
        assert_same(compiled(x), x * k + k)
    assert counter.frame_count == 2
    assert len(symbol_placeholders(counter.graphs[-1])) == 1


def _capture_layouts(gm: torch.fx.GraphModule) -> list[str]:
    def text(v):
        if isinstance(v, torch.Tensor):
            return f"{v.dtype} {tuple(v.shape)} {v.stride()} {v.storage_offset()} {v.requires_grad}"
        return str(v)

    leaves = torch.utils._pytree.tree_leaves
    return [
        f"{n.format_node()} :: {[text(v) for v in leaves(n.meta.get('example_value'))]}"
        for n in gm.graph.nodes
    ]


@pytest.mark.parametrize("case", ["layers training", "gpt2"])
def test_symbolic_capture_with_layout_shortcuts_makes_the_same_graphs(monkeypatch, case):
    """A dynamic capture's ops on symbolic sizes are answered by ember.aot's exact layout
    shortcuts (values/meta.py `_Shortcuts`) where they apply: the same graphs, node for node
    with every example value's layout, and the same guards as with torch's meta kernels."""
    from ember.aot import symbolic_meta
    from ember.capture.values import meta
    from ember.testing.models import VOCAB, by_name

    torch.manual_seed(0)
    training = case == "layers training"
    if training:
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        fn = torch.nn.Sequential(layer, copy.deepcopy(layer))
        make = lambda t: torch.randn(2, t, 16, requires_grad=True)  # noqa: E731
    else:
        model = by_name("gpt2").build()[0].eval()
        fn = lambda ids: model(input_ids=ids, use_cache=False).logits  # noqa: E731
        make = lambda t: torch.randint(0, VOCAB, (2, t))  # noqa: E731
    seen = {}
    for enabled in (True, False):
        monkeypatch.setattr(symbolic_meta, "ENABLED", enabled)
        symbolic_meta.stats.clear()
        meta.clear_cache()
        graphs = []

        def backend(gm, example_inputs, graphs=graphs):
            graphs.append(_capture_layouts(gm))
            return gm.forward

        compiled = ember.compile(fn, backend=backend)
        for t in (3, 7, 12):
            x = make(t)
            with torch.set_grad_enabled(training):
                assert_same(compiled(x), fn(x), rtol=1e-5, atol=1e-5)
        guards = [
            e.guard.conditions
            for e in frame_cache.cache_for(fn.forward.__code__ if training else fn.__code__).entries
        ]
        seen[enabled] = (graphs, guards)
        if enabled:
            assert symbolic_meta.stats["recalled"] + symbolic_meta.stats["pointwise"] > 5
            if not training:  # the attention mask's cumsum; SDPA by its shape rule
                assert symbolic_meta.stats["along_a_dim"] >= 1
                assert symbolic_meta.stats["attention"] >= 1
    assert len(seen[True][0]) == 2  # static, then dynamic
    assert seen[True] == seen[False]
