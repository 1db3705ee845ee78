"""Scaled dot-product attention traced the way eager runs it.

`F.scaled_dot_product_attention` is a composite op: PyTorch picks a kernel from the real
tensors (device, dtype, shapes, mask, grad) and only then runs or decomposes it. The tracer's
meta tensors always get the math path (bmm, softmax, bmm, with the L x S score matrix in
memory), while eager on CPU usually runs the fused flash kernel
(`aten._scaled_dot_product_flash_attention_for_cpu`), which never materializes the scores.
`EagerAttention` asks PyTorch's own chooser, with empty CPU tensors of the meta arguments'
layout, and records the fused kernel whenever eager would run it: the same kernel and numbers
as eager, and PyTorch's derivative formula for it in training.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from ember import torch_compat
from ember.aot.symbolic import hints

_SDPA = torch_compat.scaled_dot_product_attention
_FLASH = int(SDPBackend.FLASH_ATTENTION)


class EagerAttention(TorchFunctionMode):
    """Records SDPA calls on CPU as the fused kernel eager would pick (others run as usual)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is _SDPA:
            fused = _fused_like_eager(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """An empty CPU tensor with `t`'s layout, dtype and grad flag (for the kernel chooser)."""
    # symbolic sizes: the chooser looks at dtypes, dims and flags; the example sizes stand in
    real = torch.empty_strided(hints(t.shape), hints(t.stride()), dtype=t.dtype, device="cpu")
    return real.requires_grad_(t.requires_grad)


def _fused_like_eager(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """The fused CPU kernel's output where eager would run it, else None. Dropout keeps the
    composite path. With grouped-query attention (fewer key/value heads, Llama's) eager
    hands the kernel the unrepeated keys and values, and so does this."""
    tensors = [query, key, value] + ([attn_mask] if attn_mask is not None else [])
    if dropout_p != 0.0 or not all(t.is_meta for t in tensors):
        return None
    with _disable_current_modes():  # the stand-ins are real tensors, not recorded ones
        q, k, v, *m = map(_stand_in, tensors)
        choice = torch_compat.fused_sdp_choice(
            q, k, v, m[0] if m else None, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if choice != _FLASH:
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # as eager does before the fused kernel: True keeps a score (0), False masks it (-inf)
        zeros = torch.zeros_like(attn_mask, dtype=query.dtype)
        attn_mask = zeros.masked_fill(attn_mask.logical_not(), float("-inf"))
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out
