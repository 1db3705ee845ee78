"""The lowering table: aten overload -> function building lowering values.

Each lowering is registered next to its implementation with `@register(aten.op.overload)`;
it receives a `LowerCtx` and the op's arguments with fx nodes replaced by values. Raising
`NotLowered` sends that call to a fallback kernel instead (always correct).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ember import torch_compat
from ember.backend.ir.nodes import DType, Size
from ember.backend.lowering.values import GraphBuilder
from ember.backend.sizes import exprs_of

Lowering = Callable[..., Any]
LOWERINGS: dict[Any, Lowering] = {}


class NotLowered(Exception):
    """This call's arguments are outside what the lowering handles; use the fallback."""


@dataclasses.dataclass(slots=True)
class LowerCtx:
    builder: GraphBuilder
    meta: Any  # the op's output on the meta device (tensor, or tuple of tensors)
    node: torch.fx.Node

    @property
    def out_dtype(self) -> DType:
        d = DType.of(self.meta.dtype)
        if d is None:
            raise NotLowered(f"dtype {self.meta.dtype}")
        return d

    @property
    def out_size(self) -> tuple[Size, ...]:
        return exprs_of(self.meta.shape)


def register(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Decorator: lower these aten overloads (a packet registers all of its overloads)."""

    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            if isinstance(op, torch_compat.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn

    return deco


def opmath(d: DType) -> DType:
    """The type arithmetic happens in (as in eager: 16-bit floats compute in float)."""
    return d.computed_as
