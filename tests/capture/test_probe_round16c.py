"""Probe round 16, open items (branch cap16c): functools.singledispatch made in forward and
Python's global `random` in forward. Each program is compared with eager (values, outside
state) and with Dynamo's graph and break counts on the same function (fidelity_harness)."""

from __future__ import annotations

import functools
import random

import torch
from fidelity_harness import check, tensors

import ember

# --- functools.singledispatch made in forward ----------------------------------------------

CALLS: list = []


@functools.singledispatch
def scale(v):
    return v * 2


@scale.register
def _(v: int):
    return v + 1


def p_singledispatch_made_outside(x):
    return scale(x) + scale(3)


def p_singledispatch_in_forward(x):
    y = x + 1

    @functools.singledispatch
    def f(v):
        CALLS.append(("obj", v))
        return "obj"

    @f.register
    def _(v: int):
        CALLS.append(("int", v))
        return "int"

    return y * 2, f(1), f("s"), y - 3


def test_singledispatch_made_in_forward_does_not_run_the_frame_eagerly():
    """Was the whole frame run eagerly (break code cannot make a dispatcher again: its
    attributes refer back to it); Dynamo runs the frame eagerly. Now CPython makes the
    dispatcher, registers on it and looks implementations up (a break each), and the tensor
    code around them is captured (3 graphs, 4 breaks)."""
    counts = check(
        p_singledispatch_in_forward,
        tensors((3, 4)),
        state=lambda: list(CALLS),
        reset=CALLS.clear,
    )
    assert counts.graphs >= 1 and counts.ops >= 3
    # a dispatcher made outside: the lookup (`dispatch`) runs in Python, one break per call
    # as before, and the implementation it finds is still traced (Dynamo 2/1)
    assert check(p_singledispatch_made_outside, tensors((3, 4)), dynamo=False).ops == 2


def p_singledispatch_alive_past_a_break(x):
    @functools.singledispatch
    def f(v):
        return v

    @f.register
    def _(v: str):
        return v + "!"

    y = x.sum()
    print("at a break")  # f lives on past this break
    return y + f(2), f("a")


def test_singledispatch_alive_past_a_break():
    check(p_singledispatch_alive_past_a_break, tensors((3, 4)))


# --- Python's global random in forward -----------------------------------------------------


def random_state():
    return random.getstate()


def reseed():
    random.seed(5)  # randint(0, 10) draws twice inside (its first getrandbits is >= 11)


def p_python_random_draws(x):
    a = random.random()
    b = random.randint(0, 10)
    c = random.uniform(1, 2)
    return x * a, b, c, x + b


def p_python_random_seeded(x):
    random.seed(0)
    a = random.random()
    b = random.randint(0, 10)
    return x * a, b, random.uniform(1, 2), random.choice([1, 2, 3]), random.randrange(5)


def test_python_random_draws_break_once_per_call():
    """randint's and uniform's Python was traced into a break at each C draw inside (4
    breaks); now each call breaks once, where CPython draws. Dynamo takes 1 (it draws in the
    graph's prologue): still behind (open)."""
    counts = check(
        p_python_random_draws, tensors((3, 4)), state=random_state, reset=reseed, dynamo=False
    )
    assert counts.breaks == 3
    # repeated calls of the compiled function draw anew (no value is baked in)
    compiled = ember.compile(p_python_random_draws, backend="eager")
    x = torch.ones(2)
    random.seed(7)
    expected = [p_python_random_draws(x) for _ in range(3)]
    after = random.getstate()
    random.seed(7)
    actual = [compiled(x) for _ in range(3)]
    assert random.getstate() == after
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got[0], want[0])
        assert got[1:3] == want[1:3]
    assert len({r[1:3] for r in actual}) == 3


def test_python_random_seeded_draws_are_eagers():
    counts = check(
        p_python_random_seeded, tensors((3, 4)), state=random_state, reset=reseed, dynamo=False
    )
    assert counts.breaks == 6  # was 8: randint, choice and randrange were traced into draws


# --- a function made in forward that refers to itself --------------------------------------

SEEN: list = []


def p_function_refers_to_itself(x):
    y = x + 1

    def g(t):
        return t * 2

    g.me = g  # break code could not make g again with this cycle
    z = g.me(y)
    SEEN.append("between")
    print("a break while g is alive")
    return z + 1, g.me is g


def test_a_function_that_refers_to_itself_is_not_a_reason_to_run_the_frame_eagerly():
    """The whole frame ran eagerly (at the print's break, g could not be made again with
    its attribute pointing back at it). Now the attribute that makes the cycle is set in
    Python, at a break, and the tensor code around it is captured."""
    counts = check(
        p_function_refers_to_itself,
        tensors((3, 4)),
        state=lambda: list(SEEN),
        reset=SEEN.clear,
    )
    assert counts.ops >= 3


def p_function_refers_to_itself_through_a_dict(x):
    def g(t):
        return t - 1

    g.table = {"self": g, "n": 2}
    y = g.table["self"](x) * g.table["n"]
    print("a break while g is alive")
    return y + 1, g.table["self"] is g


def test_a_function_that_refers_to_itself_through_a_dict():
    assert check(p_function_refers_to_itself_through_a_dict, tensors((3, 4))).ops >= 2
