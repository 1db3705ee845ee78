"""Channels-last convolutions in NCHW graphs: chosen per convolution shape by timing both
layouts once, and kept through the kernels between convolutions.

oneDNN convolves a channels-last (NHWC) tensor with its direct kernels; given NCHW it runs
other, mostly slower ones (bench/convnets.py's shapes: 0.86 vs 3.7 ms for a 3-channel stem,
1.7 vs 2.0 ms for 32 channels at 32x32, one thread; notes/backend.md). Eager keeps the
model's layout; Inductor turns every convolution of a CPU graph channels-last. ember
decides per group of convolutions joined through layout-following ops (a chain of
conv-BN-ReLU-pad-conv, residual adds included), as it chooses between GEMM libraries
(gemm.py): each shape is timed once per process in both layouts (runs of calls, the
layouts alternated, best of a few runs each), and the group goes channels-last where the
sum of its convolutions' times, plus one conversion copy of each input that enters the
group in eager's layout, wins by a margin. One layout per group: chosen per convolution,
a chain of tiny ones flipped layouts (each flip a transposing copy that cost more than
the convolution), or stayed in the layout the first one took. The choice lands in the
generated code, so the graph cache keeps it, as it keeps the GEMM choice.

`plan` names the fx nodes whose results are kept channels-last: a convolution chosen so,
every node that follows the layout of its input (pointwise ops, eval batch norm, pooling,
constant padding) when one of its inputs is kept, and such a node read only by kept nodes
(a ReLU of the graph input before the first convolution). Lowering gives those nodes
channels-last meta values, so their buffers (realized values, a padded pooling's copy, the
convolution's own result) are written channels-last, and the convolution lowering below
brings its input into its result's layout (one copy of an NCHW graph input; a lazy input is
written channels-last in the first place). Graph outputs keep eager's strides (graph.py
`_output`).

Only where that pays: a node the graph returns keeps eager's layout (written in it once,
never copied back; a training forward returns what its backward saves, and the backward
graph expects eager's strides), and so does a convolution whose result feeds anything but
a layout-following op or a convolution (training batch norm's statistics, which ember
computes in NCHW order).
"""

from __future__ import annotations

import functools
import math
import operator
import time
from collections.abc import Callable
from typing import Any

import torch

from ember import config, logs
from ember.aot.convolution import eager_memory_format
from ember.backend.ir.nodes import ExternKind, contiguous_strides
from ember.backend.lowering.fallback import extern
from ember.backend.lowering.registry import LowerCtx, register
from ember.backend.lowering.values import BufferValue, LazyValue, Value

aten = torch.ops.aten

MARGIN = 0.97  # channels-last must take at most this share of the other layout's time
ROUNDS = 5  # timed runs of each layout, alternated; the best of each counts
RUN = 8  # consecutive calls in a run (fewer where the budget is short)
# input copies charged to channels-last per convolution whose input enters its group in
# eager's layout (the conversion in; a group has no way back inside it)
COPIES = 1
BUDGET_S = 0.025  # timing per shape beyond the first calls: shorter runs, then fewer rounds

_POOLS = (aten.max_pool2d_with_indices.default, aten.avg_pool2d.default)
# per-element ops that are not tagged pointwise but write any layout alike
_SPATIAL = (*_POOLS, aten.constant_pad_nd.default)
# batch norms and the position of their `training` argument (None: always eval)
_BATCH_NORMS = {
    aten._native_batch_norm_legit_no_training.default: None,
    aten.native_batch_norm.default: 5,
    aten._native_batch_norm_legit_functional.default: 5,
    aten._native_batch_norm_legit.default: 5,
    aten._native_batch_norm_legit.no_stats: 3,
}


def plan(gm: torch.fx.GraphModule, returned: Callable[[torch.fx.Node], bool]) -> dict:
    """Per fx node kept channels-last, its meta value with channels-last strides (a tuple
    for multi-output nodes). `returned(node)`: whether the graph returns the node's value
    (such nodes keep eager's layout: they are written in it once, never copied back)."""
    mode = config.current().conv_layout
    kept: dict[torch.fx.Node, Any] = {}
    convolutions = gm.graph.find_nodes(op="call_function", target=aten.convolution.default)
    if mode == "eager" or not convolutions:
        return kept
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and not returned(n)]
    candidates = [
        n
        for n in convolutions
        if not returned(n)
        and _restrided(n.meta.get("val")) is not None
        and all(map(_carries, n.users))
        and _library_keeps(n)
    ]
    chosen = set(candidates) if mode == "channels_last" else _chosen(candidates)
    for node in nodes:
        if node.target is aten.convolution.default:
            if node in chosen:
                kept[node] = _restrided(node.meta.get("val"))
        elif (node.target is operator.getitem or _follows(node)) and any(
            a in kept for a in node.all_input_nodes
        ):
            new = _restrided(node.meta.get("val"))
            if new is not None:
                kept[node] = new
    # a layout-following node read only by kept nodes (a ReLU before a convolution) is
    # written channels-last in the first place, not converted by its reader; one read only
    # by convolutions that stay NCHW is written NCHW in the first place
    for node in reversed(nodes):
        if not _follows(node) or not node.users:
            continue
        taken = [_takes(user, node, kept) for user in node.users]
        if node not in kept and all(taken):
            new = _restrided(node.meta.get("val"))
            if new is not None:
                kept[node] = new
        elif node in kept and not any(taken) and all(_convolves(u) for u in node.users):
            del kept[node]
    return kept


