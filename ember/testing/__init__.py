"""Test helpers: a counting backend and differential checks against eager PyTorch."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


class CompileCounter:
    """A backend that counts captures and ops and runs the graph as torch code."""

    def __init__(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        self.frame_count += 1
        self.graphs.append(gm)
        self.op_count += sum(n.op in ("call_function", "call_method") for n in gm.graph.nodes)
        return gm.forward

    def clear(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs.clear()


class CountingBackend(CompileCounter):
    """Counts graphs like CompileCounter, and compiles them with a named ember backend
    ("eager", "aot_eager", "ember")."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        from ember.backends import lookup

        self.backend = lookup(backend)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        super().__call__(gm, example_inputs)
        return self.backend(gm, example_inputs)


def assert_same(
    actual: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-6, path: str = "result"
) -> None:
    """Structural equality; tensors compared by dtype, shape, stride-free values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {actual!r}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.requires_grad == expected.requires_grad, f"{path}: requires_grad differs"
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}"
        )
        return
    assert type(actual) is type(expected), f"{path}: type {type(actual)} != {type(expected)}"
    if type(expected).__module__ == "numpy" and type(expected).__name__ == "ndarray":
        assert_same(torch.from_numpy(actual), torch.from_numpy(expected), path=path)
        return
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol=rtol, atol=atol, path=f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
    elif hasattr(expected, "__dict__") and not isinstance(expected, type):
        assert_same(vars(actual), vars(expected), rtol=rtol, atol=atol, path=f"{path}.__dict__")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def check_against_eager(
    fn: Callable,
    *args: Any,
    backend: Any = "eager",
    runs: int = 2,
    fullgraph: bool = True,
    frames: int | None = None,
    **kwargs: Any,
) -> Any:
    """Run fn eagerly and compiled on copies of the same inputs, `runs` times (so the cache
    path runs too); compare results and the inputs afterwards (mutations).

    With `frames`, a counting backend checks that exactly that many graphs were compiled
    over all runs (1 for a function captured whole: the later runs must hit the cache)."""
    import ember

    counter = None
    if frames is not None:
        counter = CompileCounter()
        backend = counter
    compiled = ember.compile(fn, backend=backend, fullgraph=fullgraph)
    result = None
    for _ in range(runs):
        eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
        comp_args, comp_kwargs = copy.deepcopy((args, kwargs))
        expected = fn(*eager_args, **eager_kwargs)
        result = compiled(*comp_args, **comp_kwargs)
        assert_same(result, expected)
        assert_same(comp_args, eager_args, path="args after call")
        assert_same(comp_kwargs, eager_kwargs, path="kwargs after call")
    if counter is not None:
        assert counter.frame_count == frames, (
            f"expected {frames} compiled graph(s), the backend saw {counter.frame_count}"
        )
    return result


def program_ids(cases: list[tuple]) -> list[str]:
    """Test ids for a table of (program, argument makers) rows: the name without `p_`."""
    return [getattr(fn, "__name__", "program").removeprefix("p_") for fn, *_ in cases]


def check_program(fn: Callable, makers: list[Callable[[], Any]], frames: int = 1) -> Any:
    """One row of a program table: fresh arguments from the makers, then check_against_eager
    with the expected number of captures."""
    return check_against_eager(fn, *[make() for make in makers], frames=frames)
