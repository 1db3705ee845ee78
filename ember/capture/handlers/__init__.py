"""Opcode handlers, one module per family, registered by `Op` with `@handler(Op.X)`.

A handler takes the translator and the instruction and updates the frame. Importing this
package imports every family so that `HANDLERS` is complete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ember.bytecode import Inst, Op

if TYPE_CHECKING:
    from ember.capture.translator import Translator

Handler = Callable[["Translator", Inst], None]
HANDLERS: dict[Op, Handler] = {}


def handler(*ops: Op) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in ops:
            if op in HANDLERS:
                raise RuntimeError(f"two handlers for {op}")
            HANDLERS[op] = fn
        return fn

    return register


from ember.capture.handlers import (  # noqa: E402  (the families register into HANDLERS)
    calls,
    containers,
    control,
    exceptions,
    generators,
    matching,
    names,
    operators,
    stack,
)

__all__ = [
    "HANDLERS",
    "handler",
    "calls",
    "containers",
    "control",
    "exceptions",
    "generators",
    "matching",
    "names",
    "operators",
    "stack",
]
