"""Runtime wrappers: call compiled aten graphs the way the torch-level gm would be called.

Inference: run the compiled functional graph, copy mutated inputs back, rebuild outputs
(views of inputs replayed on the caller's tensors). Training: a `torch.autograd.Function` per
compiled region whose forward runs the compiled forward graph and whose backward runs the
compiled backward graph (see joint.py / partition.py for how those are made).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.aot.program import Program, apply_mutations, build_outputs

Compiled = Callable[..., Sequence[Any]]


class InferenceRuntime:
    """Calls one compiled functional graph; no autograd involved."""

    def __init__(self, program: Program, compiled: Compiled) -> None:
        self.program = program
        self.compiled = compiled

    def __call__(self, args: Sequence[Any]) -> Any:
        flat = self.program.flat_inputs(args)
        outs = self.compiled(*flat)
        apply_mutations(self.program, flat, outs)
        return build_outputs(self.program, flat, outs)
