"""Property test: random differentiable programs, gradients through the partitioned graphs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.aot import aot_eager

UNARY = [
    torch.sin,
    torch.exp,
    torch.tanh,
    torch.sigmoid,
    torch.relu,
    lambda a: a * a,
    lambda a: a / 2 + 1,
    lambda a: torch.log1p(a.abs()),
    F.softplus,
    F.gelu,
    lambda a: a.t() @ a,
    lambda a: a.softmax(-1),
    lambda a: a - a.mean(0, keepdim=True),
]
BINARY = [
    torch.add,
    torch.mul,
    torch.sub,
    torch.maximum,
    lambda a, b: torch.where(a > 0, a, b),
    lambda a, b: a @ b.t() @ a,
]

step = st.tuples(st.booleans(), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99))


class _Program(torch.nn.Module):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def forward(self, x, y):
        values = [x, y]
        for binary, op, i, j in self.steps:
            a, b = values[i % len(values)], values[j % len(values)]
            if binary:
                values.append(BINARY[op % len(BINARY)](a, b))
            else:
                values.append(UNARY[op % len(UNARY)](a))
        return values[-1], values[len(values) // 2] * 2


@settings(max_examples=25, deadline=None)
@given(st.lists(step, min_size=1, max_size=6), st.booleans())
def test_random_programs_gradients(steps, y_requires_grad):
    prog = _Program(steps)
    x = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 4, dtype=torch.float64, requires_grad=y_requires_grad)
    xs, ys = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_(y_requires_grad)
    ref = prog(x, y)
    out = aot_eager(prog, [xs, ys])(xs, ys)
    for r, o in zip(ref, out, strict=True):
        torch.testing.assert_close(o, r)
    loss_ref = sum((r * torch.linspace(-1, 1, r.numel()).view(r.shape)).sum() for r in ref)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in out)
    if not loss_ref.requires_grad:
        return
    loss_ref.backward()
    loss.backward()
    torch.testing.assert_close(xs.grad, x.grad)
    if y_requires_grad:
        if y.grad is None:
            assert ys.grad is None
        else:
            torch.testing.assert_close(ys.grad, y.grad)


@settings(max_examples=25, deadline=None)
@given(st.lists(step, min_size=1, max_size=6), st.booleans())
def test_random_programs_gradients_with_split_backward(steps, y_requires_grad):
    """The same programs with every splittable backward run as two autograd nodes."""
    from ember.aot import schedule

    saved = schedule.MIN_SPLIT_GAIN
    schedule.MIN_SPLIT_GAIN = -(1 << 60)
    try:
        test_random_programs_gradients.hypothesis.inner_test(steps, y_requires_grad)
    finally:
        schedule.MIN_SPLIT_GAIN = saved
