"""Class statements inside a compiled function (issue 12). The class body runs in CPython
at a graph break, as under torch.compile, and the code after the statement is captured
again with the new class as an ordinary user class. Before, LOAD_BUILD_CLASS was an
instruction ember could not resume after, and the whole function ran eagerly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fidelity_harness import check, tensors

import ember
from ember.errors import Unsupported


def plain_class(x):
    y = x * 2

    class Scale:
        factor = 3

        def apply(self, t):
            return t * self.factor

    return Scale().apply(y).sin()


def class_closing_over_a_tensor(x):
    shift = x.cos()

    class Shifter:
        def __call__(self, t):
            return t + shift

    return Shifter()(x.sin())


def class_with_super_and_a_base(x):
    class Base:
        def __init__(self, k):
            self.k = k

    class Child(Base):
        def __init__(self, k):
            super().__init__(k + 1)

        def run(self, t):
            return t * self.k

    return Child(2).run(x) + 1


def dataclass_made_inside(x):
    @dataclasses.dataclass
    class Pair:
        a: torch.Tensor
        b: int = 2

    p = Pair(x.exp())
    return p.a * p.b, dataclasses.astuple(Pair(1, 3))


def class_in_a_loop(x):
    total = x
    for i in range(2):

        class Step:
            amount = i

        total = total + Step.amount
    return total.relu()


def module_subclass_without_parameters(x):
    class Twice(torch.nn.Module):
        def forward(self, t):
            return t * 2

    return Twice()(x).tanh()


def class_statement_inside_try(x):
    y = x + 1
    try:

        class Marker:
            pass

        y = y * 3
    except RuntimeError:
        y = y - 1
    return y, Marker.__name__


PROGRAMS = [
    plain_class,
    class_closing_over_a_tensor,
    class_with_super_and_a_base,
    dataclass_made_inside,
    class_in_a_loop,
    module_subclass_without_parameters,
    class_statement_inside_try,
]


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_class_statement_breaks_and_resumes(fn):
    counts = check(fn, tensors((4,)))
    assert counts.eager_frames == 0 and counts.breaks >= 1


def test_class_statement_reason_names_the_construct_and_line():
    ember.reset()
    compiled = ember.compile(plain_class)
    compiled(torch.randn(4))
    (reason,) = ember.stats()["break_reasons"]
    assert "class statement" in reason and "test_fidelity_classes.py" in reason


def test_class_statement_under_fullgraph_raises():
    compiled = ember.compile(plain_class, fullgraph=True)
    with pytest.raises(Unsupported, match="class statement"):
        compiled(torch.randn(4))


class _Sentinel:
    pass


SENTINEL = _Sentinel()
OTHER = _Sentinel()


@dataclasses.dataclass
class _Options:
    scale: object = SENTINEL


def default_is_the_sentinel(x):
    """An attribute of a constant (a dataclass field's default) is the very object a global
    names: `is` compared the two symbolic values instead of the objects, so it answered
    False, and dataclasses (which tests `f.kw_only is MISSING`) built a wrong `__init__`."""
    if dataclasses.fields(_Options)[0].default is SENTINEL:
        return x * 2
    return x * 3


def test_identity_of_an_attribute_of_a_constant_and_a_global():
    check(default_is_the_sentinel, tensors((4,)))


def test_identity_of_an_argument_and_a_constant_attribute_is_guarded():
    def pick(x, marker):
        return x * 2 if dataclasses.fields(_Options)[0].default is marker else x * 3

    ember.reset()
    compiled = ember.compile(pick)
    x = torch.randn(4)
    for marker in (SENTINEL, OTHER, SENTINEL, None):
        torch.testing.assert_close(compiled(x, marker), pick(x, marker))
