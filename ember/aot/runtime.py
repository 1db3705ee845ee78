"""Runtime wrappers: call compiled aten graphs the way the torch-level gm would be called.

Inference: run the compiled functional graph, copy mutated inputs back, rebuild outputs
(views of inputs replayed on the caller's tensors). Training: a `torch.autograd.Function` per
compiled region whose forward runs the compiled forward graph and whose backward runs the
compiled backward graph (see joint.py / partition.py for how those are made).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.aot.partition import is_symbolic_graph
from ember.aot.program import (
    Program,
    apply_mutations,
    build_outputs,
    check_input_aliasing,
    is_plain_tuple,
)
from ember.aot.symbolic import traced_strides

Compiled = Callable[..., Sequence[Any]]


def call_compiled(fn: Compiled, args: list[Any]) -> Sequence[Any]:
    """Call a compiled graph; boxed ones take (and clear) the list so values die early."""
    if getattr(fn, "boxed_call", False):
        return fn.run_boxed(args) if hasattr(fn, "run_boxed") else fn(args)
    return fn(*args)


class InferenceRuntime:
    """Calls one compiled functional graph; no autograd involved (views of inputs, replayed
    outside the graph, still carry autograd like eager's)."""

    def __init__(self, program: Program, compiled: Compiled) -> None:
        self.program = program
        self.compiled = compiled
        # the common case, kept cheap for tiny graphs: tensors in, tensor tuple out
        self.simple = (
            not program.state
            and not program.mutated
            and all(k != "int" for k in program.arg_kinds)
            and is_plain_tuple(program)
        )

    def __call__(self, args: Sequence[Any]) -> Any:
        # no_grad: this runtime also serves graphs whose outputs need no gradient although
        # some inputs require grad; a backend running torch ops must not record autograd
        if self.simple:
            with torch.no_grad():
                return tuple(call_compiled(self.compiled, list(args)))
        flat = self.program.flat_inputs(args)
        check_input_aliasing(flat, self.program.mutated)
        with torch.no_grad():
            outs = call_compiled(self.compiled, list(flat))
        apply_mutations(self.program, flat, outs)
        return build_outputs(self.program, flat, outs)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _as_traced(saved: Sequence[torch.Tensor], strides: list[Any]) -> list:
    """Saved values with the strides the backward was compiled for: a backend may lay out
    the forward's outputs differently from eager, and a backward that bakes strides in must
    not read them wrongly. (Symbolic strides: symbolic.traced_strides.) The common case,
    every stride as traced, is one C-level pass (MobileNetV2 saves 352 values a step)."""
    if not isinstance(strides, _Static):
        strides = _Static(strides)
    if strides.all_static and list(map(_stride, saved)) == strides:
        return list(saved)
    out = list(saved)
    for i, (t, stride) in enumerate(zip(out, strides, strict=True)):
        if callable(stride):
            stride = stride(t)
        if stride is not None and t.stride() != stride:
            fixed = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
            out[i] = fixed.copy_(t)
    return out


_stride = torch.Tensor.stride


class _Static(list):
    """Per saved value, its traced strides (a tuple, or a function of the tensor where they
    are symbolic, or None); `all_static`: every item a tuple."""

    def __init__(self, strides: Sequence[Any]) -> None:
        super().__init__(strides)
        self.all_static = all(isinstance(s, tuple) for s in strides)


class _CompiledFunction(torch.autograd.Function):
    """One compiled region as one autograd node: compiled forward, compiled backward.

    Only the inputs that get a gradient are the node's tensor arguments (`*grads_of`, in
    `runtime.grad_inputs` order); all of them come in the list `flat`. Autograd handles
    each tensor argument of `apply` in Python (functorch's dead-wrapper unwrapping, the
    requires-grad scan) and C++: MobileNetV2's step passes 316 inputs of which 158 need a
    gradient (the rest: running statistics, batch counters, the image). A saved input that
    is not an argument is saved as an intermediate, with the same version check."""

    @staticmethod
    def forward(
        ctx: Any, runtime: TrainingRuntime, finals: list, flat: list, *grads_of: torch.Tensor
    ) -> tuple:
        outs = call_compiled(runtime.fwd, list(flat))
        n_out = runtime.num_fwd_outputs
        user = _returned(runtime, flat, outs[:n_out], finals)
        return _forward_outputs(ctx, runtime, user, list(outs[n_out:]))

    @staticmethod
    def backward(ctx: Any, *grad_outs: torch.Tensor | None) -> tuple:
        args = _backward_args(ctx, grad_outs, "saved_strides")
        del grad_outs
        runtime: TrainingRuntime = ctx.runtime
        return (None, None, None, *call_compiled(runtime.bwd, args))


def _per_input(n: int, positions: list[int], grads: Sequence[Any]) -> list:
    """Gradients placed at their flat input positions (None for inputs without one)."""
    result: list[torch.Tensor | None] = [None] * n
    for i, g in zip(positions, grads, strict=True):
        result[i] = g
    return result


def _returned(
    runtime: TrainingRuntime, flat: Sequence[Any], user: Sequence[Any], finals: list
) -> list:
    """The forward's outputs that go through autograd: the mutated inputs' new values that
    the compiled forward wrote into the inputs' own storage (a batch norm's running
    statistics, backend/compile.py `_written_in_place`) stay out, and `finals` gets one
    bool per mutated input, True where its value stayed out. Autograd wraps every input a
    Function returns anew (~3 us a tensor: 0.4 ms of MobileNetV2's training step, which
    mutates 156 buffers); such a value is never differentiable (joint.py: mutated inputs'
    values follow the differentiable outputs), and `with_finals` puts it back."""
    base = runtime.mutation_base
    kept = list(user[:base])
    for new, i in zip(user[base:], runtime.program.mutated, strict=True):
        t = flat[i]
        written = new is t or (new.numel() > 0 and new.data_ptr() == t.data_ptr())
        finals.append(written)
        if not written:
            kept.append(new)
    return kept


def with_finals(
    outs: Sequence[Any], base: int, finals: list, flat: Sequence[Any], mutated: list[int]
) -> list:
    """The forward's outputs as the graph returns them, from those autograd returned
    (`_returned`): a mutated input's value written in its storage is the input itself."""
    full = list(outs[:base])
    rest = iter(outs[base:])
    for written, i in zip(finals, mutated, strict=True):
        full.append(flat[i] if written else next(rest))
    return full


def _forward_outputs(ctx: Any, runtime: TrainingRuntime, user: list, saved: list) -> tuple:
    """The end of a compiled forward node: keep `saved` for the backward, mark the outputs
    that have no gradient, return the user outputs."""
    ctx.runtime = runtime
    ctx.set_materialize_grads(False)  # unused outputs' zeros are made only where needed
    n = runtime.num_saved_tensors
    ctx.save_for_backward(*saved[:n])
    ctx.saved_sizes = saved[n:]  # symbolic sizes the backward takes, as ints
    if runtime.symbolic:
        ctx.out_shapes = [o.shape if isinstance(o, torch.Tensor) else None for o in user]
    non_diff = [o for k, o in enumerate(user) if k not in runtime.diff_set]
    ctx.mark_non_differentiable(*[o for o in non_diff if isinstance(o, torch.Tensor)])
    return tuple(user)


def _backward_args(ctx: Any, grad_outs: tuple, strides: str) -> list:
    """The compiled backward's inputs: the saved values (with the strides in the runtime's
    attribute `strides`) and the tangents; the context lets go of the saved values."""
    # create_graph=True: the compiled backward has no derivative of its own, and a
    # gradient missing its second-order part would be silently wrong
    _no_double_backward()
    runtime: TrainingRuntime = ctx.runtime
    tangents = _tangents(runtime, grad_outs, getattr(ctx, "out_shapes", None))
    saved = _as_traced(ctx.saved_tensors, getattr(runtime, strides))
    args = [*saved, *getattr(ctx, "saved_sizes", ()), *tangents]
    del tangents, grad_outs
    ctx.maybe_clear_saved_tensors()  # frees them unless retain_graph=True
    return args


def _tangents(
    runtime: TrainingRuntime, grad_outs: Sequence[torch.Tensor | None], shapes: list | None
) -> list:
    """Incoming gradients of the differentiable outputs, contiguous, zeros for None (of the
    shape the forward returned, where sizes are symbolic)."""
    tangents = []
    for k, spec in zip(runtime.diff_outputs, runtime.tangent_specs, strict=True):
        g = grad_outs[k]
        if g is None:
            shape = spec[0] if shapes is None else shapes[k]
            g = torch.zeros(shape, dtype=spec[1], device=spec[2])
        tangents.append(_contiguous(g))
    return tangents


def _no_double_backward() -> None:
    if torch.is_grad_enabled():
        raise RuntimeError(
            "ember aot: double backward (create_graph=True) through a compiled region is "
            "not supported; compile only the first-order part or run it eagerly"
        )


class _Holder:
    """Hands the compiled forward's results from the upstream node to the downstream one."""

    user: list | None = None
    saved: list | None = None

    def __init__(self) -> None:
        self.finals: list[bool] = []


class _Upstream(torch.autograd.Function):
    """Split backward, node 1 of 2 in forward order: runs the compiled forward; its backward
    is the *second* backward stage, which gets the crossing values as the gradients of the
    stand-in outputs it returns (zero-stride tensors: no memory)."""

    @staticmethod
    def forward(ctx: Any, runtime: TrainingRuntime, holder: _Holder, *flat: torch.Tensor) -> tuple:
        outs = call_compiled(runtime.fwd, list(flat))
        n_out = runtime.num_fwd_outputs
        user = _returned(runtime, flat, outs[:n_out], holder.finals)
        saved = list(outs[n_out:])
        ctx.runtime = runtime
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*[saved[i] for i in runtime.second_saved])
        holder.user, holder.saved = user, [saved[i] for i in runtime.first_saved]
        del outs, saved
        stand_ins = [
            torch.zeros((), dtype=dt, device=runtime.program.device).expand(shape)
            for shape, dt in runtime.cross_specs
        ]
        return tuple(stand_ins)

    @staticmethod
    def backward(ctx: Any, *grad_cross: torch.Tensor | None) -> tuple:
        _no_double_backward()
        runtime: TrainingRuntime = ctx.runtime
        cross = [
            g if g is not None else torch.zeros(shape, dtype=dt, device=runtime.program.device)
            for g, (shape, dt) in zip(grad_cross, runtime.cross_specs, strict=True)
        ]
        del grad_cross
        args = _as_traced([*ctx.saved_tensors, *cross], runtime.second_strides)
        del cross
        ctx.maybe_clear_saved_tensors()
        grads = call_compiled(runtime.bwd2, args)
        return (None, None, *_per_input(runtime.num_primals, runtime.second_grad_inputs, grads))


