"""Mutated inputs' new values written straight into the inputs' storage by the kernels
(a batch norm's running statistics, its batch counter), instead of into fresh buffers that
the aot runtime copies back: where that is safe, and the same values and version counters
as eager either way."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember
from ember.backend.compile import record

IN_PLACE = "reuses the storage of in"  # the wrapper's comment where a buffer takes an input's


def _versions(m: nn.Module) -> dict[str, int]:
    return {k: v._version for k, v in m.named_buffers()}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval-under-grad"])
def test_batch_norm_statistics_are_written_in_place(train):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.BatchNorm2d(8))
    model.train(train)
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin)
    x = torch.randn(2, 3, 10, 10)
    before, before_eager = _versions(twin), _versions(model)
    with record() as arts:
        for _ in range(3):
            model(x).square().mean().backward()
            compiled(x).square().mean().backward()
    for (name, want), got in zip(model.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    # each buffer's version moved as eager's did (one bump per update, none in eval)
    moved = {k: v - before[k] for k, v in _versions(twin).items()}
    assert moved == {k: v - before_eager[k] for k, v in _versions(model).items()}, moved
    if train:
        forward = arts[0].wrapper.split("def call_boxed")[0]
        # 2 running means, 2 running variances, 2 batch counters: none copied back
        assert forward.count(IN_PLACE) == 6, forward


def test_a_new_value_also_returned_is_not_written_into_the_input():
    """`x.copy_(y); return y`: the returned y must stay a tensor of its own."""

    def f(x):
        y = x * 2 + 1
        x.copy_(y)
        return y

    x = torch.randn(16)
    want_x = x.clone()
    want = f(want_x)
    got = ember.compile(f)(x)
    torch.testing.assert_close((got, x), (want, want_x))
    x.add_(1)  # the result does not move with the input
    torch.testing.assert_close(got, want)
    assert got.data_ptr() != x.data_ptr()


def test_input_read_elsewhere_after_the_write_is_not_overwritten_early():
    """The new value of `buf` is computed in a kernel that other work reads `buf` after
    (a reversed read, a sum): writing it in place would change what they read."""

    def f(x, buf):
        new = buf * 0.9 + x * 0.1
        total = buf.flip(0).cumsum(0)  # an aten op reading the old buf
        buf.copy_(new)
        return total + buf.sum()

    for fn in (f,):
        x, buf = torch.randn(8), torch.randn(8)
        eb = buf.clone()
        want = fn(x, eb)
        got = ember.compile(fn)(x, buf)
        torch.testing.assert_close((got, buf), (want, eb))


def test_input_read_at_other_elements_in_the_writing_kernel():
    """buf[i] = buf[n - 1 - i] + 1: each element is read where another is written."""

    def f(buf):
        buf.copy_(buf.flip(0) + 1)
        return buf * 2

    buf = torch.arange(9.0)
    eb = buf.clone()
    want = f(eb)
    got = ember.compile(f)(buf)
    torch.testing.assert_close((got, buf), (want, eb))


def test_version_counter_moves_as_the_copy_would():
    """An input written in place is bumped once, as eager's in-place op bumps it, so a
    tensor outer autograd saved fails its version check as in eager."""

    def f(x, running):
        running.mul_(0.5).add_(x.detach().mean(0) * 0.5)
        return x * 2

    running = torch.zeros(4)
    want = torch.zeros(4)
    x = torch.randn(3, 4)
    f(x, want)
    with record() as arts:
        ember.compile(f)(x, running)
    torch.testing.assert_close(running, want)
    assert running._version == want._version
    assert IN_PLACE in arts[0].wrapper


def _compiled_node(out: torch.Tensor):
    """The autograd node of ember's compiled forward that `out` comes from."""
    todo, seen = [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith(("_CompiledFunction", "_Downstream")):
            return node
        todo.extend(n for n, _ in node.next_functions)
    raise AssertionError("no compiled node")


def _bn_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["ember", "aot_eager"])
@pytest.mark.parametrize("split", [False, True], ids=["one-node", "split-backward"])
def test_statistics_written_in_place_are_not_autograd_outputs(dtype, backend, split, monkeypatch):
    """A training step's running statistics written into the buffers by the compiled
    forward are not returned through the autograd node (aot/runtime.py `_returned`: autograd
    wraps each returned input anew); aot_eager's, new tensors, still are, and copied back.
    Values, gradients, buffers and version counters as eager's, over three steps, with the
    backward as one autograd node and as two."""
    if split:
        from ember.aot import schedule

        monkeypatch.setattr(schedule, "MIN_SPLIT_GAIN", -(1 << 60))
    torch.manual_seed(0)
    model = _bn_net().to(dtype).train()
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin, backend=backend)
    x = torch.randn(2, 3, 11, 11, dtype=dtype)
    before, before_eager = _versions(twin), _versions(model)
    # float32: the kernels sum in another order than eager's (gradients of ~10 summed
    # over three steps differ in the 6th digit)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    for _ in range(3):
        want, got = model(x), compiled(x)
        torch.testing.assert_close(got, want, **tol)
        w = torch.randn_like(want)
        (want * w).sum().backward()
        (got * w).sum().backward()
    for (name, want), got in zip(model.state_dict().items(), twin.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name, **tol)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **tol)
    moved = {k: v - before[k] for k, v in _versions(twin).items()}
    assert moved == {k: v - before_eager[k] for k, v in _versions(model).items()}, moved
    node = _compiled_node(compiled(x))
    # one user output; aot_eager's 6 new buffer values (2 means, 2 variances, 2 counters)
    # go through autograd as before
    assert len(node._input_metadata) == (1 if backend == "ember" else 7)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("size", [3, 5, 9, 10, 12, 19])
def test_channel_sums_over_short_rows(dtype, size):
    """Conv, training batch norm, ReLU: the backward sums the gradient per channel over rows
    shorter than a vector block, in a scalar tail loop that g++ 12.2 at -O3 vectorized wrongly
    in float64 on 8-wide rows (bias gradients off by ~20; size 10 gives 8x8 maps). The
    kernel now keeps that loop scalar (cpp.py `_inner`)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).to(dtype).train()
    twin = copy.deepcopy(model)
    x = torch.randn(2, 3, size, size, dtype=dtype)
    want, got = model(x), ember.compile(twin)(x)
    w = torch.randn_like(want)
    (want * w).sum().backward()
    (got * w).sum().backward()
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
    torch.testing.assert_close(got, want, **tol)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **tol)
