"""What values of the trace a set of roots can reach: which generators something still
holds (generator_drop: CPython closes one whose last reference goes) and whether an
attribute write would make a value refer to itself (break code cannot make a cycle again).
Conservative: any of ember's capture objects reachable through attributes, containers,
cells or generator frames counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.capture.values.iterators import GeneratorIterator

if TYPE_CHECKING:
    from ember.capture.translator import Translator


def reachable(roots: list[Any], wanted: list[Any]) -> list[Any]:
    """Those of `wanted` that something reachable from `roots` refers to (conservative:
    any Value reachable through attributes, containers, cells or frames counts)."""
    from ember.capture.output_graph import OutputGraph
    from ember.capture.translator import CaptureContext, Translator

    skipped = (Translator, CaptureContext, OutputGraph)  # frames: by their contents only

    found: list[Any] = []
    targets = {id(g) for g in wanted}
    seen: set[int] = set()
    pending = list(roots)
    while pending:
        obj = pending.pop()
        if obj is None or isinstance(obj, (int, float, str, bool)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in targets:
            found.append(obj)
        if isinstance(obj, dict):
            pending += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            pending += list(obj)
        elif isinstance(obj, GeneratorIterator):
            pending += [v for k, v in vars(obj).items() if k != "frame"]
            pending += frame_contents(obj.frame)
        elif type(obj).__name__ == "cell":
            try:
                pending.append(obj.cell_contents)
            except ValueError:  # an empty cell
                pass
        elif _holder(obj) and not isinstance(obj, skipped):
            pending += list(vars(obj).values())  # Values, the ledger's records, cells
    return found


def frame_contents(frame: Translator) -> list[Any]:
    return [frame.locals, frame.cells, frame.stack, frame.returned]


def _holder(obj: Any) -> bool:
    """An object of ember's own capture (a Value, a ledger record, a cell stand-in)."""
    return (type(obj).__module__ or "").startswith("ember.capture") and hasattr(obj, "__dict__")