class _Downstream(torch.autograd.Function):
    """Split backward, node 2 of 2 in forward order: returns the user outputs; its backward
    is the first backward stage (the tangents die with it), returning the crossing values
    as the stand-ins' gradients."""

    @staticmethod
    def forward(ctx: Any, runtime: TrainingRuntime, holder: _Holder, *args: torch.Tensor) -> tuple:
        user, saved = holder.user, holder.saved
        holder.user = holder.saved = None
        assert user is not None and saved is not None
        return _forward_outputs(ctx, runtime, user, saved)

    @staticmethod
    def backward(ctx: Any, *grad_outs: torch.Tensor | None) -> tuple:
        args = _backward_args(ctx, grad_outs, "first_strides")
        del grad_outs
        runtime: TrainingRuntime = ctx.runtime
        outs = call_compiled(runtime.bwd1, args)
        n = len(runtime.first_grad_inputs)
        grads, cross = outs[:n], outs[n:]
        by_input = dict(zip(runtime.first_grad_inputs, grads, strict=True))
        result = [by_input.get(i) for i in runtime.first_inputs]
        return (None, None, *cross, *result)


class TrainingRuntime:
    """Calls the compiled forward/backward pair through _CompiledFunction, or through
    _Upstream/_Downstream when the partitioner split the backward in two."""

    def __init__(
        self,
        joint: Any,
        parts: Any,
        fwd: Compiled,
        bwd: Compiled | None,
        stages: tuple[Compiled, Compiled] | None = None,
    ) -> None:
        self.program: Program = joint.program
        self.parts = parts
        self.fwd = fwd
        self.bwd = bwd
        self.num_primals = joint.num_primals
        self.num_fwd_outputs = joint.num_fwd_outputs
        # where the mutated inputs' new values start among the forward's outputs
        self.mutation_base = joint.num_fwd_outputs - len(self.program.mutated)
        self.diff_outputs = joint.diff_outputs
        self.diff_set = set(joint.diff_outputs)
        self.grad_inputs = joint.grad_inputs
        out_vals = next(iter(joint.gm.graph.find_nodes(op="output"))).meta["val"]
        device = self.program.device  # traced values are meta tensors
        self.tangent_specs = [
            (out_vals[k].shape, out_vals[k].dtype, device) for k in self.diff_outputs
        ]
        n_saved = len(parts.saved)
        backward_inputs = list(parts.backward.graph.find_nodes(op="placeholder"))[:n_saved]
        saved_vals = [n.meta["val"] for n in backward_inputs]
        tensors = [v for v in saved_vals if isinstance(v, torch.Tensor)]
        self.num_saved_tensors = len(tensors)  # then the saved sizes (partition orders them)
        self.saved_strides = _Static([traced_strides(v) for v in tensors])
        self.symbolic = is_symbolic_graph(joint.gm.graph)
        self.split = parts.split if stages is not None else None
        if self.split is not None:
            self._init_split(parts, stages)

    def _init_split(self, parts: Any, stages: Any) -> None:
        split = self.split
        self.bwd1, self.bwd2 = stages
        index = {name: i for i, name in enumerate(parts.saved)}
        self.first_saved = [index[n] for n in split.first_saved]
        self.second_saved = [index[n] for n in split.second_saved]
        # gradient outputs of the backward -> flat input positions, per stage
        self.first_grad_inputs = [self.grad_inputs[i] for i in split.first_grads]
        self.second_grad_inputs = [self.grad_inputs[i] for i in split.second_grads]
        self.first_inputs = sorted(set(self.first_grad_inputs))
        first_ph = list(split.first.graph.find_nodes(op="placeholder"))
        second_ph = list(split.second.graph.find_nodes(op="placeholder"))
        self.first_strides = _Static(
            [traced_strides(n.meta["val"]) for n in first_ph[: len(self.first_saved)]]
        )
        self.second_strides = _Static([traced_strides(n.meta["val"]) for n in second_ph])
        cross = second_ph[len(self.second_saved) :]
        self.cross_specs = [(n.meta["val"].shape, n.meta["val"].dtype) for n in cross]

    def __call__(self, args: Sequence[Any]) -> Any:
        flat = self.program.flat_inputs(args)
        check_input_aliasing(flat, self.program.mutated)
        if self.split is not None:
            holder = _Holder()
            stand_ins = _Upstream.apply(self, holder, *flat)
            firsts = [flat[i] for i in self.first_inputs]
            outs = _Downstream.apply(self, holder, *stand_ins, *firsts)
            finals = holder.finals
        else:
            finals = []
            grads_of = [flat[i] for i in self.grad_inputs]
            outs = _CompiledFunction.apply(self, finals, flat, *grads_of)
        if finals:
            outs = with_finals(outs, self.mutation_base, finals, flat, self.program.mutated)
        apply_mutations(self.program, flat, outs)
        return build_outputs(self.program, flat, outs)
