"""What breaks and what is on the stack when it does: prints, `.item()`/`.tolist()`, numpy,
data-dependent branches, calls with NULLs, keyword arguments, `*args`/`**kwargs` and half-built
containers on the stack, breaks in loops and nested breaks (a resume function that breaks
again). Each program runs eagerly and compiled twice; graphs and breaks are counted."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from break_harness import Case, check_case, check_counts

PY312 = sys.version_info >= (3, 12)  # 3.12 repeats a while loop's test at its bottom
x0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
y0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))


def t() -> torch.Tensor:
    return x0.clone()


def one():
    return (t(),)


def pos():
    return (x0.abs() + 0.1,)


def neg():
    return (-x0.abs() - 0.1,)


def two():
    return (t(), y0.clone())


def foo(a, b, k=1):
    return a * k if b is None else a + b * k


# ---------------------------------------------------------------- kinds of breaks
def print_mid(x):
    y = x * 2
    print("mid")
    return y + 1


def print_tensor(x):
    y = x.sum(0)
    print(y.shape)
    return y


def print_first(x):
    print("first")
    return x.exp()


def print_last(x):
    y = x.exp()
    print("last")
    return y


def item_scale(x):
    s = x.abs().max().item()
    return x / s


def item_in_expression(x):
    return x * (x.sum().item() + 1.0)


def tolist_len(x):
    rows = x.tolist()
    return x * len(rows)


def tolist_values(x):
    v = x[0].tolist()
    return x + v[0]


def numpy_roundtrip(x):
    y = x + 1
    z = torch.from_numpy(np.ascontiguousarray(y.numpy() * 2))
    return z + y


def numpy_sum(x):
    y = x.abs()
    total = float(np.sum(y.numpy()))
    return y / total


def int_of_tensor(x):
    n = int(x.sum() > 0)
    return x * n


def float_of_tensor(x):
    return x / (float(x.abs().sum()) + 1)


def bool_of_tensor(x):
    flag = bool((x > 0).any())
    return x + 1 if flag else x - 1


def branch_on_sum(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def branch_then_more_work(x):
    y = x.sin()
    if (y > 0).all():
        y = y * 2
    else:
        y = y * 3
    return y.cos()


def branch_on_item(x):
    if x.max().item() > 0.5:
        return x * 2
    return x


def ternary_on_tensor(x):
    return x * 2 if x.mean() > 0 else x * 3


def and_on_tensors(x):
    if (x.sum() > -100) and (x.mean() < 100):
        return x + 1
    return x


def not_tensor_branch(x):
    if not (x > 0).all():
        return x.abs()
    return x


def while_tensor_condition(x):
    while x.abs().sum() > 1:
        x = x / 2
    return x


def nonzero_count(x):
    idx = torch.nonzero(x > 0)
    return x.sum() + idx.shape[0]


def masked_select(x):
    return x[x > 0].sum() + x.sum()


# ---------------------------------------------------------------- what is on the stack
def null_and_kwargs(x):
    return foo(x, print("b"), k=3)


def print_as_middle_arg(x):
    return torch.add(x, print("arg") or 1, alpha=2)


def print_in_method_args(x):
    return x.add(x.mul(2), alpha=print("a") or 1)


def print_in_list(x):
    parts = [x, print("list") or x * 2, x + 1]
    return torch.cat(parts)


def print_in_tuple_return(x):
    return x + 1, print("t"), x * 2


def print_in_dict(x):
    d = {"a": x, "b": print("d"), "c": x.sum()}
    return d


def print_in_binop(x):
    return x * 2 + (print("op") or 1)


def print_with_kwargs(x):
    print("k", x.shape, sep="|", end="!\n")
    return x.relu()


def print_star_args(x):
    args = ("s", 1, 2)
    print(*args)
    return x.neg()


def print_star_kwargs(x):
    kw = {"sep": "-", "end": "\n"}
    print("a", "b", **kw)
    return x + 3


def call_ex_user_fn(x):
    args = (x, None)
    kw = {"k": 4}
    y = foo(*args, **kw)
    print("after")
    return y


def nested_call_args(x):
    return foo(foo(x, None, k=2), print("inner") or x, k=foo(1, None, k=5))


def method_on_list_break(x):
    out = []
    out.append(x.sum().item())
    return x * out[0]


def break_in_fstring(x):
    s = f"{x.sum().item():.2f}"
    return x * len(s)


def break_inside_comprehension_arg(x):
    ys = [x * i for i in range(3)]
    print(len(ys))
    return torch.stack(ys).sum(0)


# ---------------------------------------------------------------- loops
def for_range_print(x):
    for i in range(3):
        x = x + i
        print(i)
    return x


def for_list_print(x):
    for w in [1.0, 2.0, 3.0]:
        x = x * w
        print(w)
    return x


def for_enumerate_print(x):
    total = x
    for i, w in enumerate([0.5, 0.25]):
        total = total + w * i
        print(i, w)
    return total


def for_zip_item(x, y):
    acc = 0.0
    for a, b in zip(x, y):
        acc += (a * b).sum().item()
    return x * acc


def for_branch_inside(x):
    out = x
    for _ in range(3):
        out = out * 2
        if out.sum() > 100:
            out = out / 100
    return out


def for_nested_loops_print(x):
    for i in range(2):
        for j in range(2):
            x = x + i * j
            print(i, j)
    return x


def for_over_tensor_rows(x):
    acc = torch.zeros(3)
    for row in x:
        acc = acc + row
        print("row")
    return acc


def for_break_statement(x):
    for _ in range(6):
        x = x * 1.5
        if x.sum() > 10:
            break
    return x


def for_continue_statement(x):
    for i in range(4):
        if (x[i] > 0).all():
            continue
        x = x + 1
    return x


def while_counter_print(x):
    i = 0
    while i < 3:
        x = x.cos()
        print(i)
        i += 1
    return x


def while_item_loop(x):
    steps = 0
    while x.abs().max().item() > 0.5 and steps < 10:
        x = x * 0.5
        steps += 1
    return x, steps


def for_dict_items_print(x):
    d = {"a": 1.0, "b": 2.0}
    for k, v in d.items():
        x = x + v
        print(k)
    return x


def loop_appends_then_print(x, out):
    for i in range(3):
        out.append(x * i)
        print(i)
    return torch.stack(out)


# ---------------------------------------------------------------- nested breaks
def three_prints(x):
    a = x + 1
    print(1)
    b = a * 2
    print(2)
    c = b - 3
    print(3)
    return c


def print_then_branch(x):
    y = x * 2
    print("p")
    if y.sum() > 0:
        y = y + 1
    return y


def branch_then_print_both_sides(x):
    if x.sum() > 0:
        print("pos")
        return x + 1
    print("neg")
    return x - 1


def item_then_tolist(x):
    a = x.sum().item()
    b = x[0].tolist()
    return x * a + b[0]


def nested_branches(x):
    if x.sum() > 0:
        if x.max() > 1:
            return x * 2
        return x * 3
    return x * 4


def return_locals_after_breaks(x):
    a = x + 1
    print("x")
    b = a + 1
    print("y")
    return a, b, x


def keep_many_locals(x, y):
    a, b, c = x + 1, y * 2, x - y
    s = "text"
    n = 3
    print(s)
    return a + b + c + n


CASES = [
    Case(print_mid, one, 2, 1),
    Case(print_tensor, one, 1, 1),
    Case(print_first, one, 1, 1),
    Case(print_last, one, 1, 1),
    Case(item_scale, one, 2, 1),
    Case(item_in_expression, one, 2, 1),
    Case(tolist_len, one, 1, 1),
    Case(tolist_values, one, 2, 1),
    Case(numpy_roundtrip, one, 2, 4),  # arrays are held opaquely: z + y is captured too
    Case(numpy_sum, one, 2, 2),
    Case(int_of_tensor, one, 2, 1),
    Case(float_of_tensor, one, 2, 1),
    Case(bool_of_tensor, one, 2, 1),
    Case(branch_on_sum, pos, 2, 1),
    Case(branch_on_sum, neg, 2, 1),
    Case(branch_then_more_work, pos, 2, 1),
    Case(branch_then_more_work, neg, 2, 1),
    Case(branch_on_item, one, 2, 1),
    Case(ternary_on_tensor, pos, 2, 1),
    Case(ternary_on_tensor, neg, 2, 1),
    Case(and_on_tensors, one, 3, 2),
    Case(not_tensor_branch, one, 2, 1),
    Case(while_tensor_condition, one, 3 if PY312 else 2, 3 if PY312 else 2),
    Case(nonzero_count, one, 2, 1),
    Case(masked_select, one, 2, 1),
    Case(null_and_kwargs, one, 1, 1),
    Case(print_as_middle_arg, one, 1, 1),
    Case(print_in_method_args, one, 2, 1),
    Case(print_in_list, one, 1, 1),
    Case(print_in_tuple_return, one, 2, 1),
    Case(print_in_dict, one, 1, 1),
    Case(print_in_binop, one, 2, 1),
    Case(print_with_kwargs, one, 1, 1),
    Case(print_star_args, one, 1, 1),
    Case(print_star_kwargs, one, 1, 1),
    Case(call_ex_user_fn, one, 1, 1),
    Case(nested_call_args, one, 2, 1),
    Case(method_on_list_break, one, 2, 1),
    Case(break_in_fstring, one, 2, 1),
    Case(break_inside_comprehension_arg, one, 2, 1),
    Case(for_range_print, one, 3, 3),
    Case(for_list_print, one, 3, 3),
    Case(for_enumerate_print, one, 2, 2),
    Case(for_zip_item, two, 5, 4),
    Case(for_branch_inside, one, 3, 3),
    Case(for_nested_loops_print, one, 4, 4),
    Case(for_over_tensor_rows, one, 4, 4),
    Case(for_break_statement, one, 6, 6),
    Case(for_continue_statement, one, 4, 4),
    Case(while_counter_print, one, 3, 3),
    Case(while_item_loop, one, 4, 4),
    Case(for_dict_items_print, one, 2, 2),
    Case(loop_appends_then_print, lambda: (t(), []), 4, 3),
    Case(three_prints, one, 3, 3),
    Case(print_then_branch, pos, 3, 2),
    Case(print_then_branch, neg, 2, 2),
    Case(branch_then_print_both_sides, pos, 2, 2),
    Case(branch_then_print_both_sides, neg, 2, 2),
    Case(item_then_tolist, one, 3, 2),
    Case(nested_branches, pos, 3, 2),
    Case(nested_branches, neg, 2, 1),
    Case(return_locals_after_breaks, one, 2, 2),
    Case(keep_many_locals, two, 2, 1),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.id}-{c.make.__name__}" for c in CASES])
def test_break_program(case):
    record = check_case(case)
    check_counts(case, record)
