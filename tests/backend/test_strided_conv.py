"""1x1 convolutions with a stride run as stride-1 convolutions of the subsampled input
(lowering/strided_conv.py): training steps of downsampling shortcuts against eager and a
float64 reference (losses, gradients and their strides, parameters, running statistics),
the input's own gradient, channels-last, odd sizes and uneven strides, groups and bias;
the library is called with stride 1 only, and a padded 1x1 convolution keeps its call."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from tests.backend.helpers import check, compile_ember
from tests.backend.test_convnets import _train_steps


class Shortcut(nn.Module):
    """A ResNet downsampling block: 3x3 conv-BN-ReLU beside a strided 1x1 conv-BN."""

    def __init__(self, stride=(2, 2), groups: int = 1, bias: bool = False) -> None:
        super().__init__()
        self.main = nn.Conv2d(4, 8, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.down = nn.Conv2d(4, 8, 1, stride=stride, groups=groups, bias=bias)
        self.down_bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.main(x))) + self.down_bn(self.down(torch.relu(x)))


def _strided_calls(arts) -> list[str]:
    """Library convolution calls (forward or backward) with a stride other than 1 (in
    `call`: `call_boxed` repeats the body)."""
    calls = [
        line
        for art in arts
        for line in art.wrapper.split("def call_boxed")[0].splitlines()
        if re.search(r"= _op\d+\(", line) and "[1, 1], [0, 0], [1, 1], False" not in line
    ]
    return [c for c in calls if "False, [0, 0]" in c]


@pytest.mark.parametrize("stride", [(2, 2), (3, 2), (1, 2)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_downsampling_block_training_steps(stride, dtype, wrapper_calls):
    torch.manual_seed(0)
    model = Shortcut(stride).to(dtype)
    arts = _train_steps(model, torch.randn(3, 4, 9, 10, dtype=dtype), steps=3, dtype=dtype)
    strided = _strided_calls(arts)
    # only the 3x3 convolution keeps its stride (its forward and its backward)
    assert all(str(list(stride)) in c for c in strided)
    assert len(strided) == 2, strided
    assert wrapper_calls["copies"] == 0  # the library results come in the planned strides


@pytest.mark.parametrize("groups,bias", [(2, True), (1, True), (4, False)])
def test_groups_bias_channels_last(groups, bias, wrapper_calls):
    torch.manual_seed(0)
    model = Shortcut((2, 2), groups, bias).to(memory_format=torch.channels_last)
    x = torch.randn(2, 4, 7, 8).contiguous(memory_format=torch.channels_last)
    _train_steps(model, x, steps=2, dtype=torch.float32)
    assert wrapper_calls["copies"] == 0
    assert "channels_last" in wrapper_calls["conv_inputs"]


@pytest.mark.parametrize("channels_last", [False, True])
def test_input_gradient_and_inference(channels_last):
    """The placed input gradient reaches the caller in eager's strides; inference runs the
    subsampled convolution too."""
    conv = nn.Conv2d(6, 5, 1, stride=2, bias=True)
    x = torch.randn(2, 6, 11, 9)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        conv = conv.to(memory_format=torch.channels_last)
    xe = x.clone().requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    g = torch.randn(2, 5, 6, 5)
    (conv(xe) * g).sum().backward()
    (compile_ember(conv)(xc) * g).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    assert xc.grad.stride() == xe.grad.stride()
    with torch.no_grad():
        (art,) = check(lambda x: conv(x * 2), x)
    assert _strided_calls([art]) == []


def test_padded_1x1_keeps_the_strided_call():
    conv = nn.Conv2d(3, 4, 1, stride=2, padding=1)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        (art,) = check(conv, x)
    assert len(_strided_calls([art])) == 1
