"""More differential programs and guard checks: foreign globals, module attributes replaced
or changed between calls, ModuleList slices, ParameterList, functools.reduce, itertools,
OrderedDict, shape idioms."""

from __future__ import annotations

import collections
import functools
import itertools
import operator

import helper_module
import pytest
import torch
from torch import nn

import ember
from ember.testing import (
    CompileCounter,
    assert_same,
    check_against_eager,
    check_program,
    program_ids,
)

ONES = torch.ones(4)


def x4():
    return torch.randn(4)


def x34():
    return torch.randn(3, 4)


def p_foreign_globals(x):
    return helper_module.scale(x) + helper_module.FACTOR


def p_reduce(x):
    parts = x.unbind(0)
    return functools.reduce(operator.add, parts), functools.reduce(operator.mul, [1, 2, 3], 2)


def p_itertools(x):
    rows = list(itertools.chain(x.unbind(0), [x[0] * 2]))
    pairs = list(itertools.product(range(2), "ab"))
    return rows, pairs


def p_ordered_dict(x):
    d = collections.OrderedDict()
    d["b"] = x
    d["a"] = x * 2
    return d, list(d)


def p_shape_idioms(x):
    return (
        x.view(x.size(0), -1),
        torch.zeros(*x.shape),
        tuple(x.shape),
        list(x.size()),
        len(x.shape),
        max(x.shape),
        "x".join(map(str, x.shape)),
        torch.arange(x.shape[-1], device=x.device),
        x.numel() == 0,
    )


def p_dtype_membership(x):
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x * 2, str(x.device), x.device.type


def p_parameter_isinstance(p, x):
    return x * p if isinstance(p, nn.Parameter) else x


CASES = [
    (p_foreign_globals, [x4]),
    (p_reduce, [x34]),
    (p_itertools, [x34]),
    (p_ordered_dict, [x4]),
    (p_shape_idioms, [x34]),
    (p_dtype_membership, [x4]),
    (p_parameter_isinstance, [lambda: nn.Parameter(torch.randn(4)), x4]),
]


@pytest.mark.parametrize(("fn", "makers"), CASES, ids=program_ids(CASES))
def test_program(fn, makers):
    check_program(fn, makers)


def test_foreign_global_change_recompiles():
    counter = CompileCounter()
    compiled = ember.compile(p_foreign_globals, backend=counter, fullgraph=True)
    saved = helper_module.FACTOR, helper_module.OFFSET
    try:
        for factor in (3, 3, 4):
            helper_module.FACTOR = factor
            helper_module.OFFSET = torch.randn(4)  # a tensor global: new data, no recompile
            x = x4()
            assert_same(compiled(x), p_foreign_globals(x))
    finally:
        helper_module.FACTOR, helper_module.OFFSET = saved
    assert counter.frame_count == 2


class Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.gains = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])
        self.biases = nn.ParameterDict({"a": nn.Parameter(torch.randn(4))})
        self.scale = 2
        self.act = nn.ReLU()

    def forward(self, x):
        for layer in self.layers[1:]:
            x = self.act(layer(x))
        for g in self.gains:
            x = x * g
        for _key, b in self.biases.items():
            x = x + b
        return self.layers[0](x) * self.scale + len(self.layers[:2])


def test_module_list_slice_and_parameter_containers():
    mod = Layers()
    counter = CompileCounter()
    compiled = ember.compile(mod, backend=counter, fullgraph=True)
    for _ in range(2):
        x = x34()
        assert_same(compiled(x), mod(x))
    assert counter.frame_count == 1


def test_changed_module_state_between_calls():
    mod = Layers()
    counter = CompileCounter()
    compiled = ember.compile(mod, backend=counter, fullgraph=True)
    x = x34()
    assert_same(compiled(x), mod(x))
    with torch.no_grad():
        mod.layers[0].weight.mul_(2)  # new values in place: no recompile
    assert_same(compiled(x), mod(x))
    mod.layers[1].weight = nn.Parameter(torch.randn(4, 4))  # a new parameter of same kind
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 1
    mod.scale = 3  # a baked int
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 2
    mod.act = nn.Tanh()  # another child module
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 3
    mod.layers.append(nn.Linear(4, 4))  # longer ModuleList
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 4


def test_user_object_tensor_attribute_new_data_no_recompile():
    class Holder:
        def __init__(self):
            self.w = torch.randn(4)

    def f(h, x):
        return x * h.w

    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    h = Holder()
    for _ in range(3):
        h.w = torch.randn(4)
        x = x4()
        assert_same(compiled(h, x), f(h, x))
    assert counter.frame_count == 1


def test_tensor_default_arguments():
    default = torch.randn(4)

    def inner(x, w=default):
        return x * w

    def f(x, b=ONES):
        return inner(x) + b

    check_against_eager(f, x4(), frames=1)


def _factory(w):
    def g(x):
        return x * w

    return g


G1 = _factory(torch.randn(4))
G2 = _factory(torch.randn(4))


def _takes_defaults(x, a=G1, b=G2):
    return a(x) + b(x)


def test_same_named_sources_get_distinct_placeholders():
    def f(x):
        return _takes_defaults(x)

    check_against_eager(f, x4(), frames=1)
