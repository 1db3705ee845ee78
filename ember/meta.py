"""Meta tensors for tracing (shared by capture and aot).

The tracer runs every aten op on meta tensors: they carry dtype, shape, strides and
requires_grad (autograd works on them), never data. FakeTensorMode would do the same but its
constructor imports torch._dynamo, which costs seconds here (more than all of ember's
compile); the tracers run under `torch_compat.without_dynamo` for the same reason.

A meta tensor forgets its device: the tracer keeps the inputs' real device and redirects
device arguments to meta while an op runs (see aot/trace.py and capture/values/meta.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ember import torch_compat

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
    # the lazy conjugate / negative bits of a view (`x.conj()`): what the trace's ops on
    # the example answer (`is_conj()`, `resolve_conj()`, view_as_real refusing) depends on them
    if real.is_conj():
        torch_compat.set_conj(meta, True)
    if real.is_neg():
        torch_compat.set_neg(meta, True)
    if real.requires_grad:
        meta.requires_grad_(True)
        if not real.is_leaf:
            meta = meta.clone()  # keeps dense strides
    return meta


def hollow_tensor(
    size: Sequence[Any], stride: Sequence[Any], dtype: torch.dtype, offset: Any = 0
) -> torch.Tensor:
    """A new meta tensor (no view of another) of this layout. `torch.empty_strided` would
    work out its storage size from the symbolic sizes, some ten SymInt operations of ~0.2
    ms each in a Dynamo ShapeEnv; a meta tensor's storage holds nothing, so the layout is
    set on an empty one and the result detached from it."""
    empty = torch.empty(0, dtype=dtype, device=META)
    return empty.as_strided(size, stride, offset).detach()
