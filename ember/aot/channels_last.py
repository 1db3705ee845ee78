"""Channels-last training graphs: the joint graph traced again with the image inputs
converted to channels-last at the graph's entry, where the backend says that pays.

A training forward returns every convolution's result (the backward's batch norm and
convolution read them), so the backend's per-graph layout plan (backend/lowering/
layout.py), which never lays a returned value out differently from eager, keeps a
training graph in eager's NCHW layout. Inductor runs these graphs channels-last, and
oneDNN's channels-last kernels are faster on most shapes (MobileNetV2's depthwise
convolutions by 30-35% in both directions). Tracing the whole joint graph with the input
converted once makes every convolution, batch norm, activation, saved value and backward
convolution channels-last in the traced strides themselves (eager's own CPU rules give
them, aot/convolution.py), so forward, saved values and backward agree with no copies
between them, and the backend needs no second notion of layout.

What the caller sees stays eager's: user outputs whose traced strides differ from the
first (NCHW) trace's get one copy into those strides inside the graph, and gradients one
copy into their input's strides (AccumulateGrad's layout contract); a retrace whose
outputs, views or mutations differ in kind from the first trace's is dropped.

A `compile_aten` opts in by carrying `channels_last_training(joint_gm) -> bool`, asked
with the first (NCHW) joint graph (ember's backend times the forward convolutions there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember import logs

Choice = Callable[[torch.fx.GraphModule], bool]


def candidates(fakes: Sequence[Any], n_user: int) -> list[int]:
    """Flat positions of user inputs (the first `n_user` fakes; the rest is the module's
    state) worth converting: 4-d floating tensors laid out contiguously (NCHW) with more
    than one channel and no gradient of their own (an input gradient would be the
    converted one's, in other strides than eager's)."""
    out = []
    for i, f in enumerate(fakes[:n_user]):
        if (
            isinstance(f, torch.Tensor)
            and f.dim() == 4
            and f.is_floating_point()
            and not f.requires_grad
            and f.shape[1] > 1
            and f.numel() > 0
            and f.is_contiguous()
            and not f.is_contiguous(memory_format=torch.channels_last)
        ):
            out.append(i)
    return out


def convert(call_args: list, fakes: Sequence[Any], positions: Sequence[int]) -> None:
    """Replace the chosen inputs among the gm's call arguments by channels-last copies
    (the caller records them: one clone each at the graph's entry)."""
    for i in positions:
        f = fakes[i]
        k = next(k for k, a in enumerate(call_args) if a is f)
        call_args[k] = f.contiguous(memory_format=torch.channels_last)


def restrided(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """`t` in `like`'s strides (a recorded copy where they differ), or None where `like`'s
    strides are neither contiguous nor channels-last (the retrace is then dropped). Strides
    that differ only along size-1 dims (a 1x1 convolution's weight gradient) are a view:
    the backend returns such a buffer as it is, with eager's strides."""
    if tuple(t.stride()) == tuple(like.stride()):
        return t
    if _same(t, like.stride()):
        return t.as_strided(like.shape, like.stride())
    for fmt in (torch.contiguous_format, torch.channels_last):
        if like.dim() != 4 and fmt is torch.channels_last:
            continue
        if like.is_contiguous(memory_format=fmt):
            return t.contiguous(memory_format=fmt)
    return None


def _same(t: torch.Tensor, stride: Sequence[int]) -> bool:
    return all(s == 1 or a == b for s, a, b in zip(t.shape, t.stride(), stride, strict=True))


def outputs_in_eager_strides(outs: list, eager: Sequence[Any]) -> list | None:
    """The retrace's graph outputs in the first trace's strides, or None where one cannot
    be (the outputs differ in number, shape or kind)."""
    if len(outs) != len(eager):
        return None
    fixed = []
    for o, e in zip(outs, eager, strict=True):
        if not isinstance(o, torch.Tensor) or not isinstance(e, torch.Tensor):
            if isinstance(o, torch.Tensor) or isinstance(e, torch.Tensor):
                return None
            fixed.append(o)
            continue
        if o.shape != e.shape or o.dtype != e.dtype:
            return None
        r = restrided(o, e)
        if r is None:
            return None
        fixed.append(r)
    return fixed


def same_program(first: Any, second: Any) -> bool:
    """Whether two traces of one gm rebuild their outputs and mutate inputs alike."""
    kinds = [(s.kind, s.index, len(s.chain)) for s in first.specs]
    return (
        kinds == [(s.kind, s.index, len(s.chain)) for s in second.specs]
        and first.mutated == second.mutated
        and first.num_graph_outputs == second.num_graph_outputs
    )


def log_choice(positions: Sequence[int], kept: bool, why: str = "") -> None:
    logs.log(
        "aot",
        "training graph: inputs %s %s%s",
        list(positions),
        "traced channels-last" if kept else "stay in eager's layout",
        f" ({why})" if why else "",
    )
