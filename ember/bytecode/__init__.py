"""The bytecode layer (no torch import): everything ember knows about CPython's bytecode.

Decoding into version-neutral instructions (`decode`, `Inst`, `Op`), the per-version table
(`dialect.py`, the only place that reads the Python version), stack layouts and effects,
the exception table, control flow, liveness and stack depth (`analysis.py`), and the builders
of new code (`CodeBuilder`, `Continuation`). The capture stage speaks only in these terms.
"""

from ember.bytecode.analysis import (
    ExceptionEntry,
    enclosing_blocks,
    exception_table,
    handler_at,
    live_locals,
    stack_depth,
)
from ember.bytecode.assemble import CodeBuilder
from ember.bytecode.continuation import CannotContinue, Continuation
from ember.bytecode.decode import Inst, decode
from ember.bytecode.ops import BINARY_OPS, COMPARE_OPS, UNSUPPORTED, Op
from ember.bytecode.stack import operands, stack_effect, with_null

__all__ = [
    "BINARY_OPS",
    "COMPARE_OPS",
    "UNSUPPORTED",
    "CannotContinue",
    "CodeBuilder",
    "Continuation",
    "ExceptionEntry",
    "Inst",
    "Op",
    "decode",
    "enclosing_blocks",
    "exception_table",
    "handler_at",
    "live_locals",
    "operands",
    "stack_depth",
    "stack_effect",
    "with_null",
]
