"""Convolution nets against eager: batch norm and pooling lowered, in eval and training.

Each test compiles through `torch.compile(backend=ember.backend)` and compares values,
gradients and the BatchNorm buffers (running statistics, batch counter) after training steps
with eager's, and asserts the normalization and pooling ops are no longer aten fallbacks.
"""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember import config
from ember.backend.compile import record, stats
from tests.backend.helpers import compile_ember, extern_ops

TOL = {
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
}


class Block(nn.Module):
    """conv-BN-ReLU, conv-BN plus the shortcut, ReLU (a ResNet basic block)."""

    def __init__(self, c: int = 8, affine: bool = True, stats: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c, affine=affine, track_running_stats=stats)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c, affine=affine, track_running_stats=stats)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


# gathers slower than eager's scatter kernels (ember/backend/lowering/pooling.py)
NOT_LOWERED = ("max_pool2d_with_indices_backward", "avg_pool2d_backward", "group_norm_backward")


def _fallbacks(arts) -> list[str]:
    """Normalization and pooling ops the wrappers still call as aten ops."""
    names = ("batch_norm", "group_norm", "pool")
    ops = [op for art in arts for op in extern_ops(art) if any(n in op for n in names)]
    return [op for op in ops if not any(n in op for n in NOT_LOWERED)]


def _close(got, want, dtype):
    """Within the dtype's tolerance, absolute errors relative to the tensor's scale."""
    tol = dict(TOL[dtype])
    if isinstance(want, torch.Tensor) and want.numel():
        tol["atol"] *= max(1.0, want.detach().abs().max().item())
    torch.testing.assert_close(got, want, **tol)


def _no_worse_than_eager(got, want, exact, dtype):
    """Within the dtype's tolerance of eager; or, where float32 rounding over a long
    reduction leaves eager itself that far from the float64 result (the summation order
    differs with the vector width: SSE2 sums 4 lanes, AVX2 8), at most twice eager's own
    error from it."""
    try:
        _close(got, want, dtype)
        return
    except AssertionError:
        if exact is None:
            raise
    eager_error = (want.double() - exact).abs().max().item()
    error = (got.double() - exact).abs().max().item()
    assert error <= 2 * eager_error + TOL[dtype]["atol"], (error, eager_error)


def _train_steps(model, x, steps: int = 2, dtype=torch.float32, lowered: bool = True):
    """Run `steps` SGD steps on eager and compiled copies (and, in float32, a float64 copy as
    the exact reference); compare losses, gradients, parameters and buffers after each;
    return the compiled artifacts."""
    twin = copy.deepcopy(model)
    exact = copy.deepcopy(model).double() if dtype == torch.float32 else None
    compiled = compile_ember(twin)
    runs = [(model, model), (twin, compiled)] + ([(exact, exact)] if exact is not None else [])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m, _ in runs]
    before = stats["graph_fallbacks"]
    with record() as arts:
        for _ in range(steps):
            losses = []
            for (m, run), opt in zip(runs, opts, strict=True):
                out = run(x.double() if m is exact else x)
                loss = out.float().square().mean() if m is not exact else out.square().mean()
                loss.backward()
                losses.append(out)
                grads = [p.grad for p in m.parameters()]
                opt.step()
                opt.zero_grad()
                m._grads = grads
            _close(losses[1], losses[0], dtype)
            references = exact._grads if exact is not None else [None] * len(model._grads)
            for a, b, r in zip(model._grads, twin._grads, references, strict=True):
                _no_worse_than_eager(b, a, r, dtype)
                assert b.stride() == a.stride()
            states = [m.state_dict().values() for m in (twin, exact or twin)]
            for (name, a), b, r in zip(model.state_dict().items(), *states, strict=True):
                assert a.dtype == b.dtype, name
                _no_worse_than_eager(b, a, r if exact is not None else None, dtype)
    assert stats["graph_fallbacks"] == before
    assert not lowered or not _fallbacks(arts), _fallbacks(arts)
    return arts


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_batch_norm_block_training_steps(dtype):
    torch.manual_seed(0)
    model = Block().to(dtype)
    _train_steps(model, torch.randn(4, 8, 10, 10, dtype=dtype), dtype=dtype)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_batch_norm_channels_last(batch, dtype):
    """Channels-last activations (eager's convolutions return them) and gradients: the
    training statistics and the backward's sums are lowered too, as column reductions over
    the (N * H * W, C) view that read memory in order (no strided pass per channel)."""
    torch.manual_seed(0)
    model = Block().to(dtype=dtype, memory_format=torch.channels_last)
    x = torch.randn(batch, 8, 6, 7, dtype=dtype).contiguous(memory_format=torch.channels_last)
    arts = _train_steps(model, x, dtype=dtype)
    assert not [op for art in arts for op in extern_ops(art) if "batch_norm" in op]
    # the forward's reads are one flat offset each (the backward also reads the incoming
    # gradient, which the aot runtime makes contiguous: NCHW reads beside channels-last ones)
    for load in re.findall(r"\w+\[([^\]]*)\]", arts[0].cpp):
        assert "/" not in load and "%" not in load, load
    model.eval()
    with torch.no_grad():
        _eval_matches(model, x)


