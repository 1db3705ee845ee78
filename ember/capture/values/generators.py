"""Generators during capture: a generator function (most often a generator expression passed
to `sum`, `any`, `all`, `tuple`, ...) is run to exhaustion in a child translator and stands
for an iterator over what it yielded.

Running it eagerly instead of on demand is what an unrolled trace does anyway: every value a
consumer could pull is computed once, in order, into the same graph. A consumer that stops
early (`any`) sees the same values; the extra items it did not pull only add unused nodes,
which the graph drops.
"""

from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any

from ember import config
from ember.capture.values.base import Value
from ember.capture.values.containers import IteratorValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator

GENERATOR_FLAGS = inspect.CO_GENERATOR
UNSUPPORTED_FLAGS = (
    inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
)


def is_generator_code(code: types.CodeType) -> bool:
    return bool(code.co_flags & GENERATOR_FLAGS) and not code.co_flags & UNSUPPORTED_FLAGS


def inline_generator(
    tx: Translator,
    code: types.CodeType,
    f_globals: dict,
    args: list[Value],
    kwargs: dict[str, Value],
    defaults: tuple[Value, ...],
    kwdefaults: dict[str, Value],
    closure: list[Any],
    description: str,
) -> IteratorValue:
    """Interpret a generator function's body; the result iterates over its yields."""
    from ember.capture.translator import Translator, bind_arguments

    if tx.depth >= config.current().inline_depth:
        raise Unsupported(BreakReason.INLINE_DEPTH, f"inlining {description}")
    f_locals = bind_arguments(code, args, kwargs, defaults, kwdefaults)
    cells = dict(zip(code.co_freevars, closure))
    child = Translator(tx.ctx, code, f_globals, f_locals, cells, parent=tx)
    child.yielded = []  # marks the frame as a generator for RETURN_GENERATOR / YIELD_VALUE
    returned = child.run()
    return IteratorValue(child.yielded, returned)
