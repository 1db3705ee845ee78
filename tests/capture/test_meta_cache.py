"""The meta-kernel cache (ember/capture/values/meta.py) answers a repeated call with exactly
the metadata the kernel itself gives, and never answers calls whose result is tied to its
inputs (views, in-place ops, detach) or needs autograd history."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.capture.shapes import DynamicPolicy, SymbolicShapes
from ember.capture.sources import LocalSource
from ember.capture.values import meta
from ember.capture.values.meta import _tensor_facts, run_on_meta
from ember.meta import to_meta

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.uint8, torch.bool, torch.complex64]  # fmt: skip


@pytest.fixture(autouse=True)
def _empty_cache():
    meta._cache._entries.clear()
    yield
    meta._cache._entries.clear()


def _facts(value):
    if isinstance(value, torch.Tensor):
        return _tensor_facts(value)
    if isinstance(value, tuple | list):
        return type(value), [_facts(v) for v in value]
    return type(value), value


def _same_twice(kind, target, args, kwargs=None):
    """Kernel result, cached result and direct call agree on every fact (or all raise)."""
    kwargs = kwargs or {}
    try:
        want = getattr(args[0], target)(*args[1:], **kwargs) if kind == "call_method" else None
        if kind != "call_method":
            want = target(*args, **kwargs)
    except Exception as exc:
        with pytest.raises(type(exc)):
            run_on_meta(kind, target, args, kwargs)
        with pytest.raises(type(exc)):
            run_on_meta(kind, target, args, kwargs)
        return None
    first = run_on_meta(kind, target, args, kwargs)
    second = run_on_meta(kind, target, args, kwargs)
    assert _facts(first) == _facts(want)
    assert _facts(second) == _facts(want)
    return second


def _meta(shape, dtype, perm=None, step=1, requires_grad=False):
    """A meta tensor of `shape`, laid out in dimension order `perm`, every `step`-th element."""
    perm = perm or list(range(len(shape)))
    phys = [shape[p] * (step if i == len(perm) - 1 else 1) for i, p in enumerate(perm)]
    base = torch.empty(phys, dtype=dtype, device="meta")
    if step > 1 and shape:
        base = base[..., ::step]
    inverse = [perm.index(i) for i in range(len(shape))]
    t = base.permute(inverse)
    assert tuple(t.shape) == tuple(shape)
    if requires_grad:  # a leaf, as capture's examples of parameters are
        return to_meta(torch.empty_strided(t.shape, t.stride()).requires_grad_(True))
    return t


shapes = st.lists(st.sampled_from([1, 2, 3, 5]), min_size=0, max_size=4)


@st.composite
def tensor_pairs(draw):
    shape = draw(shapes)
    n = len(shape)
    # the other operand broadcasts: some leading dims dropped, some sizes set to 1
    drop = draw(st.integers(0, n))
    other = [1 if draw(st.booleans()) else s for s in shape[drop:]]
    out = []
    for s in (shape, other):
        perm = draw(st.permutations(list(range(len(s))))) if s else []
        step = draw(st.sampled_from([1, 1, 2]))
        out.append(_meta(s, draw(st.sampled_from(DTYPES)), perm, step))
    if draw(st.booleans()):
        out.reverse()
    return out


@settings(deadline=None, max_examples=150)
@given(tensor_pairs(), st.sampled_from([torch.add, torch.mul, torch.sub, torch.div,
       torch.maximum, torch.eq, torch.lt, torch.logical_and, torch.bitwise_and, torch.atan2,
       torch.remainder]), st.booleans())  # fmt: skip
def test_binary_ops_cached_result_matches_kernel(pair, op, no_grad):
    with torch.set_grad_enabled(not no_grad):
        _same_twice("call_function", op, pair)


@settings(deadline=None, max_examples=150)
@given(tensor_pairs(), st.sampled_from([2, 2.5, -0.0, True, 3 + 1j]))
def test_scalar_operands(pair, scalar):
    _same_twice("call_function", torch.mul, [pair[0], scalar])
    _same_twice("call_function", torch.add, [scalar, pair[0]])
    _same_twice("call_function", operator.truediv, [pair[0], scalar])


@settings(deadline=None, max_examples=150)
@given(tensor_pairs())
def test_unary_and_reductions(pair):
    x = pair[0]
    for op in (torch.neg, torch.sigmoid, torch.abs, torch.exp):
        _same_twice("call_function", op, [x])
    _same_twice("call_method", "sum", [x])
    if x.dim():
        _same_twice("call_method", "softmax", [x, -1])
        _same_twice("call_method", "mean", [x], {"dim": 0, "keepdim": True})
    _same_twice("call_method", "contiguous", [x])
    _same_twice("call_method", "clone", [x], {"memory_format": torch.preserve_format})
    _same_twice("call_method", "to", [x, torch.float16])
    _same_twice("call_method", "size", [x])
    _same_twice("call_method", "dim", [x])


def test_heavy_python_kernels_match():
    x = _meta([4, 8, 16], torch.float32)
    w, b = _meta([16], torch.float32), _meta([16], torch.float32)
    _same_twice("call_function", F.layer_norm, [x, (16,), w, b, 1e-5])
    m1, m2 = _meta([32, 16], torch.float32), _meta([16, 16], torch.float32, perm=[1, 0])
    _same_twice("call_function", torch.addmm, [b, m1, m2])
    q = _meta([2, 4, 8, 16], torch.float32)
    _same_twice("call_function", F.scaled_dot_product_attention, [q, q, q], {"is_causal": True})
    _same_twice("call_function", torch.arange, [5], {"device": torch.device("cpu")})
    _same_twice("call_function", torch.zeros, [(2, 3)], {"dtype": torch.float16})


def _transposed_double(x):
    return (x * 2).transpose(0, 1)


def test_a_view_of_a_fresh_result_is_cached_as_one():
    x = _meta([3, 5], torch.float32)
    second = _same_twice("call_function", _transposed_double, [x])
    assert second._is_view() and second._base is not x
    assert second.untyped_storage()._cdata != x.untyped_storage()._cdata
    (recipe,) = meta._cache._entries.values()
    assert recipe is not meta._NEVER  # the second result was rebuilt from the cache


def _symbolic_example(shape):
    """A meta tensor whose first size is a symbol of a new capture's ShapeEnv."""
    shapes = SymbolicShapes(DynamicPolicy(dims={LocalSource("x"): frozenset([0])}))
    example, _ = shapes.tensor_example(LocalSource("x"), torch.empty(shape))
    return shapes, example


