"""Python idioms around graph breaks: comprehensions and generator expressions that print,
`**kwargs` into a helper that breaks, local closures, while/else, f-strings, chained
comparisons and the walrus on tensors, star-unpacking, grad-mode blocks inside loops, and
`.item()`/`.tolist()` feeding Python builtins. Differential against eager, run twice, with
graph, break and eager-frame counts (3.11 compiles comprehensions as nested functions, 3.12
inlines them, so a few counts depend on the version)."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from break_harness import Case, check_case, check_counts, ids

PY312 = sys.version_info >= (3, 12)
x0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))


def one():
    return (x0.clone(),)


def leaf():
    return (x0.clone().requires_grad_(),)


def _g_state():
    return G


def _g_reset():
    global G
    G = 0


def inner_kw(y, *, scale=1.0):
    print("kw", scale)
    return y * scale


def star_kwargs_to_breaking_helper(x):
    return inner_kw(x, **{"scale": 2.0})


def _forwarding(func):
    """A `functools.wraps` decorator with `*args, **kwargs` (transformers' pattern): its
    arguments must be bound to the wrapper's signature, not to `__wrapped__`'s."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        for name in ("scale", "shift"):
            print(name)
            if name in kwargs:
                kwargs[name] = kwargs[name] * 2
        return func(*args, **kwargs)

    return wrapper


@_forwarding
def _scaled(y, scale=1.0, shift=0.0):
    return y * scale + shift


def wraps_decorated_call_with_print(x):
    return _scaled(x, scale=3.0) + 1


def listcomp_with_print(x):
    return torch.stack([x[i] * (print(i) or 1) for i in range(3)])


def genexpr_with_print(x):
    return x * sum(print(i) or i for i in range(3))


def while_else_with_print(x):
    i = 0
    while i < 2:
        x = x + 1
        print(i)
        i += 1
    else:
        x = x * 2
    return x


def local_closure_helper_breaks(x):
    def helper(y):
        print("nested")
        return y + x

    return helper(x * 2)


def dictcomp_with_print(x):
    return {k: x * (print(k) or 1) for k in "ab"}


def fstring_with_print(x):
    return x * len(f"{print('f') or 1}{x.shape}")


def chained_comparison_on_tensor(x):
    if 0 < x.abs().sum() < 100:
        return x * 2
    return x


def walrus_in_branch(x):
    if (s := x.sum()) > 0:
        return x + s
    return x - s


G = 0


def bump():
    global G
    G += 1


def global_bumped_by_helper_then_print(x):
    bump()
    print("g")
    return x * G


def per_row_branch_in_loop(x):
    out = []
    for i, row in enumerate(x):
        if row.sum() > 0:
            out.append(row * i)
        else:
            out.append(-row)
    return torch.stack(out)


def star_unpack_with_print(x):
    a, *rest = [x, x * 2, print("u") or x * 3]
    return a + sum(rest)


def no_grad_block_in_loop(x):
    y = x
    for _ in range(2):
        with torch.no_grad():
            y = y * 2
            print("ng")
        y = y + x
    return y


def dict_call_with_print(x):
    d = dict(a=x, b=print("d"))
    return d["a"] if d["b"] is None else x


def max_of_item(x):
    return max(x.sum().item(), 0.5) * x


def bool_and_item(x):
    s = x.sum()
    return x * 2 if bool(s > 0) and s.item() < 100 else x


def sorted_tolist(x):
    vals = sorted(x[0].tolist())
    return x + vals[0]


def tensor_of_tolist(x):
    return torch.tensor(x.tolist()) + x


def append_print_result(x):
    lst = [1, 2]
    lst.append(print("l") or 3)
    return x * sum(lst)


def sorted_with_key_lambda(x):
    rows = list(x)
    k = 2.0
    best = sorted(rows, key=lambda r: (r * k).sum().item())
    return torch.stack(best) + 1


def max_with_key_closure(x):
    offset = 0.5

    def score(r):
        return float((r + offset).abs().sum())

    return max(list(x), key=score) * 2


def map_with_lambda_then_print(x):
    scaled = list(map(lambda r: r * 3, x))
    print(len(scaled))
    return torch.stack(scaled)


def local_helper_called_twice(x):
    def step(y):
        print("step")
        return y * 2

    return step(step(x)) + 1


CASES = [
    Case(star_kwargs_to_breaking_helper, one, 1, 1, _g_state, _g_reset, eager=0),
    Case(wraps_decorated_call_with_print, one, 2, 2, _g_state, _g_reset, eager=0),
    Case(
        listcomp_with_print,
        one,
        # 3.11: the comprehension's frame takes each break (its resume function gets the
        # cell of `x`); Dynamo 1 graph, 3 breaks and the comprehension run eagerly
        *((4, 3) if PY312 else (5, 3)),
        _g_state,
        _g_reset,
        eager=0,
    ),
    # the graph ends where the generator is made; CPython sums it, `x * s` is captured
    # (Dynamo: 0 graphs, the frame run eagerly, as ember did before)
    Case(genexpr_with_print, one, 1, 2, _g_state, _g_reset, eager=0),
    Case(while_else_with_print, one, 3, 2, _g_state, _g_reset, eager=0),
    # the break is taken in the helper's frame (Dynamo: 2 graphs, 2 breaks)
    Case(local_closure_helper_breaks, one, 2, 1, _g_state, _g_reset, eager=0),
    Case(
        dictcomp_with_print,
        one,
        # 3.11: the comprehension's frame takes the breaks (Dynamo: 0 graphs, 3 breaks, the
        # comprehension run eagerly)
        2,
        2,
        _g_state,
        _g_reset,
        eager=0,
    ),
    Case(fstring_with_print, one, 1, 1, _g_state, _g_reset, eager=0),
    Case(chained_comparison_on_tensor, one, 3, 2, _g_state, _g_reset, eager=0),
    Case(walrus_in_branch, one, 2, 1, _g_state, _g_reset, eager=0),
    Case(global_bumped_by_helper_then_print, one, 1, 1, _g_state, _g_reset, eager=0),
    Case(per_row_branch_in_loop, one, 5, 4, _g_state, _g_reset, eager=0),
    Case(star_unpack_with_print, one, 2, 1, _g_state, _g_reset, eager=0),
    Case(no_grad_block_in_loop, leaf, 3, 2, _g_state, _g_reset, eager=0),
    Case(dict_call_with_print, one, 0, 1, _g_state, _g_reset, eager=0),
    Case(max_of_item, one, 2, 1, _g_state, _g_reset, eager=0),
    Case(bool_and_item, one, 1, 1, _g_state, _g_reset, eager=0),
    Case(sorted_tolist, one, 2, 1, _g_state, _g_reset, eager=0),
    Case(tensor_of_tolist, one, 1, 1, _g_state, _g_reset, eager=0),
    Case(append_print_result, one, 1, 1, _g_state, _g_reset, eager=0),
    Case(sorted_with_key_lambda, one, 2, 1, _g_state, _g_reset),
    Case(max_with_key_closure, one, 2, 1, _g_state, _g_reset),
    Case(map_with_lambda_then_print, one, 2, 1, _g_state, _g_reset),
    # the outer step() waits on the stack while the inner one breaks: a function made during
    # capture that is still needed after the break is not rebuilt, the frame runs eagerly
    # the helper is made again at the break (Dynamo: 2 graphs, 3 breaks)
    Case(local_helper_called_twice, one, 2, 2, _g_state, _g_reset, eager=0),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_idiom(case):
    check_counts(case, check_case(case))
