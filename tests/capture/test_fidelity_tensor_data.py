"""Issue 12: tensor data as Python values (`.item()`, `.tolist()`, `.numpy()`, `int(t)`,
`float(t)`, `bool(t)`, branching on a tensor) break the graph cleanly and resume after, with
both paths of a branch right; `len(t)` needs no data; in-place and `_foreach_*` ops are
captured, not reported as data-dependent. Compared with eager and with Dynamo's capture."""

from __future__ import annotations

import pytest
import torch
from fidelity_harness import check, tensors

import ember


def p_item(x):
    y = x.sin().sum()
    v = y.item()
    return x * v + 1


def p_tolist(x):
    y = x.cos()
    values = y.tolist()
    return x + len(values), [round(v, 4) for v in values]


def p_numpy(x):
    y = (x * 2).numpy()  # an array the code after the break holds and returns
    return x + 1, y


def p_int_float_bool(x):
    s = x.sum()
    n = int(s > 0)
    f = float(s)
    flag = bool(s > 100)
    return x * n + f, flag


def p_len_needs_no_data(x):
    return x * len(x), len(x[0])


def p_branch_on_tensor(x):
    y = x.sin()
    if y.sum() > 0:
        z = y * 2
    else:
        z = y - 2
    return z.cos()


def p_inplace_and_foreach(x):
    a, b, c = x.clone(), x * 2, x * 3
    a.addcmul_(b, c, value=0.5)
    torch._foreach_add_([a, b], [c, c])
    torch._foreach_mul_([a, b], 2.0)
    return a, b, torch._foreach_sqrt([a.abs(), b.abs()])


def p_tensor_type(x):
    return x.type(torch.float64), x.type(), x.to(torch.int32).type()


@pytest.mark.parametrize(
    "fn",
    [p_item, p_tolist, p_numpy, p_int_float_bool, p_branch_on_tensor],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_tensor_data_breaks_and_resumes(fn, sign):
    # Dynamo traces numpy code through torch._numpy, in the graph; ember breaks at
    # `.numpy()` and resumes (a known gap: numpy arrays are opaque values to ember)
    counts = check(fn, lambda: (tensors((3,))()[0].abs() * sign,), dynamo=fn is not p_numpy)
    assert counts.breaks >= 1 and counts.graphs >= 2


@pytest.mark.parametrize(
    "fn",
    [p_len_needs_no_data, p_inplace_and_foreach, p_tensor_type],
    ids=lambda f: f.__name__.removeprefix("p_"),
)
def test_captured_whole(fn):
    counts = check(fn, tensors((3, 4)))
    assert counts.breaks == 0 and counts.graphs == 1


def p_requires_grad_on_a_tensor_made_inside(x):
    xh = x.detach().requires_grad_(True)
    y = (xh**2).sum()
    return xh, y, xh.requires_grad, y.requires_grad


def p_backward_on_a_leaf_made_inside(x):
    z = x.clone().requires_grad_()
    (z * 2).sum().backward()
    return z.grad


@pytest.mark.parametrize(
    "fn", [p_requires_grad_on_a_tensor_made_inside, p_backward_on_a_leaf_made_inside]
)
def test_requires_grad_on_a_tensor_the_graph_made_breaks_there(fn):
    """The graph's outputs have no autograd history of their own, so `requires_grad_()` on
    a tensor made inside was lost through aot (the result and what was computed from it
    came back without grad; a gradient penalty's autograd.grad then failed). It breaks there
    and runs in Python, as under Dynamo."""
    check(fn, tensors((3,)), backend="aot_eager")
    result = ember.compile(fn, backend="aot_eager")(torch.ones(3))
    if fn is p_requires_grad_on_a_tensor_made_inside:
        assert result[0].is_leaf and result[0].requires_grad and result[1].grad_fn is not None
