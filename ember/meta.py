"""Meta tensors for tracing, without importing torch._dynamo (shared by capture and aot).

The tracer runs every aten op on meta tensors: they carry dtype, shape, strides and
requires_grad (autograd works on them), never data. FakeTensorMode would do the same but its
constructor imports torch._dynamo, and so does the first call of any of PyTorch's Python meta
kernels (they are wrapped in `torch._disable_dynamo`, which imports Dynamo only to mark the
kernel "do not trace"). That import costs seconds here, more than all of ember's compile, so
while ember traces, a stand-in `torch._dynamo` answers `disable(fn)` with `fn` itself. The
stand-in leaves when tracing ends; a later real `import torch._dynamo` is unaffected.

A meta tensor forgets its device: the tracer keeps the inputs' real device and redirects
device arguments to meta while an op runs (see aot/trace.py and capture/values/meta.py).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

META = torch.device("meta")


def to_meta(real: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `real`'s dtype, shape, strides, offset and requires_grad; a leaf
    when `real` is one, else the output of an op (so autograd treats in-place ops the same)."""
    if real.storage_offset() == 0:
        meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=META)
    else:
        extent = real.storage_offset() + 1
        extent += sum((s - 1) * st for s, st in zip(real.shape, real.stride(), strict=True))
        base = torch.empty(extent if real.numel() else 0, dtype=real.dtype, device=META)
        meta = base.as_strided(real.shape, real.stride(), real.storage_offset())
    if real.requires_grad:
        meta.requires_grad_(True)
        if not real.is_leaf:
            meta = meta.clone()  # keeps dense strides
    return meta


def _undisabled(fn: Any = None, recursive: bool = True, wrapping: bool = True) -> Any:
    return fn


@contextlib.contextmanager
def no_dynamo_import() -> Iterator[None]:
    """While tracing, `torch._disable_dynamo` wrappers get `fn` back instead of importing
    Dynamo. No-op once Dynamo is loaded (then its real `disable` is already there)."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("torch._dynamo", "ember.aot: stands in while tracing")
    stand_in.disable = _undisabled  # type: ignore[attr-defined]
    sys.modules["torch._dynamo"] = stand_in
    torch._dynamo = stand_in  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if sys.modules.get("torch._dynamo") is stand_in:
            del sys.modules["torch._dynamo"]
        if torch.__dict__.get("_dynamo") is stand_in:
            del torch._dynamo


def needs_real_dynamo(exc: BaseException) -> bool:
    """True when an error came from code that wanted more of torch._dynamo than the stand-in:
    the caller then traces again with the real module imported."""
    return isinstance(exc, ImportError | AttributeError) and "_dynamo" in str(exc)
