"""The mutation ledger (seed 002's SideEffects): Python mutations are recorded during capture,
never performed, and replayed after the graph runs, final state only.

Covers attribute writes on objects that came from outside (modules, user objects), mutation of
lists and dicts from outside, global rebinding and closure-cell writes. Objects created during
capture need no entry: their state is their Value, rebuilt if they escape.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ember import logs
from ember.capture.autocast import leave_autocast
from ember.capture.sources import AttrSource, ItemSource, Source, global_source
from ember.capture.values.base import ConstantValue, Value, next_serial
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter


def _refill_method(container: Value) -> str | None:
    """How a container that cannot take slice assignment gets new contents."""
    from ember.capture.values.collection_types import DequeValue
    from ember.capture.values.containers import DictValue

    if isinstance(container, DictValue):
        return "update"
    if isinstance(container, DequeValue):
        return "extend"
    return None


class SideEffects:
    def __init__(self) -> None:
        self._attrs: dict[int, tuple[Value, dict[str, Value]]] = {}
        self._deleted: dict[int, tuple[Value, set[str]]] = {}
        """Attributes of outside objects that the trace deleted (`del obj.name`), which
        the object had at entry (guarded); replayed as `del obj.name` before the stores
        (an attribute deleted and set again moves to the end of the instance dict)."""
        self._containers: dict[int, Value] = {}
        self._globals: dict[tuple[int, str], tuple[dict, str, Value]] = {}
        self._cells: dict[int, tuple[Any, Value]] = {}
        self._iterators: dict[int, Any] = {}
        """List and tuple iterators from outside that the trace pulled."""
        self._exits: list[Value] = []
        """torch.autocast objects from outside whose block the trace left (their real
        `__exit__` runs after the graph: capture/autocast.py)."""
        self.version = 0
        self.advances = 0
        """Counts every recorded mutation, also of objects made during capture, so a graph
        break can tell whether a failed instruction had already changed Python state."""
        self._fence: tuple[int, str] | None = None

    @contextlib.contextmanager
    def fence(self, what: str) -> Iterator[None]:
        """While a higher-order op's body is traced, it may change only values made inside
        it: the body becomes one graph node that may run again (a checkpoint's recomputation)
        or not at all (cond's other branch), so no change may escape it."""
        outer = self._fence
        self._fence = (next_serial(), what)
        try:
            yield
        finally:
            self._fence = outer

    def _check_fence(self, owner: Value | None, what: str) -> None:
        if self._fence is None:
            return
        if owner is None or owner.source is not None or owner.serial < self._fence[0]:
            raise Unsupported(
                BreakReason.SIDE_EFFECT,
                f"the function of {self._fence[1]} changes {what}, which lives outside it",
                hint="a checkpointed function, a cond branch or a custom autograd.Function "
                "captured as one node may only compute tensors; "
                "move the mutation out of it",
            )

    def touch(self, owner: Value | None = None) -> None:
        """A change recorded nowhere else: to `owner`, a value made during capture, or with
        no owner, to a tensor (tensor writes in a body are checked by its graph)."""
        if owner is not None:
            self._check_fence(owner, owner.describe())
        self.version += 1

    def advance(self, owner: Value | None = None) -> None:
        """An iterator made during capture was pulled: a change to restore points (the
        version) that is not a side effect a user could see (`advances` counts them)."""
        if owner is not None:
            self._check_fence(owner, owner.describe())
        self.version += 1
        self.advances += 1

    # recording (and reading back: the ledger is the truth during capture)
    def store_attr(self, obj: Value, name: str, value: Value) -> None:
        self._check_fence(obj, f"attribute {name!r} of {obj.describe()}")
        self.version += 1
        self._attrs.setdefault(id(obj), (obj, {}))[1][name] = value

    def delete_attr(self, obj: Value, name: str) -> None:
        """`del obj.name` of an attribute the outside object had at entry (the caller
        guards that): a pending write to it is dropped, the deletion replayed."""
        self._check_fence(obj, f"attribute {name!r} of {obj.describe()}")
        self.version += 1
        entry = self._attrs.get(id(obj))
        if entry is not None:
            entry[1].pop(name, None)
        self._deleted.setdefault(id(obj), (obj, set()))[1].add(name)

    def is_deleted(self, obj: Value, name: str) -> bool:
        entry = self._deleted.get(id(obj))
        return entry is not None and name in entry[1]

    def load_attr(self, obj: Value, name: str) -> Value | None:
        entry = self._attrs.get(id(obj))
        return entry[1].get(name) if entry else None

    def drop_attr(self, obj: Value, name: str) -> None:
        """Forget a pending attribute write (the attribute is deleted again)."""
        self._check_fence(obj, f"attribute {name!r} of {obj.describe()}")
        self.version += 1
        del self._attrs[id(obj)][1][name]

    def has_attr_writes(self, obj: Value) -> bool:
        """Whether the trace set or deleted attributes of `obj`."""
        entry = self._attrs.get(id(obj))
        deleted = self._deleted.get(id(obj))
        return bool(entry and entry[1]) or bool(deleted and deleted[1])

    def mutated(self, container: Value) -> None:
        self._check_fence(container, container.describe())
        self.version += 1
        if container.source is not None:
            self._containers[id(container)] = container

    def is_mutated(self, container: Value) -> bool:
        """Whether the trace changed the contents of this outside container."""
        return id(container) in self._containers

    def changed_outside(self) -> list[Value]:
        """Outside containers and objects the trace changed (list, dict and set contents,
        attributes)."""
        objects = [obj for obj, attrs in self._attrs.values() if attrs and obj.source]
        seen = {id(obj) for obj in objects}
        objects += [obj for obj, names in self._deleted.values() if names and id(obj) not in seen]
        return [*self._containers.values(), *objects]

    def store_global(self, f_globals: dict, name: str, value: Value) -> None:
        self._check_fence(None, f"the global {name!r}")
        self.version += 1
        self._globals[(id(f_globals), name)] = (f_globals, name, value)

    def load_global(self, f_globals: dict, name: str) -> Value | None:
        entry = self._globals.get((id(f_globals), name))
        return entry[2] if entry else None

    def store_cell(self, cell: Any, value: Value) -> None:
        """A write to a real cell (a RealCell: replayed into the cell it reloads)."""
        self._check_fence(None, "a closure variable")
        self.version += 1
        self._cells[id(cell.cell)] = (cell, value)

    def moved(self, iterator: Value) -> None:
        """An iterator from outside was pulled (values/containers.py OutsideIterator)."""
        self._check_fence(iterator, iterator.describe())
        self.version += 1
        self._iterators[id(iterator)] = iterator

    def exit_autocast(self, manager: Value) -> None:
        self.version += 1
        self.advances += 1
        self._exits.append(manager)

    def load_cell(self, cell: Any) -> Value | None:
        entry = self._cells.get(id(cell))
        return entry[1] if entry else None

    def __bool__(self) -> bool:
        return bool(
            self._attrs
            or any(names for _, names in self._deleted.values())
            or self._containers
            or self._globals
            or self._cells
            or self._iterators
            or self._exits
        )

    def pending_values(self) -> list[Value]:
        """Every value the replay will rebuild (their tensors must be graph outputs)."""
        values: list[Value] = []
        for _, attrs in self._attrs.values():
            values.extend(attrs.values())
        values.extend(self._containers.values())
        values.extend(v for _, _, v in self._globals.values())
        values.extend(v for _, v in self._cells.values())
        return values

    def constant_writes(self, root_globals: dict) -> list[tuple[Source, Any]]:
        """The constants stored to attributes of objects from outside and to globals, by
        where they go (sources as a capture of a function with `root_globals` reads them)."""
        found = [
            (source, value.value)
            for obj, attrs in self._attrs.values()
            if obj.source is not None
            for name, value in attrs.items()
            if isinstance(value, ConstantValue)
            # a module's plain attribute is read as an item of its instance dict (or, past
            # a class that has the name, as the attribute): both, whichever the read was
            for source in (
                AttrSource(obj.source, name),
                ItemSource(AttrSource(obj.source, "__dict__"), name),
            )
        ]
        found += [
            (global_source(f_globals, root_globals, name), value.value)
            for f_globals, name, value in self._globals.values()
            if isinstance(value, ConstantValue)
        ]
        return found

    def replay(self, em: Emitter) -> None:
        """Emit the stores that bring the outside world to its final state.

        Every new value is built first and only then stored: a value may read state that
        another store replaces (`a.x, a.y = a.y, a.x`, a dict rebuilt from its own items)."""
        cg = em.cg
        stores: list[tuple[str, Any]] = []
        for container in self._containers.values():
            logs.log("side_effects", "replay contents of %s", container.source.name())
            em.rebuild_fresh(container)
            stores.append(("container", container))
        for obj, attrs in self._attrs.values():
            for name, value in attrs.items():
                logs.log("side_effects", "replay %s.%s = ...", obj.source.name(), name)
                em.reconstruct(value)
                stores.append(("attr", (obj, name)))
        for f_globals, name, value in self._globals.values():
            logs.log("side_effects", "replay global %s = ...", name)
            em.reconstruct(value)
            stores.append(("global", (f_globals, name)))
        for cell, value in self._cells.values():
            logs.log("side_effects", "replay closure cell write")
            em.reconstruct(value)
            stores.append(("cell", cell))
        for obj, names in self._deleted.values():  # after the reads, before the stores
            for name in sorted(names):
                logs.log("side_effects", "replay del %s.%s", obj.source.name(), name)
                obj.source.emit(cg)
                cg.emit("DELETE_ATTR", name)
        for kind, target in reversed(stores):  # each store takes its value from the top
            if kind == "container":
                self._store_contents(cg, target)
            elif kind == "attr":
                self._store_attr(cg, *target)
            elif kind == "global":
                cg.load_const(target[0])
                cg.load_const(target[1])
                cg.store_subscr()
            else:
                target.emit(cg)
                cg.store_attr("cell_contents")
        for iterator in self._iterators.values():
            logs.log("side_effects", "replay the position of %s", iterator.source.name())
            iterator.replay_position(em)
        for manager in self._exits:
            logs.log("side_effects", "leave the autocast block of %s", manager.source.name())
            with cg.callee():
                cg.load_const(leave_autocast)
            em.reconstruct(manager)
            cg.call(1)
            cg.pop_top()

    @staticmethod
    def _store_attr(cg: Any, obj: Value, name: str) -> None:
        """`obj.name = <top of stack>`. The ledger holds the final state of the instance
        dict: for a class with its own `__setattr__` in Python (which the trace inlined, so
        its effects are already in the ledger) the store bypasses it with
        `object.__setattr__`, or the replay would run it a second time."""
        from ember.capture.values.objects import UserObjectValue, python_override

        if not (isinstance(obj, UserObjectValue) and python_override(obj.cls, "__setattr__")):
            obj.source.emit(cg)
            cg.store_attr(name)
            return
        # stack: value, object.__setattr__ and its NULL, obj, name, value
        cg.load_const(object.__setattr__, push_null=True)
        obj.source.emit(cg)
        cg.load_const(name)
        cg.copy(5)
        cg.call(3)
        cg.pop_top()
        cg.pop_top()

    @staticmethod
    def _store_contents(cg: Any, container: Value) -> None:
        """Replace a container's contents by the new ones on top of the stack: a list by
        slice assignment (list's own for a list subclass's items, whatever its class's
        `__setitem__`), a dict or deque by `clear()` and `update`/`extend`."""
        source = container.source
        if getattr(container, "store_past_class", False):  # a list subclass's items
            # stack: contents, list.__setitem__ and its NULL, obj, [:], contents
            cg.load_const(list.__setitem__, push_null=True)
            source.emit(cg)
            cg.load_const(slice(None))
            cg.copy(5)
            cg.call(3)
            cg.pop_top()
            cg.pop_top()
            return
        refill = _refill_method(container)
        if refill is not None:  # stack: contents
            source.emit(cg)
            cg.load_method("clear")
            cg.call(0)
            cg.pop_top()
            source.emit(cg)
            cg.load_method(refill)  # contents, the method's callable pair
            cg.swap(2)
            cg.swap(3)  # the method's callable pair, contents
            cg.call(1)
            cg.pop_top()
            return
        source.emit(cg)
        cg.load_const(None)
        cg.load_const(None)
        cg.build("SLICE", 2)
        cg.store_subscr()
