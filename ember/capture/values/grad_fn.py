"""`t.grad_fn` of a tensor with autograd history (not a leaf, requiring grad).

The node object itself exists only when the graph has run, so the trace holds a stand-in:
enough for what code usually asks of it (`t.grad_fn is not None`, its truth), and, where
it leaves the trace, read again from the real tensor (`<the tensor>.grad_fn`, the very
node eager would hand back). Anything else (its name, `next_functions`, calling it) is a
graph break naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.capture.values.base import Value
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator
    from ember.capture.values.tensor import TensorValue


class GradFnValue(Value):
    """The `grad_fn` of `of`, which is known not to be None."""

    def __init__(self, of: TensorValue) -> None:
        self.of = of
        self.version = of.example._version
        """The tensor's version when read: an in-place op since gives it another node."""

    def describe(self) -> str:
        return f"grad_fn of {self.of.describe()}"

    def truth(self, tx: Translator) -> bool:
        return True  # autograd nodes define no __bool__ or __len__

    def contained(self) -> list[Value]:
        return [self.of]

    def reconstruct(self, em: Emitter) -> None:
        if self.of.example._version != self.version:
            raise Unsupported(
                BreakReason.UNSUPPORTED_OBJECT,
                f"{self.describe()} read before an in-place op on it (that node is gone)",
            )
        em.reconstruct(self.of)
        em.cg.load_attr("grad_fn")
