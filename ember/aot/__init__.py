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
`compile_aten` is bound; `aot_eager` is it with PyTorch's kernels running the graphs
(eager_runner.py: `g.forward`, plus freeing values after their last use). A compiled callable
that sets `boxed_call = True` is called as `fn(list_of_tensors)` and may clear the list, so
saved activations die as soon as the backward has used them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from ember import config, logs, torch_compat
from ember.aot.eager_runner import eager_compile_aten
from ember.aot.higher_order import compile_with_cond, has_cond
from ember.aot.program import (
    Program,
    backend_examples,
    check_input_aliasing,
    devices_of,
    lift_state,
    split_args,
    trace_inference,
)
from ember.aot.runtime import InferenceRuntime
from ember.aot.symbolic import hint, placeholder_value, symbolic_inputs
from ember.aot.trace import RunEagerly, TraceError

CompileAten = Callable[[fx.GraphModule, list[torch.Tensor]], Callable[..., Sequence[Any]]]

__all__ = ["aot_compile", "aot_eager", "eager_compile_aten", "AotFunction"]


class AotFunction:
    """The callable a backend returns: picks (and lazily builds) the inference or training
    version for the current grad mode and the values of specialized int inputs."""

    def __init__(
        self, gm: torch.nn.Module, compile_aten: CompileAten, symbolic: list[Any] | None = None
    ) -> None:
        self.gm = gm
        self.compile_aten = compile_aten
        self.symbolic = symbolic
        """Per input, its symbolic stand-in when the graph has symbolic sizes (see
        symbolic.symbolic_inputs): every trace uses them, so one trace serves all sizes."""
        self._sizes = {i for i, s in enumerate(symbolic or ()) if isinstance(s, torch.SymInt)}
        self.state = lift_state(gm)
        self._cache: dict[tuple[Any, ...], Callable[[Sequence[Any]], Any]] = {}
        self._fast: Callable[..., Any] | None = None
        self._fast_arity = -1
        self.enables_grad = isinstance(gm, torch.fx.GraphModule) and any(
            n.op == "call_function" and n.target is torch_compat.set_grad_enabled and n.args[0]
            for n in gm.graph.nodes
        )
        """The graph turns grad mode on itself (`with torch.enable_grad()` inside the
        compiled region): then inputs that require grad matter even when called under
        no_grad."""

    def _build(self, args: Sequence[Any], training: bool) -> Callable[[Sequence[Any]], Any]:
        if training:
            from ember.aot.joint import build_training

            return build_training(self.gm, args, self.compile_aten, self.symbolic)
        program = trace_inference(self.gm, args, self.symbolic)
        _log_graph("inference", program)
        flat = program.flat_inputs(args)
        check_input_aliasing(flat, program.mutated)
        compiled = self.compile_aten(program.gm, backend_examples(program.gm, flat))
        return InferenceRuntime(program, compiled)

    def _build_or_run(self, args: Sequence[Any], training: bool) -> Callable[[Sequence[Any]], Any]:
        """A graph with symbolic sizes that ember cannot trace (a symbolic float, say) runs
        as the captured torch-level graph, logged, rather than failing the user's program
        at its second size (EMBER_STRICT=1 raises, as for any backend failure). A graph
        whose autograd behaviour only eager reproduces (trace.RunEagerly) runs uncompiled
        whatever the setting: that is what the program does, not a failure to compile it."""
        if torch_compat.enters_inference_mode(self.gm):
            logs.log("aot", "graph runs uncompiled, as eager: it enters inference mode")
            return _run_torch_level(self.gm)
        try:
            return self._build(args, training)
        except RunEagerly as e:
            logs.log("aot", "graph runs uncompiled, as eager: %s", e)
            return _run_torch_level(self.gm)
        except TraceError as e:
            if self.symbolic is None or config.current().strict:
                raise
            logs.log("aot", "graph with symbolic sizes runs uncompiled: %s", e)
            return _run_torch_level(self.gm)

    def key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """Which inputs need grad (under grad mode) and the values of non-tensor inputs
        (not of symbolic sizes: one trace serves them all)."""
        grad = torch_compat.records_autograd() or self.enables_grad
        sizes = self._sizes
        parts: list[Any] = [
            (grad and a.requires_grad)
            if isinstance(a, torch.Tensor)
            else "size"
            if i in sizes
            else ("v", a)
            for i, a in enumerate(args)
        ]
        if grad:
            parts += [r.get().requires_grad for r in self.state]
        return tuple(parts)

    def runtime_for(self, args: Sequence[Any]) -> Callable[[Sequence[Any]], Any]:
        split_args(args)  # refuses symbolic sizes clearly (they do not hash)
        key = self.key(args)
        runtime = self._cache.get(key)
        if runtime is None:
            training = any(k is True for k in key)
            if training and not torch.is_grad_enabled():
                # grad is off outside and on inside the graph: autograd.Function outputs
                # would not require grad, so the torch-level graph runs as it is
                logs.log("aot", "graph enables grad under no_grad: running it uncompiled")
                runtime = _run_torch_level(self.gm)
            elif len(devices := devices_of(args, self.state)) > 1:
                # one traced graph holds one device's tensors; eager moves between them
                where = ", ".join(sorted(map(str, devices)))
                logs.log("aot", "graph inputs on %s: running it uncompiled", where)
                runtime = _run_torch_level(self.gm)
            else:
                runtime = self._build_or_run(args, training)
            self._cache[key] = runtime
            fast_ok = self._fast is None and not self.enables_grad
            if isinstance(runtime, InferenceRuntime) and runtime.simple and fast_ok:
                # tensors in, the graph's outputs out, nothing to copy back: the compiled
                # callable is the whole call whenever no gradient is needed
                self._fast, self._fast_arity = runtime.compiled, len(args)
                self._fast_tensors = [i for i, a in enumerate(args) if i not in self._sizes]
        return runtime

    def __call__(self, *args: Any) -> Any:
        fast = self._fast
        if fast is not None and len(args) == self._fast_arity:
            try:
                needs_grad = torch_compat.records_autograd() and (
                    any(a.requires_grad for a in args)
                    if not self._sizes
                    else any(args[i].requires_grad for i in self._fast_tensors)
                )
            except AttributeError:  # a non-tensor argument: the general path
                needs_grad = True
            if not needs_grad:
                return fast(*args)
        try:
            runtime = self._cache.get(self.key(args))
        except TypeError:  # an unhashable argument: runtime_for says what is wrong
            runtime = None
        if runtime is None:
            runtime = self.runtime_for(args)
        return runtime(args)


