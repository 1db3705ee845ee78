"""The per-code-object cache: entries of (guard function, replacement function), kept in
the order they were made; a call tries the entry that matched last first (`lookup`). A
miss captures anew; past the recompile limit the code runs eagerly from then on.

Ownership: a compiled function (the wrapper `ember.compile` returns, or one that break code
calls) owns its `FrameCache`; wrappers of the same code with the same options share it
through a weak registry (options compare equal when asked for alike, so each block of a
model compiled on its own shares its class's forward cache). Nothing global keeps a cache,
an entry or a user's object alive: when the last wrapper goes, its entries go, with the
`__compiled_fn_N` each installed in the user's globals. An entry whose guard names an object
by identity (a function, a class) is dropped when that object dies; modules are guarded by
type, so no entry holds a model.
"""

from __future__ import annotations

import dataclasses
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ember.capture.guards import GuardFunction
from ember.capture.shapes import SizeRecord
from ember.capture.sources import Source
from ember.errors import Unsupported


@dataclasses.dataclass(slots=True, weakref_slot=True, eq=False)
class CacheEntry:
    guard: GuardFunction
    fn: Callable[..., Any]
    """The replacement function (the generated code with the user function's globals)."""
    code: types.CodeType
    graph: torch.fx.GraphModule | None
    compiled_name: str | None
    graph_break: Unsupported | None = None
    """Why the capture stopped early (the rest runs in a resume function), if it did."""
    sizes: SizeRecord | None = None
    """The argument sizes the capture saw (automatic dynamic compares a missed call's)."""
    finalizers: list[weakref.finalize] = dataclasses.field(default_factory=list)
    """Drop this entry when an object its guard holds by identity dies; remove its
    `__compiled_fn_N` from the user's globals when the entry goes."""

    def release(self) -> None:
        """Run the cleanups now (the entry was dropped by a reset)."""
        for finalizer in self.finalizers:
            finalizer()
        self.finalizers.clear()


@dataclasses.dataclass(slots=True, weakref_slot=True, eq=False)
class FrameCache:
    code: types.CodeType | None = None
    options: Any = None
    entries: list[CacheEntry] = dataclasses.field(default_factory=list)
    eager_reason: Unsupported | str | None = None
    """Set when this code is no longer captured (unsupported construct, recompile limit)."""
    misses: list[str] = dataclasses.field(default_factory=list)
    dynamic: dict[Source, frozenset[int]] = dataclasses.field(default_factory=dict)
    """Automatic dynamic: the argument dims (-1: an int) seen changing between calls."""

    last: CacheEntry | None = None
    """The entry that matched most recently: tried first (a model whose first call changes
    its own state, as transformers' config.problem_type, matches its second entry ever
    after; alternating shapes are rare)."""

    def lookup(self, args: tuple, kwargs: dict) -> CacheEntry | None:
        """An entry whose guard holds for this call (the last one that matched, if it
        still does; else the first in order), or None. `find` with the entries' own
        guards, written out: it runs on every call."""
        last = self.last
        if last is not None and last.guard.check(*args, **kwargs):
            return last
        for entry in self.entries:
            if entry is not last and entry.guard.check(*args, **kwargs):
                self.last = entry
                return entry
        return None

    def find(self, matches: Callable[[CacheEntry], bool]) -> CacheEntry | None:
        """The entry `matches` accepts, in `lookup`'s order (a closure's wrapper checks each
        entry's guard bound to its own cells)."""
        last = self.last
        if last is not None and matches(last):
            return last
        for entry in self.entries:
            if entry is not last and matches(entry):
                self.last = entry
                return entry
        return None

    def add(self, entry: CacheEntry, installed: tuple[dict, str] | None) -> None:
        """Keep `entry`, tied to the lives of the objects its guard names by identity."""
        self.entries.append(entry)
        self.last = entry  # made for the call that missed: the next one is likely alike
        this, held = weakref.ref(self), weakref.ref(entry)
        for obj in entry.guard.identities():
            entry.finalizers.append(weakref.finalize(obj, _drop, this, held))
        if installed is not None:
            entry.finalizers.append(weakref.finalize(entry, _uninstall, *installed))

    def clear(self) -> None:
        self.last = None
        entries, self.entries[:] = list(self.entries), []
        for entry in entries:
            entry.release()
        self.misses.clear()
        self.dynamic.clear()
        self.eager_reason = None


def _drop(cache_ref: weakref.ref, entry_ref: weakref.ref) -> None:
    """An object the entry's guard held by identity died: the entry can never match again."""
    cache, entry = cache_ref(), entry_ref()
    if cache is not None and entry is not None and entry in cache.entries:
        cache.entries.remove(entry)
        if cache.last is entry:
            cache.last = None
        entry.release()


def _uninstall(f_globals: dict, name: str) -> None:
    f_globals.pop(name, None)


_caches: weakref.WeakValueDictionary[tuple[types.CodeType, Any], FrameCache] = (
    weakref.WeakValueDictionary()
)
_latest: weakref.WeakValueDictionary[types.CodeType, FrameCache] = weakref.WeakValueDictionary()


def closures_share_entries(code: types.CodeType) -> bool:
    """Whether the closures of `code` share one cache (Dynamo's one cache per code object):
    the capture reads and writes their cells through the running closure (the guard is bound
    to each closure, `bind_to_closure`; generated code loads the cells from its own free
    slots; resume functions take them as cell parameters). Not for code using zero-argument
    `super()`, whose `__class__` cell must stay a free variable: such a method's closure is
    the same on every call anyway."""
    return "__class__" not in code.co_freevars


def cache_for(
    code: types.CodeType, options: Any = None, closure: tuple | None = None
) -> FrameCache:
    """The cache of one code object compiled with one set of options (a function compiled
    twice, say once with fullgraph=True, keeps separate entries), shared by the wrappers
    alive for them and by every closure of the code (a local function made again on each
    call of its maker): the entries' guards and code read the cells of the closure they run
    for (see closures_share_entries). Without options: the cache most recently created for
    the code (for inspection in tests and tools)."""
    if options is None:
        return _latest.get(code) or FrameCache()
    own = closure and not closures_share_entries(code)
    key = (code, options, tuple(map(id, closure)) if own else None)
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = _latest[code] = FrameCache(code, options)
    return cache


def live_caches() -> list[FrameCache]:
    return list(_caches.values())


def reset() -> None:
    # Emptied in place: compiled wrappers hold their cache and must see it empty.
    for cache in live_caches():
        cache.clear()


def bind_to_closure(entry: CacheEntry, fn: types.FunctionType) -> tuple[Callable, Callable]:
    """The guard check and replacement function of `entry` for another closure `fn` of the
    code it was captured for: the same code, reading `fn`'s cells and defaults (the guard
    checks the parameters a call leaves out with the values the replacement will see)."""
    check = entry.guard.check
    names = dict(check.__globals__)
    names["___closure"] = fn.__closure__
    bound = types.FunctionType(check.__code__, names, check.__name__, fn.__defaults__)
    bound.__kwdefaults__ = fn.__kwdefaults__
    bound.__qualname__ = fn.__qualname__
    replacement = types.FunctionType(
        entry.code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    replacement.__kwdefaults__ = fn.__kwdefaults__
    return bound, replacement
