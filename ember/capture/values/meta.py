"""Running torch calls on meta tensors during capture.

Capture needs each op's result metadata (dtype, shape, strides, requires_grad) and PyTorch's
own errors, never data. Meta tensors give exactly that without FakeTensorMode, whose first use
imports all of torch._dynamo (seconds on this machine) and would make ember's first call as slow
as torch.compile's. The one thing a meta tensor forgets is its real device, so symbolic tensors
carry it separately and device arguments are redirected to meta while an op runs. The meta
tensors and the stand-in for torch._dynamo are shared with ember.aot (ember/meta.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from ember.meta import META as _META
from ember.meta import needs_real_dynamo, no_dynamo_import

_DEVICE_MOVES = frozenset(["cpu", "cuda", "xpu", "mps"])


def _redirect(value: Any) -> Any:
    return _META if isinstance(value, torch.device) else value


def _device_arg(value: Any) -> torch.device | None:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str) and value.split(":")[0] in ("cpu", "cuda", "meta", "xpu", "mps"):
        return torch.device(value)
    return None


def run_on_meta(kind: str, target: Any, args: list, kwargs: dict) -> Any:
    """Call `target` (a function, or a method name for call_method) on meta examples."""
    try:
        with no_dynamo_import():
            return _call(kind, target, args, kwargs)
    except (ImportError, AttributeError) as exc:
        if not needs_real_dynamo(exc):
            raise
    return _call(kind, target, args, kwargs)  # the kernel needed the real torch._dynamo


def _call(kind: str, target: Any, args: list, kwargs: dict) -> Any:
    args = tree_map(_redirect, list(args))
    kwargs = {
        k: _META if k == "device" and v is not None else _redirect(v) for k, v in kwargs.items()
    }
    with torch.device(_META):
        if kind != "call_method":
            return target(*args, **kwargs)
        if target in _DEVICE_MOVES:
            return args[0]
        if target == "to":
            args = [args[0], *(_META if _device_arg(a) else a for a in args[1:])]
        return getattr(args[0], target)(*args[1:], **kwargs)


def result_device(
    kind: str, target: Any, args: list, kwargs: dict, tensor_devices: list[torch.device]
) -> torch.device:
    """The real device an op's result lives on (what eager would report)."""
    if kind == "call_method" and target in _DEVICE_MOVES:
        index = args[1] if len(args) > 1 and isinstance(args[1], int) else None
        return torch.device(target, index) if target != "cpu" else torch.device("cpu")
    candidates = [kwargs.get("device")]
    if kind == "call_method" and target == "to":
        candidates += list(args[1:])
    for candidate in candidates:
        device = _device_arg(candidate)
        if device is not None:
            return device
    if tensor_devices:
        return tensor_devices[0]
    return torch.get_default_device()


def is_data_dependent_error(exc: BaseException) -> bool:
    """Meta kernels refuse ops whose output shape depends on values (nonzero, unique, ...)."""
    text = str(exc)
    return (
        isinstance(exc, NotImplementedError)
        and ("meta" in text.lower())
        or ("cannot be called on meta tensors" in text or "without output_size" in text)
    )
