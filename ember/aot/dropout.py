"""Dropout traced the way eager runs it off the CPU.

`torch.dropout` is a composite op that looks at the real tensor's device: on CUDA (and other
accelerators) eager runs the fused `aten.native_dropout`, on the CPU it draws
`bernoulli_` and multiplies. The tracer's meta tensors always get the CPU path, so a graph
traced for a GPU would draw its mask from another random stream than eager: the same
distribution, different numbers for the same seed. `FusedDropout` records the fused op
wherever eager would run it, so a seeded program drops the same elements as eager.
(In-place dropout is not fused in eager either, so it keeps the composite path.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class FusedDropout(TorchFunctionMode):
    """Records out-of-place dropout in training as `aten.native_dropout` (for accelerator
    traces). With a mode active, `F.dropout` reaches the mode itself before `torch.dropout`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.dropout or func is torch.dropout:
            x, p, train, inplace = _dropout_args(func, *args, **kwargs)
            if train and not inplace and 0 < p < 1 and x.numel() > 0:
                return torch.native_dropout(x, p, train)[0]
        return func(*args, **kwargs)


def _dropout_args(func, *args, **kwargs) -> tuple[torch.Tensor, float, bool, bool]:  # type: ignore[no-untyped-def]
    """(input, p, train, inplace) of a call of `F.dropout` or `torch.dropout`."""
    if func is torch.dropout:
        return _aten_signature(*args, **kwargs)
    return _functional_signature(*args, **kwargs)


def _aten_signature(input: torch.Tensor, p: float, train: bool) -> tuple:
    return input, p, train, False


def _functional_signature(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> tuple:
    return input, p, training, inplace