def channels_last_training(gm: torch.fx.GraphModule) -> bool:
    """Whether a training joint graph (traced in eager's NCHW layout) should be traced
    again with its image inputs channels-last (aot/channels_last.py): every convolution is
    then channels-last, forward and backward, with no layout copy. Only under
    EMBER_CONV_LAYOUT=channels_last, or under auto where the graph has a depthwise
    convolution with a kernel above 1x1, and where every convolution whose strides change
    keeps a channels-last input so in the library (`_library_keeps`).

    Not chosen by timing: each training batch norm of a channels-last activation is four
    kernels each way (column-form mean and variance, coefficients, normalization) where
    NCHW has one, which ate what ResNet's and RegNet's convolutions gain (10-20%). Depthwise
    kxk convolutions gain 30-35% both ways, and MobileNetV2's step came out 10-25% faster
    channels-last than NCHW, level with or ahead of Inductor's (notes/backend.md, "Conv-net
    training, session 17"); ResNet's was level and RegNet's (grouped, not depthwise) 10%
    slower, so they stay NCHW."""
    layout = config.current().conv_layout
    convolutions = gm.graph.find_nodes(op="call_function", target=aten.convolution.default)
    if layout == "auto":
        if not any(map(_depthwise, convolutions)):
            return False
    elif layout != "channels_last":
        return False
    # (a 1x1 result has the same strides in both layouts)
    changed = [c for c in convolutions if _restrided(c.meta.get("val")) is not None]
    return bool(changed) and all(map(_library_keeps, changed))


