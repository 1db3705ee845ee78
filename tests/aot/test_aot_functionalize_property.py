"""Property test: random programs of views and in-place ops, functionalized vs eager."""

from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ember.aot import aot_eager
from ember.aot.program import trace_inference
from ember.aot.trace import check_functional

# (name, applies to, view) over tensors of at least 2 elements per dim
VIEWS = [
    ("t", lambda t: t.dim() == 2, lambda t: t.t()),
    ("slice", lambda t: t.shape[0] >= 2, lambda t: t[1:]),
    ("step", lambda t: t.dim() == 2 and t.shape[1] >= 2, lambda t: t[:, ::2]),
    ("select", lambda t: t.dim() == 2, lambda t: t[0]),
    ("diag", lambda t: t.dim() == 2, lambda t: t.diagonal()),
    ("split", lambda t: t.shape[0] >= 2, lambda t: t.split(1)[-1]),
    ("unsq", lambda t: t.dim() == 1, lambda t: t.unsqueeze(0)),
    ("flat", lambda t: t.is_contiguous(), lambda t: t.view(-1)),
    ("narrow", lambda t: t.dim() == 2 and t.shape[1] >= 3, lambda t: t.narrow(1, 1, 2)),
]
MUTATIONS = [
    lambda t, y: t.add_(1.5),
    lambda t, y: t.mul_(-2),
    lambda t, y: t.zero_(),
    lambda t, y: t.copy_(y.flatten()[: t.numel()].view(t.shape)),
    lambda t, y: t.clamp_(min=0.1),
    lambda t, y: t.fill_(3.0),
]


class _Module(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x, y):
        return self.f(x, y)


step = st.tuples(st.integers(0, 99), st.integers(0, len(VIEWS) - 1), st.booleans())


def _program(steps, mutate_input):
    def f(x, y):
        base = x if mutate_input else x * 1.0
        live = [base]
        for pick, view_i, mutate in steps:
            t = live[pick % len(live)]
            if mutate:
                MUTATIONS[view_i % len(MUTATIONS)](t, y)
            else:
                name, ok, view = VIEWS[view_i]
                if ok(t):
                    live.append(view(t))
        return tuple(t * 1.0 for t in live) + (live[-1],)

    return f


def _layout(t: torch.Tensor) -> list[tuple[int, int]]:
    """Strides that matter: a size-1 dimension's stride never changes which element is read."""
    return [(n, s) for n, s in zip(t.shape, t.stride(), strict=True) if n != 1]


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=1, max_size=8), st.booleans())
@example([(0, 0, False), (1, 5, False), (26, 0, True), (26, 4, True)], False)  # found in CI
def test_random_view_mutation_programs(steps, mutate_input):
    f = _program(steps, mutate_input)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
    gm = _Module(f)  # the tracer runs any module; shapes decide the views, so no fx proxy
    check_functional(trace_inference(gm, [x.clone(), y]).gm.graph)
    x_ref, x_aot = x.clone(), x.clone()
    ref = f(x_ref, y)
    out = aot_eager(gm, [x.clone(), y])(x_aot, y)
    for r, o in zip(ref, out, strict=True):
        torch.testing.assert_close(o, r)
        assert _layout(o) == _layout(r)
    torch.testing.assert_close(x_aot, x_ref)
