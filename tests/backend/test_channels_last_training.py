"""Training graphs traced channels-last (ember/aot/channels_last.py) against eager.

Where the backend chooses it (forced here with EMBER_CONV_LAYOUT), a training graph whose
image input arrives NCHW is traced again with that input converted once at the entry, so
every convolution, saved activation and backward convolution is channels-last. What the
caller sees must stay eager's: losses, gradients (values and strides), parameters and
running statistics over several SGD steps, returned activations and views of them.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember import config
from tests.backend.helpers import compile_ember
from tests.backend.test_convnets import (
    TOL,
    InvertedResidual,
    SmallResNet,
    _eager_returns_channels_last,
    _train_steps,
)

DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("net", ["resnet", "mobilenet_block"])
def test_training_steps_channels_last(net, dtype, wrapper_calls):
    """Three SGD steps: values, gradients and their strides, parameters and buffers as
    eager's; every forward convolution reads a channels-last input and no library result
    needs a layout copy (the backward was traced for the forward's strides)."""
    torch.manual_seed(0)
    model = (SmallResNet() if net == "resnet" else InvertedResidual()).to(dtype)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    with config.patch(conv_layout="channels_last"):
        _train_steps(model, x, steps=3, dtype=dtype)
    got = wrapper_calls["conv_inputs"]
    cl = _eager_returns_channels_last(dtype)
    assert got and all(g == ("channels_last" if cl else "nchw") for g in got), got
    assert wrapper_calls["copies"] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_training_steps_in_eager_layout(dtype, wrapper_calls):
    """EMBER_CONV_LAYOUT=eager keeps the training graph NCHW."""
    torch.manual_seed(0)
    with config.patch(conv_layout="eager"):
        _train_steps(SmallResNet().to(dtype), torch.randn(2, 3, 16, 16, dtype=dtype), dtype=dtype)
    assert set(wrapper_calls["conv_inputs"]) == {"nchw"}


class ReturnsActivations(nn.Module):
    """Returns a conv activation, a permuted view of another, a pooled map and a flat
    head: each in eager's strides although the graph runs channels-last. (No bias before
    the batch norm: its exact gradient is 0, and both sides would compare rounding noise.)"""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 6, 3, padding=1, bias=False)  # before a batch norm
        self.bn = nn.BatchNorm2d(6)
        self.b = nn.Conv2d(6, 4, 3, groups=2)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = F.relu(self.bn(self.a(x)))
        z = self.b(y)
        pooled = F.max_pool2d(z, 2)
        return y, z.permute(0, 2, 3, 1), pooled, self.head(z.mean((2, 3)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_returned_activations_keep_eager_strides(dtype):
    torch.manual_seed(0)
    model = ReturnsActivations().to(dtype)
    twin = ReturnsActivations().to(dtype)
    twin.load_state_dict(model.state_dict())
    compiled = compile_ember(twin)
    x = torch.randn(2, 3, 9, 10, dtype=dtype)
    with config.patch(conv_layout="channels_last"):
        for _ in range(2):
            want, got = model(x), compiled(x)
            for w, g in zip(want, got, strict=True):
                torch.testing.assert_close(g, w, **TOL[dtype])
                assert g.stride() == w.stride()
            for outs in (want, got):
                sum(o.float().square().sum() * (k + 1) for k, o in enumerate(outs)).backward()
            for p, q in zip(model.parameters(), twin.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, **TOL[dtype])
                assert q.grad.stride() == p.grad.stride()
                p.grad = q.grad = None


def test_input_that_needs_grad_is_not_converted(wrapper_calls):
    """An image input that requires grad keeps eager's layout (its gradient would be the
    converted copy's); its gradient has eager's values and strides."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    twin = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    with config.patch(conv_layout="channels_last"):
        model(x).square().mean().backward()
        compile_ember(twin)(x2).square().mean().backward()
    torch.testing.assert_close(x2.grad, x.grad, **TOL[torch.float32])
    assert x2.grad.stride() == x.grad.stride()
    assert set(wrapper_calls["conv_inputs"]) == {"nchw"}


def test_auto_keeps_training_graphs_nchw(caplog, wrapper_calls):
    """EMBER_CONV_LAYOUT=auto (the default) keeps training graphs without depthwise
    convolutions in eager's layout (the batch norms' channels-last kernels cost what the
    convolutions gain, layout.py `channels_last_training`); the forced choice is logged."""
    torch.manual_seed(0)
    _train_steps(SmallResNet(), torch.randn(2, 3, 16, 16))
    assert set(wrapper_calls["conv_inputs"]) == {"nchw"}
    ember.set_logs("aot")
    try:
        with (
            caplog.at_level(logging.DEBUG, logger="ember.aot"),
            config.patch(conv_layout="channels_last"),
        ):
            # another size: Dynamo would reuse the first graph for the same one
            _train_steps(SmallResNet(), torch.randn(2, 3, 12, 12))
    finally:
        ember.set_logs()
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.aot"]
    assert any(
        re.fullmatch(r"training graph: inputs \[\d+\] traced channels-last", m) for m in lines
    )


def test_auto_traces_depthwise_training_graphs_channels_last(caplog, wrapper_calls):
    """Under auto, a training graph with a depthwise 3x3 convolution (MobileNetV2's block)
    is traced channels-last (logged), with eager's values; under eager it stays NCHW."""
    torch.manual_seed(0)
    ember.set_logs("aot")
    try:
        with caplog.at_level(logging.DEBUG, logger="ember.aot"):
            _train_steps(InvertedResidual(), torch.randn(2, 3, 16, 16), steps=3)
    finally:
        ember.set_logs()
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.aot"]
    assert any(
        re.fullmatch(r"training graph: inputs \[\d+\] traced channels-last", m) for m in lines
    )
    if _eager_returns_channels_last(torch.float32):
        assert "channels_last" in wrapper_calls["conv_inputs"]
    assert wrapper_calls["copies"] == 0
    wrapper_calls["conv_inputs"].clear()
    with config.patch(conv_layout="eager"):
        _train_steps(InvertedResidual(), torch.randn(2, 3, 12, 12))
    assert set(wrapper_calls["conv_inputs"]) == {"nchw"}


class ReturnsItsInput(nn.Module):
    """Returns a view of its image input beside a convolution: converted, that view would
    be of the graph's copy, not of the caller's tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x), x[:, :2]


def test_retrace_that_changes_what_aliases_is_dropped(caplog):
    """The retrace returns a fresh tensor where the first trace returned a view of the
    input: it is dropped (logged), and the view still aliases the caller's tensor."""
    torch.manual_seed(0)
    model = ReturnsItsInput()
    x = torch.randn(2, 3, 8, 8)
    ember.set_logs("aot")
    try:
        with (
            caplog.at_level(logging.DEBUG, logger="ember.aot"),
            config.patch(conv_layout="channels_last"),
        ):
            out, view = compile_ember(model)(x)
    finally:
        ember.set_logs()
    want, want_view = model(x)
    torch.testing.assert_close(out, want, **TOL[torch.float32])
    assert out.stride() == want.stride()
    assert view.data_ptr() == x.data_ptr() and view.stride() == want_view.stride()
    lines = [r.getMessage() for r in caplog.records if r.name == "ember.aot"]
    assert any(m.endswith("stay in eager's layout (no match)") for m in lines), lines
