"""The joint forward+backward trace, and the assembly of a training callable.

Trace: run the gm's forward on meta tensors under ember's recorder (trace.py), then call
`torch.autograd.grad` on the meta outputs with meta tangents, still under the recorder, so
every op of PyTorch's own backward formulas lands in the same functional graph. No derivative
table lives in ember: what PyTorch's autograd does in eager is what the graph contains.

The joint graph takes (primals..., tangents...) and returns
(forward outputs..., mutated inputs' final values..., gradients of the differentiable
inputs...). partition.py splits it; runtime.TrainingRuntime runs the two halves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ember import logs
from ember.aot import channels_last
from ember.aot.partition import partition
from ember.aot.program import (
    Program,
    backend_examples,
    begin,
    check_input_aliasing,
    check_symbolic_floats,
    note_mutations,
    run_forward,
)
from ember.aot.runtime import InferenceRuntime, TrainingRuntime
from ember.aot.symbolic import example_input
from ember.aot.trace import RunEagerly, TraceError, check_functional
from ember.errors import BreakReason
from ember.torch_compat import without_dynamo


@dataclass
class JointGraph:
    """A traced joint graph and the counts that say how its outputs are laid out."""

    program: Program
    gm: fx.GraphModule
    num_primals: int
    num_tangents: int
    num_fwd_outputs: int  # user outputs + mutated inputs' final values
    diff_outputs: list[int]  # indices (into the user graph outputs) that get a tangent
    grad_inputs: list[int]  # flat input indices that get a gradient
    outs: list[Any]  # the user outputs' traced (meta) values
    grads: list[Any]  # the gradients' traced values (None: no gradient)


def _differentiable(t: Any) -> bool:
    if not isinstance(t, torch.Tensor):
        return False  # a symbolic size
    return t.requires_grad and (t.is_floating_point() or t.is_complex())


def trace_joint(
    gm: torch.nn.Module,
    args: Sequence[Any],
    symbolic: Sequence[Any] | None = None,
    channels_last: JointGraph | None = None,
) -> JointGraph | None:
    """Trace forward and backward together; None when no output needs a gradient.
    `channels_last`: the joint graph traced before in eager's layout; its candidate inputs
    are converted to channels-last at the entry (channels_last.py), its outputs' strides
    kept. None also where that retrace does not match it."""
    return without_dynamo(_trace_joint, gm, args, symbolic, channels_last)


def _trace_joint(
    gm: torch.nn.Module,
    args: Sequence[Any],
    symbolic: Sequence[Any] | None,
    eager: JointGraph | None = None,
) -> JointGraph | None:
    check_symbolic_floats(gm, symbolic)
    tracer, program, fakes, call_args = begin(gm, args, symbolic)
    grad_fns = [f.grad_fn if isinstance(f, torch.Tensor) else None for f in fakes]
    if eager is not None:
        positions = channels_last.candidates(fakes, len(fakes) - len(program.state))
        with tracer.recording():
            channels_last.convert(call_args, fakes, positions)
    with torch.enable_grad():
        graph_outs = run_forward(tracer, program, gm, fakes, call_args)
        if eager is not None:
            if not channels_last.same_program(eager.program, program):
                return None
            with tracer.recording():
                graph_outs = channels_last.outputs_in_eager_strides(graph_outs, eager.outs)
            if graph_outs is None:
                return None
    _check_rebased(program, fakes, grad_fns)
    diff_outputs = [k for k, o in enumerate(graph_outs) if _differentiable(o)]
    grad_inputs = [i for i, f in enumerate(fakes) if _differentiable(f)]
    if not diff_outputs or not grad_inputs:
        # nothing to differentiate: an input that requires grad was mutated under no_grad
        # (an optimizer's step; under grad the trace raised as eager does for a leaf), and
        # the inference runtime copies it back under no_grad, as eager left it
        return None
    # read the forward's values now: the backward must not change what the forward returns
    fwd_nodes = [tracer.value(o) for o in graph_outs] + [
        tracer.value(fakes[i]) for i in program.mutated
    ]
    tangents = []
    for k in diff_outputs:
        o = graph_outs[k]
        t = torch.empty(o.shape, dtype=o.dtype, device=o.device)  # meta, like o
        tracer.placeholder(f"tangents_{len(tangents) + 1}", t)
        tangents.append(t)
    with tracer.recording():
        try:
            grads = torch.autograd.grad(
                [graph_outs[k] for k in diff_outputs],
                [fakes[i] for i in grad_inputs],
                tangents,
                allow_unused=True,
            )
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                raise
            # eager raises this in the user's backward, after a forward that succeeds
            raise RunEagerly(
                BreakReason.SIDE_EFFECT, f"a value the backward needs is mutated: {e}"
            ) from e
    if eager is not None:
        with tracer.recording():
            grads = [
                channels_last.restrided(g, fakes[i]) if g is not None else None
                for g, i in zip(grads, grad_inputs, strict=True)
            ]
        if any(g is None and o is not None for g, o in zip(grads, eager.grads, strict=True)):
            return None
    grad_nodes = [tracer.value(g) if g is not None else None for g in grads]
    joint = tracer.finish_nodes(fwd_nodes + grad_nodes)
    check_functional(joint.graph)
    return JointGraph(
        program=program,
        gm=joint,
        num_primals=len(fakes),
        num_tangents=len(tangents),
        num_fwd_outputs=len(fwd_nodes),
        diff_outputs=diff_outputs,
        grad_inputs=grad_inputs,
        outs=list(graph_outs),
        grads=list(grads),
    )


def _check_rebased(program: Program, fakes: list, grad_fns: list) -> None:
    """An input that requires grad mutated in place under no_grad keeps its autograd
    history: the gradient of its later uses, taken with respect to the input's stand-in, is
    the input's gradient, as in eager. Mutated under grad (a non-leaf; a leaf raised as in
    eager), its history is rebased onto the in-place op, and the gradient with respect to
    the stand-in would be that of the *new* value: the graph runs eagerly instead."""
    for i in program.mutated:
        f = fakes[i]
        if f.requires_grad and f.grad_fn is not grad_fns[i]:
            raise RunEagerly(
                BreakReason.SIDE_EFFECT,
                f"input {i} requires grad and is mutated in place with grad enabled",
                hint="mutate it under torch.no_grad(), or mutate a clone",
            )


def build_training(
    gm: torch.nn.Module,
    args: Sequence[Any],
    compile_aten: Callable,
    symbolic: Sequence[Any] | None = None,
) -> Callable[[Sequence[Any]], Any]:
    """Trace, partition and compile both halves; returns the runtime for these inputs."""
    joint = trace_joint(gm, args, symbolic)
    if joint is None:
        from ember.aot.program import trace_inference

        program = trace_inference(gm, args, symbolic)
        flat = program.flat_inputs(args)
        return InferenceRuntime(
            program, compile_aten(program.gm, backend_examples(program.gm, flat))
        )
    choose = getattr(compile_aten, "channels_last_training", None)
    if choose is not None and symbolic is None:
        joint = _channels_last(gm, args, joint, choose)
    if logs.enabled("aot"):
        logs.log("aot", "joint graph:\n%s", joint.gm.print_readable(print_output=False))
    parts = partition(
        joint.gm, joint.num_primals, joint.num_fwd_outputs, mutated=joint.program.mutated
    )
    flat = joint.program.flat_inputs(args)
    check_input_aliasing(flat, joint.program.mutated)
    note_mutations(parts.forward, joint.program, joint.num_fwd_outputs)
    fwd = compile_aten(parts.forward, backend_examples(parts.forward, flat))

    def compile_backward(g: fx.GraphModule) -> Callable:
        # uninitialized examples: a backend reads layouts from examples, never values
        placeholders = g.graph.find_nodes(op="placeholder")
        return compile_aten(
            g, [example_input(n.meta["val"], joint.program.device) for n in placeholders]
        )

    if parts.split is not None:
        # the backward runs as two autograd nodes; the unsplit graph is not compiled
        first, second = (compile_backward(g) for g in (parts.split.first, parts.split.second))
        return TrainingRuntime(joint, parts, fwd, None, (first, second))
    return TrainingRuntime(joint, parts, fwd, compile_backward(parts.backward))


def _channels_last(
    gm: torch.nn.Module, args: Sequence[Any], joint: JointGraph, choose: channels_last.Choice
) -> JointGraph:
    """The joint graph traced again with its image inputs channels-last where the backend
    `choose`s so on the first trace's graph (channels_last.py); else `joint` itself."""
    flat = joint.program.flat_inputs(args)
    positions = channels_last.candidates(flat, len(flat) - len(joint.program.state))
    device = joint.program.device
    if not positions or device.type != "cpu" or not choose(joint.gm):
        return joint
    try:
        retraced = trace_joint(gm, args, None, joint)
    except (TraceError, RunEagerly) as e:  # the first trace stands: a layout is no reason
        channels_last.log_choice(positions, False, f"the retrace failed: {e}")
        return joint
    channels_last.log_choice(positions, retraced is not None, "" if retraced else "no match")
    return retraced if retraced is not None else joint
