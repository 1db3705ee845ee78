"""Issue 12's hygiene: ember's caches keep nothing of the user's alive. A compiled model is
freed when the user drops it (with the compiled wrapper, or on its own while the compiled
function lives on); `__compiled_fn_N` globals leave with their cache entries and on
`ember.reset()`; resume functions are never installed in the user's globals; and
`ember.stats()` counts since the last reset."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import ember
from ember.capture import cache as frame_cache


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x).relu()
        print("a graph break")
        return self.lin(y) + x


def _installed() -> list[str]:
    return [k for k in globals() if k.startswith(("__compiled_fn_", "__resume_"))]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_compiled_model_is_freed_when_dropped(backend, capsys):
    def run():
        model = Block()
        compiled = ember.compile(model, backend=backend)
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), model(x))
        compiled(x)
        assert any(k.startswith("__compiled_fn_") for k in _installed())
        assert not any(k.startswith("__resume_") for k in _installed())
        return weakref.ref(model), weakref.ref(compiled)

    model_ref, compiled_ref = run()
    gc.collect()
    assert model_ref() is None and compiled_ref() is None
    assert _installed() == []
    assert not [c for c in frame_cache.live_caches() if c.code is Block.forward.__code__]


def step(model, x):
    return model(x).sum()


def test_models_passed_to_a_compiled_function_are_freed():
    compiled = ember.compile(step, backend="eager")
    refs = []
    for _ in range(3):
        model = nn.Linear(4, 2)
        torch.testing.assert_close(compiled(model, torch.ones(1, 4)), step(model, torch.ones(1, 4)))
        refs.append(weakref.ref(model))
        del model
        gc.collect()
    assert all(r() is None for r in refs)
    # a module is guarded by its type, its parameters read at each call: one entry serves
    # every Linear(4, 2), and holds none of them
    assert len(frame_cache.cache_for(step.__code__).entries) == 1
    recompiles = ember.stats()["recompiles"]
    model = nn.Linear(4, 2)
    torch.testing.assert_close(compiled(model, torch.ones(1, 4)), step(model, torch.ones(1, 4)))
    assert ember.stats()["recompiles"] == recompiles


def seed(x):
    return (x * 2).sin()


def test_reset_removes_what_ember_installed():
    compiled = ember.compile(seed, backend="eager")
    compiled(torch.ones(3))
    assert len(_installed()) == 1
    assert ember.stats()["graphs"] == 1
    ember.reset()
    assert _installed() == []
    assert ember.stats() == {
        "graphs": 0,
        "graph_breaks": 0,
        "break_reasons": [],
        "recompiles": 0,
        "eager_frames": 0,
    }
    torch.testing.assert_close(compiled(torch.ones(3)), seed(torch.ones(3)))  # captures again
    assert ember.stats()["graphs"] == 1


def test_stats_count_breaks_recompiles_and_eager_frames(capsys):
    def f(x, n):
        y = x + n
        print("break")
        return y * 2

    compiled = ember.compile(f, backend="eager")
    compiled(torch.ones(2), 1)
    compiled(torch.ones(2), 2)  # the int is guarded: a recompile
    stats = ember.stats()
    # x + n twice (n is guarded), y * 2 once (the resume function's entry serves both)
    assert stats["graphs"] == 3 and stats["graph_breaks"] == 2 and stats["recompiles"] == 1
    assert (
        "print" in stats["break_reasons"][0]
        and "test_fidelity_hygiene.py" in (stats["break_reasons"][0])
    )

    def g(x):
        global _SCRATCH
        _SCRATCH = 1
        del _SCRATCH  # DELETE_GLOBAL is not captured, nor resumed after: the frame runs eagerly
        return x + 1

    ember.compile(g, backend="eager")(torch.ones(2))
    assert ember.stats()["eager_frames"] == 1