def _expressions(t):
    return [s.node.expr if isinstance(s, torch.SymInt) else s for s in (*t.shape, *t.stride())]


def test_symbolic_calls_are_cached_per_capture_by_their_expressions():
    shapes, x = _symbolic_example([5, 8])
    w = _meta([8], torch.float32)
    first = run_on_meta("call_function", F.layer_norm, [x, (8,), w, w, 1e-5], {})
    guards = len(shapes.env.guards)
    second = run_on_meta("call_function", F.layer_norm, [x, (8,), w, w, 1e-5], {})
    assert len(meta._symbolic_caches[shapes.env]._entries) == 1
    assert _expressions(second) == _expressions(first)
    assert len(shapes.env.guards) == guards  # a hit records nothing new
    # another capture's symbols print alike (s0) but are its own: its own cache and results
    other, y = _symbolic_example([5, 8])
    result = run_on_meta("call_function", F.layer_norm, [y, (8,), w, w, 1e-5], {})
    assert result.shape[0].node.shape_env is other.env
    assert len(meta._symbolic_caches[other.env]._entries) == 1
    q = run_on_meta("call_method", "view", [x, 5, 2, 4], {})
    for _ in range(2):
        out = run_on_meta("call_function", F.scaled_dot_product_attention, [q, q, q], {})
        assert _expressions(out) == _expressions(q)


def test_views_and_inplace_results_stay_tied_to_their_inputs():
    for _ in range(2):
        x = torch.empty(4, 6, device="meta")
        v = run_on_meta("call_method", "view", [x, 24], {})
        assert v._is_view() and v._base is x
        t = run_on_meta("call_method", "transpose", [x, 0, 1], {})
        assert t._base is x
        d = run_on_meta("call_method", "detach", [x], {})
        assert d.untyped_storage()._cdata == x.untyped_storage()._cdata
        same = run_on_meta("call_method", "add_", [x, 1], {})
        assert same is x
        assert x._version == 1
    views = [r for k, r in meta._cache._entries.items() if k[1] in ("view", "transpose")]
    assert len(views) == 2 and meta._NEVER not in views  # the second round rebuilt them


def test_results_needing_autograd_are_not_cached():
    for _ in range(2):
        x = _meta([3, 4], torch.float32, requires_grad=True)
        y = run_on_meta("call_function", torch.mul, [x, 2.0], {})
        assert y.requires_grad and y.grad_fn is not None and not y.is_leaf
    with torch.no_grad():
        for _ in range(2):
            y = run_on_meta("call_function", torch.mul, [x, 2.0], {})
            assert not y.requires_grad and y.is_leaf


def test_key_tells_apart_types_signed_zero_and_default_dtype():
    x = _meta([3], torch.int64)
    assert run_on_meta("call_function", torch.mul, [x, 2], {}).dtype == torch.int64
    assert run_on_meta("call_function", torch.mul, [x, 2.0], {}).dtype == torch.float32
    assert run_on_meta("call_function", torch.mul, [x, True], {}).dtype == torch.int64
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert run_on_meta("call_function", torch.mul, [x, 2.0], {}).dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
    k1 = meta._key_of([0.0], meta._Inputs())
    k2 = meta._key_of([-0.0], meta._Inputs())
    assert k1 != k2


def test_errors_are_raised_every_time():
    a, b = _meta([3], torch.float32), _meta([4], torch.float32)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            run_on_meta("call_function", torch.add, [a, b], {})