def _run_torch_level(gm: torch.nn.Module) -> Callable[[Sequence[Any]], Any]:
    def run(args: Sequence[Any]) -> Any:
        return gm.forward(*args)  # not gm(): global module hooks are the user's, traced

    return run


def _log_graph(kind: str, program: Program) -> None:
    if logs.enabled("aot"):
        logs.log("aot", "%s graph:\n%s", kind, program.gm.print_readable(print_output=False))


def _segment_function(segment: fx.GraphModule, compile_aten: CompileAten) -> AotFunction:
    """A segment of a graph split around cond nodes: symbolic where its inputs are."""
    examples = [placeholder_value(n) for n in segment.graph.find_nodes(op="placeholder")]
    return AotFunction(segment, compile_aten, symbolic_inputs(segment, examples))


def aot_compile(
    gm: torch.nn.Module, example_inputs: Sequence[Any], compile_aten: CompileAten
) -> Callable[..., Any]:
    """Compile a torch-level graph for the grad mode of the example inputs (others lazily).
    A graph with torch.cond nodes is compiled in segments around them (aot/higher_order.py)."""
    if has_cond(gm):
        return compile_with_cond(gm, lambda segment: _segment_function(segment, compile_aten))
    fn = AotFunction(gm, compile_aten, symbolic_inputs(gm, example_inputs))
    fn.runtime_for([hint(a) for a in example_inputs])
    return fn


def aot_eager(gm: torch.nn.Module, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """Backend: ember's aot pipeline with PyTorch's kernels running the aten graphs."""
    return aot_compile(gm, example_inputs, eager_compile_aten)
