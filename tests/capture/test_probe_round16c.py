"""Probe round 16, open items (branch cap16c): functools.singledispatch made in forward and
Python's global `random` in forward. Each program is compared with eager (values, outside
state) and with Dynamo's graph and break counts on the same function (fidelity_harness)."""

from __future__ import annotations

import functools

from fidelity_harness import check, tensors

# --- functools.singledispatch made in forward ----------------------------------------------

CALLS: list = []


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
    dispatcher and runs its calls, and the tensor code around them is captured."""
    counts = check(
        p_singledispatch_in_forward,
        tensors((3, 4)),
        state=lambda: list(CALLS),
        reset=CALLS.clear,
    )
    assert counts.graphs >= 1 and counts.ops >= 3


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
