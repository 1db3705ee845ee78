"""The mutation ledger: Python state after a compiled call equals eager's (seed 002)."""

from __future__ import annotations

import copy

import pytest
import torch

import ember
from ember.testing import CompileCounter, assert_same

log: list = []
counter = 0


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        log.append(self.calls)
        return x * 2


def test_seed_002_example_exactly():
    log.clear()
    cnt = CompileCounter()
    m = ember.compile(Model(), backend=cnt)
    m(torch.randn(4))
    m(torch.randn(4))
    assert (m.calls, log) == (2, [1, 2])
    ops = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
    assert len(ops) == 1 and ops[0].__name__ == "mul"


class Obj:
    def __init__(self):
        self.n = 0
        self.items = []


def bump_global(x):
    global counter
    counter += 1
    return x + counter


def appends(x, out):
    for i in range(10):
        out.append(i)
    return x * len(out)


def dict_ops(x, d):
    d["a"] = x.sum()
    d.update(b=1)
    d.setdefault("c", 3)
    del d["z"]
    return x + 1


def list_ops(x, lst):
    lst.extend([1, 2])
    lst.insert(0, "h")
    lst.pop()
    lst.remove(1)
    lst[0] = "k"
    return x - 1


def obj_attrs(x, o):
    o.n += 1
    o.n += 1
    o.items.append(o.n)
    o.last = x * 3
    return o.n


def read_after_write(x, o):
    o.n = 5
    return x * o.n


def new_object_escapes(x, out):
    o = Obj()
    o.n = 3
    out.append(o)
    return x


def closure_write(x):
    total = [0]

    def add(v):
        total[0] += v
        return total[0]

    add(2)
    return x * add(3)


def make_nonlocal():
    count = 0

    def f(x):
        nonlocal count
        count += 1
        return x * count

    return f, lambda: count


CASES = [
    (appends, lambda: (torch.randn(3), [])),
    (dict_ops, lambda: (torch.randn(3), {"z": 0})),
    (list_ops, lambda: (torch.randn(3), ["a", 1])),
    (obj_attrs, lambda: (torch.randn(3), Obj())),
    (read_after_write, lambda: (torch.randn(3), Obj())),
    (new_object_escapes, lambda: (torch.randn(3), [])),
    (closure_write, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_mutations_match_eager(fn, make_args):
    cnt = CompileCounter()
    compiled = ember.compile(fn, backend=cnt, fullgraph=True)
    for _ in range(2):
        args = make_args()
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        result = compiled(*args)
        assert_same(result, expected)
        assert_same(args, eager_args, path="arguments after the call")
    assert cnt.frame_count <= 1


def test_global_rebinding_replayed():
    global counter
    counter = 0
    compiled = ember.compile(bump_global, backend="eager", fullgraph=True)
    x = torch.ones(2)
    assert torch.equal(compiled(x), x + 1)
    assert counter == 1


def test_nonlocal_write_replayed():
    f, read = make_nonlocal()
    compiled = ember.compile(f, backend="eager", fullgraph=True)
    x = torch.ones(2)
    assert torch.equal(compiled(x), x * 1)
    assert read() == 1


def test_tensor_inplace_ops_in_graph():
    def f(x):
        x.add_(1)
        x[0] = 7
        return x

    x = torch.zeros(3)
    compiled = ember.compile(f, backend="eager", fullgraph=True)
    out = compiled(x)
    assert out is x
    assert x.tolist() == [7.0, 1.0, 1.0]
