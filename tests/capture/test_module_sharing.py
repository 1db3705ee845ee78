"""Modules of one class share graphs (issue 17's FSDP2 recipe compiles each block on its own).

A module reached by a capture is guarded by its type and by what the trace read of it (its
plain attributes' values, its parameters' metadata, that it has no hooks, that no instance
attribute hides a method the trace called), not by its identity; its parameters and buffers
are the graph's inputs, read at each call. So every block of a model, compiled one by one,
runs the same graph, as under torch.compile, and a block that differs in anything the trace
read gets its own. Each test checks values against eager and the graph count against
Dynamo's on the same program."""

from __future__ import annotations

import copy

import torch
from torch import nn

import ember
from ember.backend import compile_graph
from ember.testing import CompileCounter, assert_same


class Block(nn.Module):
    def __init__(self, d: int = 8, scale: float = 0.5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x)).relu() * self.scale


def _chain(blocks, compile_block) -> tuple[list, int]:
    """Each block compiled on its own, called in a chain; the outputs and the graph count."""
    counter = CompileCounter()
    compiled = [compile_block(b, counter) for b in blocks]
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    outputs = []
    for block in compiled:
        x = block(x)
        outputs.append(x)
    return outputs, counter.frame_count


def _ember(block, counter):
    return ember.compile(block, backend=counter)


def _dynamo(block, counter):
    return torch.compile(block, backend=counter, dynamic=False)


def _eager_chain(blocks) -> list:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    outputs = []
    for block in blocks:
        x = block(x)
        outputs.append(x)
    return outputs


def _graphs_beside_dynamo(blocks: list) -> tuple[int, int]:
    """The blocks chained under ember (checked against eager) and under Dynamo: the graph
    counts of both."""
    ours, graphs = _chain(blocks, _ember)
    for got, want in zip(ours, _eager_chain(blocks), strict=True):
        assert_same(got, want)
    torch._dynamo.reset()
    return graphs, _chain(blocks, _dynamo)[1]


def test_blocks_compiled_one_by_one_share_graphs_as_under_dynamo():
    torch.manual_seed(0)
    graphs, dynamo_graphs = _graphs_beside_dynamo([Block() for _ in range(4)])
    # the first block's input needs no grad, the later ones' do: two graphs for four blocks
    assert graphs == dynamo_graphs == 2


def test_a_block_that_differs_in_what_the_trace_read_gets_its_own_graph():
    torch.manual_seed(0)
    blocks = [Block(), Block(), Block(scale=2.0), Block(d=8)]
    blocks[3].fc.bias = None  # no bias: a different parameter table
    graphs, dynamo_graphs = _graphs_beside_dynamo(blocks)
    assert graphs == dynamo_graphs == 4


def test_tied_and_untied_weights_are_told_apart():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x))

    def f(m, x):
        return m(x)

    torch.manual_seed(0)
    untied, tied = Tied(), Tied()
    tied.b.weight = tied.a.weight
    compiled = ember.compile(f, backend=CompileCounter())
    x = torch.randn(2, 4)
    for m in (untied, tied, untied):
        assert_same(compiled(m, x), f(m, x))


def test_running_statistics_land_in_the_module_that_was_called():
    def f(m, x):
        return m(x)

    torch.manual_seed(0)
    mods = [nn.BatchNorm1d(4) for _ in range(3)]
    refs = copy.deepcopy(mods)
    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter)
    for step in range(2):
        for m, r in zip(mods, refs, strict=True):
            x = torch.randn(8, 4) + step
            assert_same(compiled(m, x), f(r, x))
    for m, r in zip(mods, refs, strict=True):
        assert_same(m.running_mean, r.running_mean)
        assert_same(m.running_var, r.running_var)
        assert m.num_batches_tracked.item() == r.num_batches_tracked.item() == 2
    assert counter.frame_count == 1


def test_an_instance_attribute_that_hides_a_method_is_seen():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(x)

        def factor(self):
            return 2.0

    def f(m, x):
        return m(x) * m.factor()

    torch.manual_seed(0)
    a, b = M(), M()
    compiled = ember.compile(f, backend=CompileCounter())
    x = torch.ones(1, 3)
    assert_same(compiled(a, x), f(a, x))
    b.forward = lambda x: x * 100  # another object of the class, with its own forward
    b.factor = lambda: 5.0
    assert_same(compiled(b, x), f(b, x))
    a.factor = lambda: 7.0  # the same object, changed after the capture
    assert_same(compiled(a, x), f(a, x))


def test_a_plain_object_attribute_that_hides_a_method_is_seen():
    class Scaler:
        def factor(self):
            return 2.0

    def f(o, x):
        return x * o.factor()

    a, b = Scaler(), Scaler()
    compiled = ember.compile(f, backend=CompileCounter())
    x = torch.ones(3)
    assert_same(compiled(a, x), f(a, x))
    b.factor = lambda: 5.0
    assert_same(compiled(b, x), f(b, x))


def test_ints_of_modules_stay_constants():
    """Blocks that differ in a stride or a padding (ints on the module) share a function's
    cache: each gets its own static graph, as under Dynamo, where automatic dynamic shapes
    made the second one's strides symbols (the generated wrapper then failed to unpack
    them; a circular padding's symbol was missing from the wrapper: NameError)."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 6)
    convs = [
        nn.Conv2d(2, 2, 3, padding=1, stride=2),
        nn.Conv2d(2, 2, 3, padding=1),
        nn.Conv2d(2, 2, 3, padding=1, padding_mode="circular"),
        nn.Conv2d(2, 2, 3, padding=2, padding_mode="circular"),
        nn.Conv2d(2, 2, 3, padding=1, dilation=2),
    ]

    def f(m, x):
        return m(x)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_graph(gm, example_inputs)

    compiled = ember.compile(f, backend=backend)
    for conv in convs + convs:
        assert_same(compiled(conv, x), f(conv, x), rtol=1e-5, atol=1e-6)
    assert len(graphs) == len(convs)
    for gm in graphs:
        assert not any(
            isinstance(n.meta.get("example_value"), torch.SymInt)
            for n in gm.graph.find_nodes(op="placeholder")
        ), gm.code
