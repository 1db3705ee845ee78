"""The per-code-object cache: entries of (guard function, replacement function), tried in
order. A miss captures anew; past the recompile limit the code runs eagerly from then on.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from ember.capture.guards import GuardFunction
from ember.errors import Unsupported


@dataclasses.dataclass(slots=True)
class CacheEntry:
    guard: GuardFunction
    fn: Callable[..., Any]
    """The replacement function (the generated code with the user function's globals)."""
    code: types.CodeType
    graph: torch.fx.GraphModule | None
    compiled_name: str | None
    graph_break: Unsupported | None = None
    """Why the capture stopped early (the rest runs in a resume function), if it did."""


@dataclasses.dataclass(slots=True)
class FrameCache:
    entries: list[CacheEntry] = dataclasses.field(default_factory=list)
    eager_reason: Unsupported | str | None = None
    """Set when this code is no longer captured (unsupported construct, recompile limit)."""
    misses: list[str] = dataclasses.field(default_factory=list)


_caches: dict[tuple[types.CodeType, Any], FrameCache] = {}


_latest: dict[types.CodeType, FrameCache] = {}


def cache_for(code: types.CodeType, options: Any = None) -> FrameCache:
    """The cache of one code object compiled with one set of options (a function compiled
    twice, say once with fullgraph=True, keeps separate entries). Without options: the
    cache most recently created for the code (for inspection in tests and tools)."""
    if options is None:
        return _latest.get(code) or FrameCache()
    key = (code, options)
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = _latest[code] = FrameCache()
    return cache


def reset() -> None:
    # Emptied in place: compiled wrappers hold their cache's entry list and must see it empty.
    for cache in _caches.values():
        cache.entries.clear()
        cache.misses.clear()
        cache.eager_reason = None