def _depthwise(conv: torch.fx.Node) -> bool:
    """A 2-d convolution with one input channel per group (more than one group) and a
    kernel above 1x1."""
    weight, groups = conv.args[1].meta.get("val"), conv.args[-1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        return False
    return groups > 1 and weight.shape[1] == 1 and tuple(weight.shape[2:]) != (1, 1)


def _convolves(user: torch.fx.Node) -> bool:
    return user.target is aten.convolution.default


def _takes(user: torch.fx.Node, node: torch.fx.Node, kept: dict) -> bool:
    """Whether `user` is kept channels-last and reads `node` as such (as a convolution's
    input, not its weight)."""
    return user in kept and (user.target is not aten.convolution.default or user.args[0] is node)


def _follows(node: torch.fx.Node) -> bool:
    """Whether the node computes its result in its input's layout as well as in eager's."""
    if node.op != "call_function":
        return False
    if node.target in _BATCH_NORMS:
        at = _BATCH_NORMS[node.target]
        return at is None or (len(node.args) > at and node.args[at] is False)
    return node.target in _SPATIAL or torch.Tag.pointwise in getattr(node.target, "tags", ())


def _carries(user: torch.fx.Node) -> bool:
    """Whether a reader of a convolution's result keeps (or takes) channels-last as it is."""
    return _convolves(user) or _follows(user)


def _restrided(val: Any) -> Any:
    """`val` with channels-last strides (items of a tuple that are 4-d tensors), or None
    when nothing changes (not 4-d, symbolic sizes, not dense, already channels-last)."""
    if isinstance(val, list | tuple):
        items = [_restrided(v) for v in val]
        if all(i is None for i in items):
            return None
        return type(val)(v if i is None else i for i, v in zip(items, val))
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return None
    size = tuple(val.shape)
    if not all(isinstance(s, int) for s in (*size, *val.stride())):
        return None
    if same_strides(size, val.stride(), channels_last_strides(size)):
        return None
    if not same_strides(size, val.stride(), contiguous_strides(size)):
        return None
    return torch.empty_strided(size, channels_last_strides(size), dtype=val.dtype, device="meta")


def channels_last_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    _, c, h, w = (max(s, 1) for s in size)
    return (h * w * c, 1, w * c, c)


def same_strides(size, a, b) -> bool:
    """Whether two strides lay out a tensor of `size` alike (size-1 dims do not count)."""
    return all(s == 1 or x == y for s, x, y in zip(size, a, b))


def _library_keeps(node: torch.fx.Node) -> bool:
    """Whether eager's convolution returns a channels-last result for this convolution of
    a channels-last input (PyTorch's own backend choice: its oneDNN kernels do, some
    others for some dtypes do not)."""
    x, w = (node.args[i].meta["val"] for i in (0, 1))
    size = tuple(x.shape)
    x = torch.empty_strided(size, channels_last_strides(size), dtype=x.dtype, device="meta")
    fmt = eager_memory_format(x, w, *node.args[3:9])
    return fmt == torch.channels_last


def _chosen(candidates: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """The convolutions run channels-last: one choice per group of convolutions joined
    through layout-following nodes (a convolution feeding another through batch norm,
    ReLU, padding, a residual add...), made on the group's summed times.

    Chosen one by one (each against the layout its input arrives in), a chain of tiny
    convolutions stayed in whatever layout the first took: on transformers' ResNet,
    RegNet and MobileNetV2 (batch 2, 32x32) the stem was a few microseconds faster NCHW,
    the 1x1 convolutions after it too, and then every 3x3 one ran NCHW though 10-40%
    slower so; the group's sum has the 3x3 ones outweigh the rest, as Inductor's
    all-channels-last plan does. A group's input conversions (a convolution whose input
    comes from outside the group, e.g. the graph input) are charged to channels-last; the
    way out of a group is a returned value (written in eager's layout by its kernel) or a
    small pooled one, so it is not charged."""
    parent = {c: c for c in candidates}

    def find(c: torch.fx.Node) -> torch.fx.Node:
        while parent[c] is not c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    entry = {}
    for c in candidates:
        sources = _sources(c.args[0], parent)
        for s in sources:
            parent[find(s)] = find(c)
        entry[c] = not sources
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for c in candidates:
        groups.setdefault(find(c), []).append(c)
    chosen: set[torch.fx.Node] = set()
    for members in groups.values():
        if _group_faster(members, entry):
            chosen.update(members)
    return chosen


def _sources(node: Any, convs: dict) -> set[torch.fx.Node]:
    """The convolutions among `convs` whose results reach `node` through layout-following
    nodes only (empty where the value comes from elsewhere, e.g. a graph input)."""
    found: set[torch.fx.Node] = set()
    seen: set[torch.fx.Node] = set()
    todo = [node] if isinstance(node, torch.fx.Node) else []
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in convs:
            found.add(n)
        elif n.target is operator.getitem or _follows(n):
            todo.extend(n.all_input_nodes)
    return found


def _group_faster(members: list[torch.fx.Node], entry: dict) -> bool:
    """Whether a group of convolutions runs channels-last (each shape timed once per
    process and thread count); `entry[c]`: c's input comes from outside the group, in
    eager's layout, so channels-last pays its copies. Each convolution's times and the
    group's choice are logged."""
    times = {c: _conv_times(c) for c in members}
    if any(t is None for t in times.values()):
        return False
    cl = sum(t[0] + (COPIES * t[2] if entry[c] else 0.0) for c, t in times.items())
    other = sum(t[1] for t in times.values())
    chosen = cl <= other * MARGIN
    verdict = "channels-last" if chosen else "NCHW"
    for c, (c_cl, c_other, copy) in times.items():
        x, w = (c.args[i].meta["val"] for i in (0, 1))
        logs.log(
            "kernels",
            "convolution %s * %s %s (%s, %d threads): channels-last %.3f ms, NCHW %.3f ms, "
            "input layout copy %.3f ms%s -> %s",
            tuple(x.shape),
            tuple(w.shape),
            _params(c),
            x.dtype,
            torch.get_num_threads(),
            c_cl * 1e3,
            c_other * 1e3,
            copy * 1e3,
            "" if entry[c] else " (input from the group)",
            verdict,
        )
    if len(members) > 1:
        logs.log(
            "kernels",
            "%d convolutions joined by layout-following ops: channels-last %.3f ms "
            "(with input copies), NCHW %.3f ms -> %s",
            len(members),
            cl * 1e3,
            other * 1e3,
            verdict,
        )
    return chosen


def _params(node: torch.fx.Node) -> tuple:
    return tuple(tuple(p) if isinstance(p, list | tuple) else p for p in node.args[3:9])


def _conv_times(node: torch.fx.Node) -> tuple[float, float, float] | None:
    """(channels-last, NCHW, input copy) seconds of one convolution call (`_times`), or
    None for symbolic sizes."""
    x, w = (node.args[i].meta["val"] for i in (0, 1))
    bias = node.args[2].meta["val"] if isinstance(node.args[2], torch.fx.Node) else None
    if not all(isinstance(s, int) for s in (*x.shape, *w.shape)):
        return None
    b_shape = tuple(bias.shape) if bias is not None else None
    threads = torch.get_num_threads()
    return _times(tuple(x.shape), tuple(w.shape), b_shape, _params(node), x.dtype, threads)


@functools.cache
def _times(x_shape, w_shape, b_shape, params, dtype, threads) -> tuple[float, float, float]:
    """(channels-last, NCHW) seconds of one convolution call on random data, and of copying
    its input from one layout into the other. Each round times a run of a few consecutive
    calls of one layout (the best round's mean counts): single calls alternating between
    the layouts made oneDNN's channels-last 1x1 convolutions look 20-50% slower than in a
    run of them, as a network calls them (0.043 vs 0.028 ms for (2, 16, 8, 8) * (4, 16, 1,
    1), one thread). With one thread the clock is the thread's CPU time: on a shared
    machine wall-clock minima of a few calls still swing by 3x with preemption (measured
    under load 8 on 2 cores: 1.7 vs 6.0 ms for the same call), CPU time by a few percent."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=gen).to(dtype)
    w = torch.randn(w_shape, generator=gen).to(dtype)
    b = torch.randn(b_shape, generator=gen).to(dtype) if b_shape is not None else None
    inputs = {"cl": x.contiguous(memory_format=torch.channels_last), "nchw": x}
    best = dict.fromkeys(inputs, math.inf)
    clock = time.thread_time if threads == 1 else time.perf_counter
    with torch.no_grad():
        spent = 0.0
        for t in inputs.values():  # first calls: allocation, oneDNN's primitive creation
            aten.convolution.default(t, w, b, *params)
            start = clock()
            aten.convolution.default(t, w, b, *params)
            spent += clock() - start
        reps = max(1, min(RUN, int(BUDGET_S / (ROUNDS * max(spent, 1e-6)))))
        rounds = ROUNDS if reps > 1 else max(3, min(ROUNDS, int(BUDGET_S / max(spent, 1e-6))))
        copy = math.inf
        for _ in range(rounds):
            for k, t in inputs.items():
                start = clock()
                for _ in range(reps):
                    aten.convolution.default(t, w, b, *params)
                best[k] = min(best[k], (clock() - start) / reps)
            start = clock()
            x.contiguous(memory_format=torch.channels_last)
            copy = min(copy, clock() - start)
    return best["cl"], best["nchw"], copy


@register(aten.convolution.default)
def _convolution(ctx: LowerCtx, x: Value, weight: Value, *rest: Any) -> Any:
    """The library call, with a 4-d input brought into the memory format of the result the
    lowering expects (eager's, or channels-last where the plan chose it): an NCHW input of
    a channels-last convolution is copied once, a lazy one written channels-last. A 1x1
    convolution with a stride runs on the subsampled input (strided_conv.py)."""
    from ember.backend.lowering import strided_conv  # it imports this module's helpers

    bias, stride, padding, dilation, transposed, out_pad, groups = rest
    if strided_conv.applies(x, weight, stride, padding, transposed):
        cl = strided_conv.channels_last(tuple(ctx.meta.shape), ctx.meta.stride())
        sub = strided_conv.subsampled(ctx, x, stride, cl)
        one, zero = [1] * len(stride), [0] * len(stride)
        args = (sub, weight, bias, one, zero, one, False, zero, groups)
        return extern(ctx, aten.convolution.default, args, {}, ExternKind.LIBRARY)
    want = _strides_for(x, ctx.meta)
    if want is not None and not (
        isinstance(x, BufferValue) and same_strides(x.size, x.layout.stride, want)
    ):
        x = ctx.builder.realize(LazyValue(x.size, x.dtype, x.load), want)
    return extern(ctx, aten.convolution.default, (x, weight, *rest), {}, ExternKind.LIBRARY)


def _strides_for(x: Value, out: Any) -> tuple[int, ...] | None:
    """The strides a 4-d input must be written in before the call: dense in the memory
    format of the result `out` where that is NCHW or channels-last (not both, as with one
    channel) and `x` is lazy or a buffer in the other format; None where it is passed as
    it is."""
    if len(x.size) != 4 or not all(isinstance(s, int) for s in (*x.size, *out.stride())):
        return None
    size, x_size = tuple(out.shape), tuple(x.size)
    cl = same_strides(size, out.stride(), channels_last_strides(size))
    if cl == same_strides(size, out.stride(), contiguous_strides(size)):
        return None
    want, other = channels_last_strides, contiguous_strides
    if not cl:
        want, other = other, want
    if isinstance(x, LazyValue) or same_strides(x_size, x.layout.stride, other(x_size)):
        return want(x_size)
    return None
