"""What the code after a graph needs from it: the tensors (and symbolic sizes) reachable
from the values that generated code rebuilds after the graph (the stack and locals at a
break, the return value, the side-effect ledger's pending values). They become the graph's
outputs."""

from __future__ import annotations

from ember.capture.shapes import has_symbols
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import DictValue, IteratorValue, SequenceValue, key_value
from ember.capture.values.functions import BoundMethodValue, MethodValue
from ember.capture.values.mappings import DictObjectValue
from ember.capture.values.objects import UserObjectValue
from ember.capture.values.tensor import TensorValue


def live_tensors(values: list[Value]) -> list[TensorValue | ConstantValue]:
    """Tensors (and symbolic sizes) reachable from values that will be rebuilt after the
    graph: the graph's outputs."""
    found: list[TensorValue | ConstantValue] = []
    seen: set[int] = set()

    def visit(v: Value) -> None:
        if id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, TensorValue) or isinstance(v, ConstantValue) and has_symbols(v.value):
            found.append(v)
        elif isinstance(v, SequenceValue):
            for item in v.items:
                visit(item)
        elif isinstance(v, DictValue):
            for key, item in v.items.items():
                visit(key_value(key))
                visit(item)
        elif isinstance(v, UserObjectValue) and v.is_new:
            for item in [*v.attrs.values(), *v.contained()]:
                visit(item)
            if isinstance(v, DictObjectValue):
                visit(v.contents)
        elif isinstance(v, (MethodValue, BoundMethodValue)):
            visit(v.receiver)
        elif isinstance(v, IteratorValue):
            for item in [*v.items[v.position :], *v.contained()]:
                visit(item)
        else:
            for item in v.contained():
                visit(item)

    for value in values:
        visit(value)
    return found
