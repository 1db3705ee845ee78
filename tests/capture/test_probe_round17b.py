"""Probe round of session 17, second part (issue 12): list subclasses from outside the
compiled function, and `nn.Buffer(...)` in a module made in forward. Each program is
compared with eager (values, types, identities, arguments after the call, printed text) and
with Dynamo's graph and break counts on the same function (fidelity_harness)."""

from __future__ import annotations

import pytest
import torch
from fidelity_harness import check
from torch import nn

import ember

# --- list subclasses from outside: list's C methods on their items -------------------------


class Items(list):
    pass


class Tagged(list):
    scale = 3


class Doubling(list):
    """Overrides `[]` (inlined); its `len`, `in` and iteration stay list's."""

    def __getitem__(self, i):
        return super().__getitem__(i) * 2


class Counted(list):
    """Overrides the store: the trace's own writes go through it, the replay past it."""

    def __setitem__(self, i, v):
        super().__setitem__(i, v + 1)


def p_read_items(x, lst):
    return x * lst[0] + lst[1]


def p_len_slice_in(x, lst):
    return x * len(lst) + sum(lst[:2]) + (3 in lst) + lst[-1]


def p_iterate(x, lst):
    for v in lst:
        x = x + v
    return x, list(lst), bool(lst)


def p_attrs_and_items(x, lst):
    return x * lst.scale * lst.tag + lst[-1] + lst.index(2) + lst.count(1)


def p_override_read(x, lst):
    return x * lst[0] + lst[1] + len(lst), [v for v in lst]


def p_writes(x, lst):
    lst.append(x.sum())
    lst.pop(0)
    lst[0] = 5
    lst.insert(0, 7)
    return x * lst[0], lst


def p_torch_and_operators(x, lst):
    y = torch.stack(lst[:2]) * x
    return y.view(lst[2:]), lst + [1], 2 * lst, lst.copy(), lst == Items(lst), lst == 3


def p_ordering(x, lst):
    y = x * 2 if lst < [1, 3] else x
    return y, lst <= Items([1, 2]), lst > [0], [5] >= lst, sorted([lst, [0, 9]])


def p_inplace_add(x, lst):
    lst += [x]
    return x + 1, lst, next(reversed(lst)), [1, 2] != lst


def _made(cls, items, **attrs):
    def make():
        obj = cls(items)
        obj.__dict__.update(attrs)
        return torch.arange(3.0), obj

    return make


@pytest.mark.parametrize(
    "fn, make",
    [
        (p_read_items, _made(Items, [2, 3])),
        (p_read_items, _made(Items, [torch.ones(3), torch.full((3,), 2.0)])),
        (p_len_slice_in, _made(Items, [2, 3, 4])),
        (p_iterate, _made(Items, [1, torch.ones(3)])),
        (p_attrs_and_items, _made(Tagged, [1, 2, 1], tag=4)),
        (p_override_read, _made(Doubling, [2, 3])),
        (p_writes, _made(Items, [1, 2])),
        (p_writes, _made(Counted, [1, 2])),
        (p_torch_and_operators, _made(Items, [torch.ones(3), torch.zeros(3), 3, 2])),
        (p_inplace_add, _made(Items, [1, 2])),
        (p_ordering, _made(Items, [1, 2])),
    ],
    ids=[
        "ints",
        "tensors",
        "len-slice-in",
        "iterate",
        "attrs",
        "override-read",
        "writes",
        "override-store",
        "torch-and-operators",
        "inplace-add",
        "ordering",
    ],
)
def test_list_subclass_from_outside_is_read_in_the_graph(fn, make):
    """Was a break per read (`lst[0]`: "builtin method list.__getitem__", `len`, `in`; a
    `for` over it ran the whole frame eagerly); Dynamo captures each in one graph. Now
    list's methods resolved on the class act on the items, read and guarded as a plain
    list's; methods the class overrides are inlined."""
    counts = check(fn, make)
    assert (counts.graphs, counts.breaks) == (1, 0), ember.stats()["break_reasons"]


def test_list_subclass_guards_its_items():
    """A changed length or item recompiles (the guards read through list's own methods,
    not Doubling's `__getitem__`), with no break."""
    ember.reset()
    compiled = ember.compile(p_read_items)
    x = torch.arange(3.0)
    for items in ([2, 3], [2, 3, 4], [5, 3], [2, 3]):
        assert torch.equal(compiled(x, Doubling(items)), p_read_items(x, Doubling(items)))
        assert torch.equal(compiled(x, Items(items)), p_read_items(x, Items(items)))
    assert ember.stats()["graph_breaks"] == 0, ember.stats()["break_reasons"]


# --- nn.Buffer in a module made in forward --------------------------------------------------


class BufferAttrs(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Buffer(torch.arange(4.0))
        self.c = nn.Buffer(torch.ones(4), persistent=False)

    def forward(self, x):
        return x * self.b + self.c


def p_buffer_module(x):
    m = BufferAttrs()
    keys = sorted(m.state_dict().keys())
    return m(x.sin()), keys, sorted(m._non_persistent_buffers_set), isinstance(m.b, nn.Buffer)


def p_buffer_module_escapes(x):
    m = BufferAttrs()
    return m(x), m, m.b


def p_bare_buffer(x):
    t = nn.Buffer(x * 2, persistent=False)
    return t + 1, isinstance(t, nn.Buffer), t.persistent, isinstance(x, nn.Buffer)


@pytest.mark.parametrize("fn", [p_buffer_module, p_buffer_module_escapes, p_bare_buffer])
def test_nn_buffer_in_forward_is_register_buffer(fn):
    """`nn.Buffer(...)` made in the trace was a break ("constructing Buffer, a class with its
    own __new__"); Dynamo runs the frames with a module eagerly (4 breaks). Now its
    `__new__` is traced (a detached graph tensor marked `persistent` and `_is_buffer`), and
    `Module.__setattr__` registers it as `register_buffer` would: the same state_dict keys
    and non-persistent set as eager."""
    counts = check(fn, lambda: (torch.arange(4.0),))
    assert (counts.graphs, counts.breaks) == (1, 0), ember.stats()["break_reasons"]


def test_buffer_marks_survive_the_graph():
    """The escaping buffer is a graph output with eager's attributes set on it."""
    ember.reset()
    out, module, buf = ember.compile(p_buffer_module_escapes)(torch.arange(4.0))
    assert ember.stats()["graph_breaks"] == 0, ember.stats()["break_reasons"]
    _, expected, expected_buf = p_buffer_module_escapes(torch.arange(4.0))
    assert vars(buf) == vars(expected_buf) == {"persistent": True, "_is_buffer": True}
    assert module.b is buf and isinstance(buf, nn.Buffer)
    assert sorted(module.state_dict()) == sorted(expected.state_dict()) == ["b"]
    assert vars(module.c) == vars(expected.c) == {"persistent": False, "_is_buffer": True}
