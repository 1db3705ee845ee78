"""ember's AOTAutograd: torch-level fx graph -> functional aten graph(s) -> compiled callable.

The pipeline, one line per stage:

1. program.trace_inference / joint.trace_joint: trace the gm with ember's dispatch-level
   tracer (trace.py) into a functional aten graph (functionalize.py); for training, a joint
   forward+backward graph built from PyTorch's own derivative formulas;
2. partition.partition: split the joint graph into forward and backward (min-cut
   rematerialization decides what the forward saves);
3. `compile_aten(graph, example_inputs)` compiles each aten graph (ember's C++ backend, or
   `graph.forward` for `aot_eager`);
4. runtime.py: call them like the gm (input mutations copied back, aliasing outputs
   regenerated, an autograd.Function for training).

`aot_compile(gm, example_inputs, compile_aten)` follows torch.compile's backend protocol once
`compile_aten` is bound; `aot_eager` is it with `compile_aten = lambda g, ins: g.forward`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from ember import logs
from ember.aot.program import Program, lift_state, split_args, trace_inference
from ember.aot.runtime import InferenceRuntime

CompileAten = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Sequence[Any]]]

__all__ = ["aot_compile", "aot_eager", "eager_compile_aten", "AotFunction"]


def eager_compile_aten(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
    """The `aot_eager` 'compiler': run the aten graph with PyTorch's kernels."""
    return gm.forward


class AotFunction:
    """The callable a backend returns: picks (and lazily builds) the inference or training
    version for the current grad mode and the values of specialized int inputs."""

    def __init__(self, gm: torch.nn.Module, compile_aten: CompileAten) -> None:
        self.gm = gm
        self.compile_aten = compile_aten
        self.state = lift_state(gm)
        self._cache: dict[tuple[tuple[bool, ...], tuple[Any, ...]], Any] = {}

    def _build(self, args: Sequence[Any], training: bool) -> Callable[[Sequence[Any]], Any]:
        if training:
            from ember.aot.joint import build_training

            return build_training(self.gm, args, self.compile_aten)
        program = trace_inference(self.gm, args)
        _log_graph("inference", program)
        flat = program.flat_inputs(args)
        compiled = self.compile_aten(program.gm, list(flat))
        return InferenceRuntime(program, compiled)

    def runtime_for(self, args: Sequence[Any]) -> Callable[[Sequence[Any]], Any]:
        _, ints = split_args(args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tensors += [r.get() for r in self.state]
        grad_mask = tuple(t.requires_grad for t in tensors) if torch.is_grad_enabled() else ()
        key = (grad_mask, ints)
        runtime = self._cache.get(key)
        if runtime is None:
            runtime = self._build(args, any(grad_mask))
            self._cache[key] = runtime
        return runtime

    def __call__(self, *args: Any) -> Any:
        return self.runtime_for(args)(args)


def _log_graph(kind: str, program: Program) -> None:
    if logs.enabled("aot"):
        logs.log("aot", "%s graph:\n%s", kind, program.gm.print_readable(print_output=False))


def aot_compile(
    gm: torch.nn.Module, example_inputs: Sequence[Any], compile_aten: CompileAten
) -> Callable[..., Any]:
    """Compile a torch-level graph for the grad mode of the example inputs (others lazily)."""
    fn = AotFunction(gm, compile_aten)
    fn.runtime_for(list(example_inputs))
    return fn


def aot_eager(gm: torch.nn.Module, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """Backend: ember's aot pipeline with PyTorch's kernels running the aten graphs."""
    return aot_compile(gm, example_inputs, eager_compile_aten)