class Variants(nn.Module):
    """BatchNorm2d without affine parameters and without running statistics, BatchNorm1d
    on features (N, C) and on sequences (N, C, L), GroupNorm, InstanceNorm2d (a batch norm
    of the input viewed as one sample of N * C channels). Layers before a batch norm have
    no bias: its exact gradient is 0, and both sides would compare rounding noise."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = Block(affine=False)
        self.batch_stats = nn.BatchNorm2d(8, track_running_stats=False)
        self.mlp = nn.Sequential(nn.Linear(8, 12, bias=False), nn.BatchNorm1d(12), nn.ReLU())
        self.seq = nn.Sequential(nn.Conv1d(8, 6, 3, bias=False), nn.BatchNorm1d(6), nn.ReLU())
        self.group = nn.GroupNorm(4, 8)
        self.instance = nn.InstanceNorm2d(8, affine=True)

    def forward(self, x):
        y = self.batch_stats(self.plain(x))
        y = F.relu(self.instance(self.group(y)))
        flat = self.mlp(y.mean((2, 3)))
        return flat.mean() + self.seq(y.flatten(2)).mean()


def test_batch_norm_variants():
    torch.manual_seed(0)
    _train_steps(Variants(), torch.randn(3, 8, 5, 5))


def _eval_matches(model, x):
    want = model(x)
    compiled = compile_ember(model)
    before = stats["graph_fallbacks"]
    with record() as arts:
        got = compiled(x)
    _close(got, want, x.dtype)
    pairs = list(zip(got, want)) if isinstance(want, tuple) else [(got, want)]
    assert [g.stride() for g, _ in pairs] == [w.stride() for _, w in pairs]
    assert stats["graph_fallbacks"] == before
    assert not _fallbacks(arts), _fallbacks(arts)
    return arts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_batch_norm_eval_is_an_epilogue(dtype):
    """Eval batch norm with running statistics fuses with its ReLU and the residual add:
    after each convolution there is one kernel (plus the tiny per-channel scale/shift)."""
    torch.manual_seed(0)
    model = Block().to(dtype)
    for bn in (model.bn1, model.bn2):  # non-trivial running statistics
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    model.eval()
    with torch.no_grad():
        (art,) = _eval_matches(model, torch.randn(2, 8, 9, 9, dtype=dtype))
    assert "relu" not in art.wrapper and art.cpp.count("__builtin_sqrt") >= 2


def test_batch_norm_eval_mode_gradients():
    """Frozen batch norm (eval mode) in a training step: its eval backward path."""
    torch.manual_seed(0)
    model = Block()
    model.bn1.running_var.uniform_(0.5, 2)
    model.eval()
    _train_steps(model, torch.randn(2, 8, 6, 6))


POOLS = {
    "max": [
        lambda x: F.max_pool2d(x, 3, 2, 1),
        lambda x: F.max_pool2d(x, 2),
        lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True),
        lambda x: F.max_pool2d(x, 8, 1),  # 64 taps (lowering was exponential in the taps)
    ],
    "avg": [
        lambda x: F.avg_pool2d(x, 3, 2, 1),
        lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
        lambda x: F.avg_pool2d(x, 2, ceil_mode=True),
        lambda x: F.avg_pool2d(x, 3, 1, 1, divisor_override=5),
        lambda x: F.adaptive_avg_pool2d(x, 1),
    ],
}


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=str)
@pytest.mark.parametrize("kind", list(POOLS))
def test_pooling_values_and_gradients(kind, fmt):
    """Forward and input gradient of padded, unpadded and ceil-mode pooling after a ReLU
    (fused into the pooling), with ties (the ReLU's zeros) and NaN in the input; the
    backward reads the indices the lowered max pool saved. NCHW pooling reads a padded
    copy, channels-last pooling masked taps."""

    def fn(t):
        return [pool(torch.relu(t)) for pool in POOLS[kind]]

    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 11)
    x[0, 0, 2, 3] = float("nan")
    x[1, 2, 4:6, 4:6] = 0.0
    x = x.contiguous(memory_format=fmt).requires_grad_(True)
    twin = x.detach().clone().requires_grad_(True)
    want = fn(x)
    grads = [torch.randn_like(w) for w in want]
    before = stats["graph_fallbacks"]
    with record() as arts:
        got = compile_ember(fn)(twin)
        sum((g * w).sum() for g, w in zip(grads, got)).backward()
    sum((g * w).sum() for g, w in zip(grads, want)).backward()
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(twin.grad, x.grad, equal_nan=True)
    assert stats["graph_fallbacks"] == before
    assert not _fallbacks(arts), _fallbacks(arts)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_pooling_dtypes_and_channels_last(dtype):
    torch.manual_seed(0)
    x = torch.randn(1, 4, 8, 8, dtype=dtype).contiguous(memory_format=torch.channels_last)

    def fn(t):
        pooled = F.max_pool2d(t, 3, 2, 1) + F.avg_pool2d(t, 2) + F.adaptive_avg_pool2d(t, 1)
        # the global pool returned as it is: eager's strides, channels-last on size-1 dims
        return pooled, F.max_pool2d(t, 2, 1, dilation=2), F.adaptive_avg_pool2d(t, 1)

    with torch.no_grad():
        _eval_matches(fn, x)


class SmallResNet(nn.Module):
    """stem conv-BN-ReLU, max pool, two blocks (the second strided, with a 1x1 conv-BN
    shortcut), global average pool, linear head."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.block = Block(c)
        self.conv = nn.Conv2d(c, 2 * c, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(2 * c)
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 1, 2, bias=False), nn.BatchNorm2d(2 * c))
        self.head = nn.Linear(2 * c, 5)

    def forward(self, x):
        x = self.block(F.max_pool2d(self.stem(x), 3, 2, 1))
        x = F.relu(self.bn(self.conv(x)) + self.down(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def test_small_resnet_training_then_eval():
    torch.manual_seed(0)
    model = SmallResNet()
    x = torch.randn(2, 3, 16, 16)
    _train_steps(model, x)
    model.eval()
    with torch.no_grad():
        _eval_matches(model, x)


def _eval_model(model, dtype=torch.float32):
    model = model.to(dtype)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial running statistics
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    return model.eval()


@pytest.mark.parametrize("layout", ["channels_last", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_conv_layout_of_an_nchw_net(layout, dtype, wrapper_calls):
    """EMBER_CONV_LAYOUT=channels_last: every convolution of an NCHW ResNet in eval mode
    reads a channels-last input, the batch norms, ReLUs, residual adds and pooling between
    them keep that layout (no copy outside the kernels: each convolution returns what the
    kernels were generated for), outputs have eager's values and strides; `eager` keeps
    NCHW throughout."""
    torch.manual_seed(0)
    model = _eval_model(SmallResNet(), dtype)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    with config.patch(conv_layout=layout), torch.no_grad():
        _eval_matches(model, x)
    cl = layout == "channels_last" and _eager_returns_channels_last(dtype)
    got = wrapper_calls["conv_inputs"]
    assert got == ["channels_last" if cl else "nchw"] * 5, got
    assert wrapper_calls["copies"] == 0


def _eager_returns_channels_last(dtype) -> bool:
    """Whether eager's convolution gives a channels-last input a channels-last result (its
    oneDNN kernels do; for bfloat16 without AVX-512 eager may take another path)."""
    x = torch.randn(2, 3, 8, 8, dtype=dtype).contiguous(memory_format=torch.channels_last)
    return F.conv2d(x, torch.randn(8, 3, 3, 3, dtype=dtype)).is_contiguous(
        memory_format=torch.channels_last
    )


class Returns(nn.Module):
    """Convolutions whose results the graph returns (directly, through a view, after a
    ReLU and after a pooling), a depthwise and a dilated one, a single channel, a conv
    reading an NCHW graph input through a ReLU, a transposed one."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 6, 3, padding=1)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6)
        self.one = nn.Conv2d(6, 1, 1)
        self.b = nn.Conv2d(1, 5, 3, stride=2)
        self.up = nn.ConvTranspose2d(5, 3, 2, stride=2)

    def forward(self, x):
        y = F.relu(self.a(torch.relu(x)))
        z = self.depthwise(y)
        one = self.one(z)
        pooled = F.max_pool2d(F.relu(z), 2)
        return y, pooled, one.flatten(1), self.up(F.relu(self.b(one))), z


def test_conv_layout_outputs_keep_eager_strides():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 10)
    with config.patch(conv_layout="channels_last"), torch.no_grad():
        _eval_matches(Returns(), x)


def test_conv_layout_training_steps():
    """Training steps under EMBER_CONV_LAYOUT=channels_last (the whole training graph is
    traced channels-last since session 16: tests/backend/test_channels_last_training.py);
    values, gradients and their strides as eager's."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3))
    with config.patch(conv_layout="channels_last"):
        _train_steps(SmallResNet(), torch.randn(2, 3, 16, 16))
        _train_steps(plain, torch.randn(2, 3, 8, 8))


def test_conv_layout_decision_is_timed_and_logged(caplog):
    """EMBER_CONV_LAYOUT=auto (the default): each convolution shape is timed in both
    layouts and the choice logged; whatever it is, values and strides are eager's."""
    torch.manual_seed(0)
    model = _eval_model(nn.Sequential(nn.Conv2d(5, 24, 3), nn.BatchNorm2d(24), nn.ReLU()))
    ember.set_logs("kernels")
    with caplog.at_level(logging.DEBUG, logger="ember.kernels"), torch.no_grad():
        _eval_matches(model, torch.randn(3, 5, 14, 13))
    (line,) = [r.getMessage() for r in caplog.records if "channels-last" in r.getMessage()]
    assert line.startswith("convolution (3, 5, 14, 13) * (24, 5, 3, 3)"), line
    assert line.endswith(("-> channels-last", "-> NCHW")), line


PADS = [  # (input size, pad, value, dtype)
    ((2, 3, 5, 6), [1, 1, 1, 1], 0.0, torch.float32),
    ((2, 3, 5, 6), [0, 1, 0, 1], 0.0, torch.float32),
    ((2, 3, 5, 6), [0, 0, 0, 0], 0.0, torch.float32),
    ((2, 3, 5, 6), [-1, 2, 0, -2], -2.5, torch.float32),
    ((3, 4, 5), [1, 0, 2, 1, 0, 3], 1.5, torch.float64),
    ((7,), [3, 2], float("-inf"), torch.float32),
    ((2, 3, 5, 6), [2, 1, 1, 2], 0.25, torch.bfloat16),
]


CASES = [(*case, torch.contiguous_format) for case in PADS] + [
    (*case, torch.channels_last) for case in PADS if len(case[0]) == 4
]


@pytest.mark.parametrize("size,pad,value,dtype,fmt", CASES, ids=str)
def test_constant_pad_nd_is_lowered(size, pad, value, dtype, fmt):
    """F.pad (constant): padding, cropping (negative amounts), an all-zero pad and a pad
    of every dim, fused with the ReLU before it; values, dtype and strides as eager's, no
    aten call left, and a returned all-zero pad of an input is a new tensor."""
    x = torch.randn(size, dtype=dtype).contiguous(memory_format=fmt)

    def fn(x):
        return F.pad(torch.relu(x), pad, value=value), F.pad(x, pad, value=value)

    with record() as arts:
        got = compile_ember(fn)(x)
    want = fn(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.stride() == w.stride()
        _close(g, w, dtype)
    assert got[1].data_ptr() != x.data_ptr()
    assert not [op for art in arts for op in extern_ops(art) if "pad" in op]


def test_constant_pad_nd_of_integers_stays_aten():
    """Integer padding is not lowered (a masked-out load of a lazy division by zero):
    aten's call, eager's values."""
    x = torch.arange(12, dtype=torch.int64).reshape(3, 4)

    def fn(x):
        return F.pad(x // 3, [1, 2], value=7)

    torch.testing.assert_close(compile_ember(fn)(x), fn(x))


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "var", "argmax"])
def test_reductions_over_unit_dims_only(reduce):
    """A reduction over dims that are all size 1 (MobileNetV2's global pool of a 1x1 map)
    has no reduced loop left; it compiled to an IndexError in the scheduler and ran the
    whole graph as aten ops."""
    x = torch.randn(2, 16, 1, 1)

    def fn(x):
        y = F.hardtanh(x, 0.0, 6.0)
        if reduce == "argmax":
            return y.argmax(-1)
        if reduce == "var":
            return y.var([-1, -2], correction=0, keepdim=True)
        return getattr(y, reduce)([-1, -2], keepdim=True)

    before = stats["graph_fallbacks"]
    got = compile_ember(fn)(x)
    torch.testing.assert_close(got, fn(x))
    assert stats["graph_fallbacks"] == before


class InvertedResidual(nn.Module):
    """A MobileNetV2 block as transformers writes it: 1x1 expansion, BN, ReLU6, "same"
    padding by hand (F.pad), a depthwise 3x3, BN, ReLU6, 1x1 projection, BN, the residual
    add; a stride-2 depthwise stem before it, a global average pool of a 1x1 map after."""

    def __init__(self, c: int = 8, e: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, stride=2, bias=False)
        self.bn0 = nn.BatchNorm2d(c)
        self.expand = nn.Conv2d(c, c * e, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c * e)
        self.dw = nn.Conv2d(c * e, c * e, 3, groups=c * e, bias=False)
        self.bn2 = nn.BatchNorm2d(c * e)
        self.project = nn.Conv2d(c * e, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.down = nn.Conv2d(c, c, 3, stride=8, groups=c, bias=False)

    def forward(self, x):
        x = F.relu6(self.bn0(self.stem(F.pad(x, [0, 1, 0, 1]))))
        y = F.relu6(self.bn1(self.expand(F.pad(x, [0, 0, 0, 0]))))
        y = F.relu6(self.bn2(self.dw(F.pad(y, [1, 1, 1, 1]))))
        x = x + self.bn3(self.project(y))
        return F.adaptive_avg_pool2d(self.down(x), 1).flatten(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mobilenet_block_channels_last(dtype, wrapper_calls):
    """EMBER_CONV_LAYOUT=channels_last on the block: the pads are kernels writing the
    convolutions' channels-last inputs (no aten pad, no layout copy), the global pool of
    the 1x1 map compiles, values and strides as eager's."""
    torch.manual_seed(0)
    model = _eval_model(InvertedResidual(), dtype)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    with config.patch(conv_layout="channels_last"), torch.no_grad():
        arts = _eval_matches(model, x)
    assert not [op for art in arts for op in extern_ops(art) if "pad" in op]
    cl = _eager_returns_channels_last(dtype)
    got = wrapper_calls["conv_inputs"]
    # the last convolution feeds the pool's mean directly (a reduction, not layout-
    # following), so it keeps eager's layout (layout.py `plan`)
    assert got == ["channels_last" if cl else "nchw"] * 4 + ["nchw"], got
    assert wrapper_calls["copies"] == 0


def test_conv_layout_charges_leaving_the_arriving_layout(monkeypatch, wrapper_calls):
    """One layout per group of convolutions joined by layout-following ops, chosen on the
    group's summed times plus a copy of the input entering it: a 1x1 convolution whose
    NCHW call is 10% faster than its channels-last one stays channels-last after a
    channels-last convolution instead of flipping the layout (timings injected: the test
    asserts the rule, not the machine)."""
    from ember.backend.lowering import layout

    def times(x_shape, w_shape, *rest):
        return (0.5, 1.0, 0.1) if w_shape[-1] == 3 else (1.0, 0.9, 0.1)

    monkeypatch.setattr(layout, "_times", times)
    torch.manual_seed(0)
    model = _eval_model(
        nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 8, 1))
    )
    with torch.no_grad():
        _eval_matches(nn.Sequential(model, nn.ReLU()), torch.randn(2, 3, 10, 10))
    if _eager_returns_channels_last(torch.float32):
        assert wrapper_calls["conv_inputs"] == ["channels_last"] * 2


@pytest.mark.parametrize("stem_cl", [0.55, 0.9])
def test_conv_layout_is_one_choice_per_group(monkeypatch, wrapper_calls, stem_cl, tmp_path):
    """The convolutions of a conv-BN-ReLU6 chain take one layout, chosen on their summed
    times plus one copy of the graph input: with a stem and a 1x1 convolution a little
    slower channels-last and a 3x3 one much faster, the whole chain runs channels-last
    (one at a time, the stem stayed NCHW, the 1x1 after it too, and the 3x3 alone paid a
    conversion); with a stem much slower channels-last, the whole chain stays NCHW
    (timings injected: the test asserts the rule, not the machine)."""
    from ember.backend.lowering import layout

    def times(x_shape, w_shape, *rest):
        if x_shape[1] == 3:  # the stem
            return (stem_cl, 0.5, 0.1)
        return (0.3, 0.28, 0.1) if w_shape[-1] == 1 else (0.4, 0.7, 0.1)

    monkeypatch.setattr(layout, "_times", times)
    torch.manual_seed(0)
    model = _eval_model(
        nn.Sequential(
            nn.Conv2d(3, 8, 3),
            nn.BatchNorm2d(8),
            nn.ReLU6(),
            nn.Conv2d(8, 8, 1),
            nn.BatchNorm2d(8),
            nn.ReLU6(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.BatchNorm2d(8),
        )
    )
    # a graph cache of its own: the cached graph of the other timings holds their choice
    with config.patch(cache_dir=str(tmp_path)), torch.no_grad():
        _eval_matches(nn.Sequential(model, nn.ReLU()), torch.randn(2, 3, 10, 10))
    if _eager_returns_channels_last(torch.float32):
        want = "channels_last" if stem_cl < 0.6 else "nchw"
        assert wrapper_calls["conv_inputs"] == [want] * 3
        assert wrapper_calls["copies"] == 0
