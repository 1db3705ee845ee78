"""The instruction forms that differ between Python versions, each in a program compiled
against eager: f-string conversions and specs (FORMAT_VALUE; 3.13's CONVERT_VALUE,
FORMAT_SIMPLE, FORMAT_WITH_SPEC), functions with closures, defaults and keyword defaults
(MAKE_FUNCTION's flags; 3.13's SET_FUNCTION_ATTRIBUTE), keyword calls (KW_NAMES; CALL_KW),
paired locals (3.13's LOAD_FAST_LOAD_FAST and kin), a comprehension whose variable shadows a
cell, `yield from`, `super()` methods, `*args`/`**kwargs` calls, comparisons feeding tests
(3.13's bool bit and TO_BOOL), and at graph breaks the same forms run again by CPython (a
tensor test, `not` of a tensor, a keyword call, a dict replayed through its `update`).
The counts are the same on every version."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.testing import CompileCounter, assert_same, check_against_eager

x0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
_scale = 2.5


def p_fstrings(x):
    text = f"{_scale!r:>{6}}|{_scale}|{_scale!s}|{_scale!a}|{_scale:.3f}|{'k'!r}"
    return x * len(text)


def p_closure_defaults(x):
    k = 2.0

    def inner(y, a=1.0, *, b=3.0):
        return y * k + a + b

    return inner(x) + inner(x, 2.0, b=4.0) + inner(a=0.5, y=x)


def p_paired_locals(x, y):
    a, b = x, y
    a, b = b, a
    c = a - b
    d = c
    return c * d + a


def p_comprehension_shadows_cell(x):
    y = x + 1
    read = lambda: y  # noqa: E731  (makes y a cell)
    doubled = [y * 2 for y in (x, x - 1)]
    return doubled[0] + doubled[1] + read()


def _delegate(items):
    yield from items
    return None


def p_yield_from(x):
    return sum(_delegate([x, x * 2, x * 3]))


class _Scaled(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


_module = _Scaled(3, 2)


def p_super_method(x):
    return _module(x)


def p_star_call(x, *args, **kwargs):
    return torch.add(x, *args, **kwargs)


def p_dict_union(x):
    # 3.13's collections.ChainMap iterates through `d |= mapping`
    d = {"a": x}
    alias = d
    d |= {"b": x + 1}
    merged = d | {"c": 2}
    return alias is d, list(alias), list(merged), merged["b"] * 2, merged is d


def p_comparisons_in_tests(x, n):
    if not n and x.dim() < 3 <= x.numel():
        return x + 1
    return x - 1 if n is None else x * n


CASES = [
    (p_fstrings, (x0,)),
    (p_closure_defaults, (x0,)),
    (p_paired_locals, (x0, x0 * 3)),
    (p_comprehension_shadows_cell, (x0,)),
    (p_yield_from, (x0,)),
    (p_super_method, (x0,)),
    (p_star_call, (x0, x0)),
    (p_dict_union, (x0,)),
    (p_comparisons_in_tests, (x0, 0)),
    (p_comparisons_in_tests, (x0, None)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f.__name__ for f, _ in CASES])
def test_form_captures_whole(fn, args):
    check_against_eager(fn, *args, frames=1)


def test_star_call_with_keywords():
    check_against_eager(p_star_call, x0, other=x0 * 2, alpha=0.5, frames=1)


def b_tensor_test(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def b_not_tensor(x):
    flag = not (x > 10).any()
    return x * 2 if flag else x


def b_keyword_call_break(x):
    y = x * 2
    print("y", y.shape[0], sep="|", end="!\n")
    return y + 1


_state = {"a": 1}


def b_dict_replay(x):
    _state["a"] = _state["a"] + 1
    _state["b"] = x.shape[0]
    print("dict", _state["a"])
    return x * _state["a"]


BREAKS = [
    (b_tensor_test, 2),
    (b_not_tensor, 2),
    (b_keyword_call_break, 2),
    (b_dict_replay, 2),
]


def _runs(fn, capsys) -> tuple[list, str, dict]:
    """Two calls from the same starting state: results, what they printed, the state."""
    _state.clear()
    _state.update(a=1)
    results = [fn(x0.clone()) for _ in range(2)]
    return results, capsys.readouterr().out, dict(_state)


@pytest.mark.parametrize("fn,graphs", BREAKS, ids=[f.__name__ for f, _ in BREAKS])
def test_form_at_a_break(fn, graphs, capsys):
    """Graphs over two calls, with at least the ops torch.compile's graphs have; the break's
    replacement code runs the instruction in CPython (3.13: TO_BOOL before a test or `not`,
    CALL_KW)."""
    expected = _runs(fn, capsys)
    counter = CompileCounter()
    actual = _runs(ember.compile(fn, backend=counter), capsys)
    assert_same(actual[0], expected[0])
    assert actual[1:] == expected[1:]
    assert counter.frame_count == graphs
    torch._dynamo.reset()
    dynamo = CompileCounter()
    assert_same(_runs(torch.compile(fn, backend=dynamo), capsys)[0], expected[0])
    torch._dynamo.reset()
    assert counter.op_count >= dynamo.op_count
