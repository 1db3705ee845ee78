"""What values of the trace a set of roots can reach: which generators something still
holds (generator_drop: CPython closes one whose last reference goes) and whether an
attribute write would make a value refer to itself (break code cannot make a cycle again).
Conservative: any of ember's capture objects reachable through attributes, containers,
cells or generator frames counts."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator
    from ember.capture.values.base import Value


def reachable(roots: list[Any], wanted: list[Any], visited: list | None = None) -> list[Any]:
    """Those of `wanted` that something reachable from `roots` refers to (conservative:
    any Value reachable through attributes, containers, cells or frames counts). Every
    object met is appended to `visited` if given."""
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
        if visited is not None:
            visited.append(obj)
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
    from ember.capture.values.base import ConstantValue, Value
    from ember.capture.values.tensor import TensorValue

    if owner.source is not None:
        return
    holders = [v for v in stored if not isinstance(v, ConstantValue | TensorValue)]
    visited: list[Any] = []
    if holders and reachable(holders, [owner], visited):
        if owner.cycle_at is None:
            owner.cycle_at = tx.steps_before_current()
        for obj in visited:  # the members, and maybe more: made in two steps (see below)
            if isinstance(obj, Value) and obj.source is None:
                obj.in_cycle = True


def rebuild_in_two_steps(em: Emitter, value: Value) -> str | None:
    """Make `value`, a member of a cycle, as an empty object or container first, kept in a
    temporary before its contents are made, so a member that refers back to it loads it
    (an object: `object.__new__` and its attributes; a list: `extend`; a dict: `update`).
    The temporary's name, or None for a value made in one step (the Emitter then meets the
    cycle and the capture breaks where it was closed)."""
    from ember.capture.values.built_modules import BuiltModuleValue
    from ember.capture.values.containers import DictValue, ListValue
    from ember.capture.values.objects import UserObjectValue, empty_object, fill_object

    if not value.in_cycle or value.source is not None:
        return None
    cg = em.cg
    if type(value) in (UserObjectValue, BuiltModuleValue) and value.made_class is None:
        shell, fill = (
            (empty_object, value.cls),
            (fill_object, lambda: em.attribute_map(value.attrs)),
        )
    elif type(value) is ListValue and value.list_type is list:
        shell, fill = (list,), (list.extend, lambda: _push_all(em, value.items, "LIST"))
    elif type(value) is DictValue and value.dict_type in (dict, OrderedDict) and not value.attrs:
        shell, fill = (value.dict_type,), (dict.update, lambda: _push_dict(em, value))
    else:
        return None
    cg.load_const(shell[0], push_null=True)
    for arg in shell[1:]:
        cg.load_const(arg)
    cg.call(len(shell) - 1)
    name = em.keep(value)
    cg.load_const(fill[0], push_null=True)
    cg.load_fast(name)
    fill[1]()
    cg.call(2)
    cg.pop_top()
    return name


def _push_all(em: Emitter, items: list[Value], kind: str) -> None:
    for item in items:
        em.reconstruct(item)
    em.cg.build(kind, len(items))


def _push_dict(em: Emitter, value: Any) -> None:
    from ember.capture.values.containers import key_value

    for k, v in value.items.items():
        em.reconstruct(key_value(k))
        em.reconstruct(v)
    em.cg.build("MAP", len(value.items))


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

    def __init__(self, value: Value, building: list[Value]) -> None:
        super().__init__(
            BreakReason.UNSUPPORTED_OBJECT,
            f"{value.describe()} made during capture refers to itself: it cannot be rebuilt",
        )
        self.value = value
        members = building[building.index(value) :]  # the cycle: rebuilt from `value` on
        steps = [m.cycle_at for m in members if m.cycle_at is not None]
        self.step = min(steps) if steps else None
