"""Property tests: small programs over random shapes, dtypes and layouts (contiguous,
transposed, sliced, expanded) match eager, and repeated calls with the same metadata
compile once."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember.testing import CompileCounter, assert_same


def _pointwise(x):
    return (x * 2 - 1).abs().sqrt() + x.sigmoid()


def _reductions(x):
    return x.sum(-1), x.mean(0), x.amax(), x.softmax(-1)


def _views(x):
    flat = x.reshape(-1)
    return flat[::2], x.transpose(0, -1).contiguous(), x.unsqueeze(0).expand(2, *x.shape)


def _shape_logic(x):
    out = x
    for d in range(x.ndim):
        if x.shape[d] > 1:
            out = out.narrow(d, 0, x.shape[d] - 1)
    return out * x.ndim, tuple(out.shape)


PROGRAMS = [_pointwise, _reductions, _views, _shape_logic]


def _make(shape, dtype, layout, seed):
    gen = torch.Generator().manual_seed(seed)
    if layout == "transposed" and len(shape) >= 2:
        return torch.randn(*reversed(shape), generator=gen, dtype=dtype).transpose(0, -1)
    if layout == "sliced":
        big = torch.randn(*[s * 2 for s in shape], generator=gen, dtype=dtype)
        return big[tuple(slice(None, None, 2) for _ in shape)]
    if layout == "expanded":
        return torch.randn(1, *shape[1:], generator=gen, dtype=dtype).expand(*shape)
    return torch.randn(*shape, generator=gen, dtype=dtype)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    layout=st.sampled_from(["contiguous", "transposed", "sliced", "expanded"]),
    seed=st.integers(0, 2**16),
    program=st.sampled_from(PROGRAMS),
)
def test_programs_match_eager_on_any_layout(shape, dtype, layout, seed, program):
    ember.reset()
    counter = CompileCounter()
    compiled = ember.compile(program, backend=counter, fullgraph=True)
    for i in range(3):  # new data, same metadata: one capture
        x = _make(shape, dtype, layout, seed + i)
        assert_same(compiled(x), program(x))
    assert counter.frame_count == 1
