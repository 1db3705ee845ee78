"""`match` statements (issue 12, item 8): every pattern kind is captured in the graph, as
Dynamo captures it, with eager's choice of case and eager's bindings; a case guarded by a
tensor's value breaks the graph like an `if` on it, and both paths are right."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fidelity_harness import check, tensors


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Plain:
    """No __match_args__: only keyword sub-patterns apply."""

    def __init__(self, scale):
        self.scale = scale


def describe(value, t):
    match value:
        case None:
            return t * 0
        case 0 | 1:
            return t + value
        case [a, b]:
            return t * a + b
        case [a, *rest]:
            return t * a + len(rest)
        case {"scale": s, "bias": b, **others}:
            return t * s + b + len(others)
        case {"scale": s}:
            return t * s
        case Point(x=0, y=y):
            return t + y
        case Point(x, y) if x > y:
            return t * x - y
        case Point():
            return t - 1
        case Plain(scale=s):
            return t / s
        case int(n) | float(n):
            return t * n
        case str() as name:
            return t + len(name)
        case (t2,) if isinstance(t2, torch.Tensor):
            return t + t2
        case _:
            return t * 2


CASES = {
    "none": None,
    "literal": 1,
    "pair": [2.0, 3.0],
    "star": (2.0, 1, 2, 3),
    "mapping_rest": {"scale": 2.0, "bias": 1.0, "z": 0, "w": 1},
    "mapping": {"scale": 3.0},
    "class_keyword": Point(0, 5.0),
    "class_positional_guarded": Point(4.0, 1.0),
    "class_guard_fails": Point(1.0, 4.0),
    "class_no_match_args": Plain(4.0),
    "self_matching_int": 7,
    "self_matching_float": 2.5,
    "capture_as": "abcd",
    "tuple_of_tensor": (torch.ones(3),),
    "wildcard": object,
}


@pytest.mark.parametrize("subject", CASES.values(), ids=CASES.keys())
def test_each_pattern_kind_is_captured_as_eager_picks_it(subject):
    counts = check(lambda t: describe(subject, t), tensors((3,)))
    assert counts.graphs == 1 and counts.breaks == 0


def branch_on_values(t):
    match t.sum().item() > 0:
        case True:
            return t + 1
        case False:
            return t - 1


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_a_case_on_tensor_data_breaks_and_both_paths_are_right(sign):
    check(branch_on_values, lambda: (torch.full((3,), sign),))


def test_a_class_pattern_with_too_many_positions_raises_as_eager():
    """Point has two __match_args__: three positional sub-patterns are a TypeError, eagerly
    and compiled (where the trace ends in a break with the reason, the frame runs as written)."""

    def too_many(p, t):
        match p:
            case Point(a, b, c):
                return t + a + b + c
        return t

    import ember

    compiled = ember.compile(too_many, backend="eager")
    for fn in (too_many, compiled):
        with pytest.raises(TypeError, match="accepts 2 positional sub-patterns"):
            fn(Point(1.0, 2.0), torch.ones(2))
