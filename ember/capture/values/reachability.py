"""What values of the trace a set of roots can reach: which generators something still
holds (generator_drop: CPython closes one whose last reference goes) and whether an
attribute write would make a value refer to itself (break code cannot make a cycle again).
Conservative: any of ember's capture objects reachable through attributes, containers,
cells or generator frames counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator
    from ember.capture.values.base import Value


def reachable(roots: list[Any], wanted: list[Any]) -> list[Any]:
    """Those of `wanted` that something reachable from `roots` refers to (conservative:
    any Value reachable through attributes, containers, cells or frames counts)."""
    from ember.capture.output_graph import OutputGraph
    from ember.capture.translator import CaptureContext, Translator
    from ember.capture.values.iterators import GeneratorIterator

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


def note_cycle(tx: Translator, owner: Any, stored: list[Any]) -> None:
    """Record (`owner.cycle_at`) the instruction at which storing `stored` into `owner`, a
    value made in the trace, makes it refer to itself (`n.me = n`, `a.b = b; b.a = a`,
    `lst.append(lst)`, `d["self"] = d`). Nothing is refused here: only if break code later
    has to make it again does the capture run again and break there (codegen.py
    CycleNotRebuilt), so a cycle that dies in the graph costs nothing."""
    from ember.capture.values.base import ConstantValue
    from ember.capture.values.tensor import TensorValue

    if owner.cycle_at is not None or owner.source is not None:
        return
    holders = [v for v in stored if not isinstance(v, ConstantValue | TensorValue)]
    if holders and reachable(holders, [owner]):
        owner.cycle_at = tx.steps_before_current()


def frame_contents(frame: Translator) -> list[Any]:
    return [frame.locals, frame.cells, frame.stack, frame.returned]


def _holder(obj: Any) -> bool:
    """An object of ember's own capture (a Value, a ledger record, a cell stand-in)."""
    return (type(obj).__module__ or "").startswith("ember.capture") and hasattr(obj, "__dict__")


class CycleNotRebuilt(Unsupported):
    """Break code would have to make values of the trace that refer to each other (`n.me =
    n`, `lst.append(lst)`): `step` is the earliest instruction, recorded by `note_cycle`,
    at which one of them closed the cycle (None if unknown), where a capture run again
    breaks so that CPython makes it."""

    def __init__(self, value: Value, members: list[Value]) -> None:
        super().__init__(
            BreakReason.UNSUPPORTED_OBJECT,
            f"{value.describe()} made during capture refers to itself: it cannot be rebuilt",
        )
        self.value = value
        steps = [m.cycle_at for m in members if m.cycle_at is not None]
        self.step = min(steps) if steps else None
