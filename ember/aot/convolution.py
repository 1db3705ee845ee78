"""Convolutions traced with the memory format eager's CPU kernels give their results.

The meta kernels of `aten.convolution` and `aten.convolution_backward` return contiguous
(NCHW) tensors, while eager on the CPU returns channels-last results whenever the input or
the weight is channels-last (oneDNN's choice). Recording the meta strides would make every
channels-last model's graph claim NCHW activations: the backend would then copy each
convolution's result into NCHW and write every activation after it in NCHW, and compiled
outputs would have other strides than eager's. These rules ask PyTorch's own convolution
backend chooser, on empty CPU stand-ins with the arguments' layouts, which memory format
eager produces, and record the results in it (values are unaffected: only strides).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ember import torch_compat
from ember.aot.symbolic import hints

aten = torch.ops.aten

_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """An empty CPU tensor with `t`'s sizes, strides and dtype (the chooser reads only those)."""
    return torch.empty_strided(hints(t.shape), hints(t.stride()), dtype=t.dtype, device="cpu")


def eager_memory_format(
    x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, transposed, out_pad, groups
) -> torch.memory_format | None:
    """The memory format of eager's CPU convolution result (None: keep the meta strides)."""
    if x.dim() not in _CHANNELS_LAST or not x.is_meta:
        return None
    with _disable_current_modes():
        xs, ws = _stand_in(x), _stand_in(weight)
        params = (list(stride), list(padding), list(dilation), transposed, list(out_pad), groups)
        backend = torch_compat.select_conv_backend(xs, ws, None, *params, None)
        return torch_compat.conv_memory_format(xs, ws, backend)


def _in_format(t: torch.Tensor | None, fmt: torch.memory_format | None) -> torch.Tensor | None:
    if t is None or fmt is None or fmt == torch.contiguous_format or t.dim() not in _CHANNELS_LAST:
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device, memory_format=fmt)


def _bound(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by schema name."""
    names = [a.name for a in func._schema.arguments]
    return dict(zip(names, args, strict=False)) | kwargs


_PARAMS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _format_of(func: Any, args: tuple, kwargs: dict) -> torch.memory_format | None:
    a = _bound(func, args, kwargs)
    return eager_memory_format(a["input"], a["weight"], *(a[n] for n in _PARAMS))


def convolution(tracer: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Record `aten.convolution` with eager's result strides."""
    out = _in_format(tracer._on_meta(func, args, kwargs), _format_of(func, args, kwargs))
    node = tracer.emit(func, tracer._record(args), tracer._record(kwargs), out)
    tracer._bind_roots(out, node)
    return out


def convolution_backward(tracer: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Record `aten.convolution_backward` with eager's strides: the input and weight
    gradients in the memory format of the forward's result."""
    out = tracer._on_meta(func, args, kwargs)
    fmt = _format_of(func, args, kwargs)
    out = (_in_format(out[0], fmt), _in_format(out[1], fmt), out[2])
    node = tracer.emit(func, tracer._record(args), tracer._record(kwargs), out)
    tracer._bind_roots(out, node)
    return out
