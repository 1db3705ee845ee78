"""ember and torch.distributed's data-parallel wrappers (DDP, FSDP1, FSDP2).

Calling the wrapper: the wrappers' own calls do collective communication and bookkeeping
that ember runs in Python, as Dynamo's frame hook skips them: DDP's forward (its reducer
preparing for the backward), FSDP1's forward (all-gathering the flat parameter, pointing the
wrapped modules' parameters at views of it, freeing it after) and FSDP2's hooks
(all-gathering parameters before a block's forward, freeing them after). What they wrap is
compiled: while the wrapper's call runs, the wrapped module's `forward` is ember's compiled
forward (`call_with_compiled_forward`), and so is the wrapped module's of every FSDP1
instance nested inside (a capture that meets a DDP or FSDP1 call breaks the graph there:
`data_parallel_call`). So `ember.compile(DDP(model))`, `DDP(ember.compile(model))`,
`ember.compile(FSDP(model))` (nested FSDP1 blocks too) and `ember.compile(block)` of a
`fully_shard`ed block all capture the forward, and the wrappers work as they do eagerly.

Overlap (Dynamo's DDPOptimizer idea): DDP all-reduces a bucket of gradients as soon as all
its parameters have them; a graph compiled as one autograd node gives every parameter its
gradient at the very end of the backward, so no all-reduce could overlap the backward. When
a capture happens inside DDP's forward (`DistributedDataParallel._get_active_ddp_module()`),
`split_at_buckets` cuts the graph where DDP's buckets end (parameter bytes counted in reverse
order of use, as the backward produces gradients) and compiles each part with the backend:
each part's backward is its own autograd node, and a bucket's all-reduce starts while the
earlier parts' backward still runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from ember import config, logs

Compile = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


def _ddp_class() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def _fsdp_class() -> type | None:
    """FSDP2's module class, if the program has loaded FSDP (importing it takes seconds)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FSDPModule", None)


def _fsdp1_class() -> type | None:
    """FSDP1's FullyShardedDataParallel, if the program has loaded FSDP."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FullyShardedDataParallel", None)


def _is_fsdp1(module: torch.nn.Module) -> bool:
    fsdp1 = _fsdp1_class()
    return fsdp1 is not None and isinstance(module, fsdp1)


def wrapped_module(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose forward ember compiles when `module`'s own call must run in Python:
    DDP's or FSDP1's wrapped module, or an FSDP2 module itself (its hooks run around its
    forward)."""
    ddp, fsdp = _ddp_class(), _fsdp_class()
    if ddp is not None and isinstance(module, ddp):
        return module.module
    if _is_fsdp1(module):
        return module._fsdp_wrapped_module
    if fsdp is not None and isinstance(module, fsdp):
        return module
    return None


def data_parallel_call(module: torch.nn.Module) -> str | None:
    """Why a call of `module` met inside a capture must run in Python (None: it can be
    traced): DDP's and FSDP1's calls communicate across processes and repoint parameters,
    which a graph cannot hold. FSDP2 modules are plain modules with hooks: traced."""
    ddp = _ddp_class()
    if ddp is not None and isinstance(module, ddp):
        return "a DistributedDataParallel call (its reducer prepares the backward)"
    if _is_fsdp1(module):
        return (
            "a FullyShardedDataParallel (FSDP1) call (it all-gathers its flat parameter and "
            "points the wrapped module's parameters at it)"
        )
    return None


@contextlib.contextmanager
def _forward_replaced(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """`module.forward` is `forward` inside the block (an instance attribute, which
    `Module._call_impl` finds first); whatever the instance had is back afterwards."""
    had = "forward" in module.__dict__
    saved = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had:
            module.forward = saved
        else:
            del module.forward


def call_with_compiled_forward(
    outer: torch.nn.Module,
    compiled_forward_of: Callable[[type], Callable[..., Any]],
    args: tuple,
    kwargs: dict,
) -> Any:
    """`outer(*args, **kwargs)` in Python, with the wrapped module's forward compiled, and
    that of each FSDP1 instance nested in it (`compiled_forward_of(cls)`: the compiled
    `cls.forward`)."""
    inner = wrapped_module(outer)
    assert inner is not None
    inners = [inner]
    if _is_fsdp1(outer):
        nested = [m for m in outer.modules() if m is not outer and _is_fsdp1(m)]
        inners += [m._fsdp_wrapped_module for m in nested]
    with contextlib.ExitStack() as stack:
        for module in inners:
            compiled = functools.partial(compiled_forward_of(type(module)), module)
            stack.enter_context(_forward_replaced(module, compiled))
        return outer(*args, **kwargs)


def active_ddp() -> Any | None:
    """The DDP module whose forward is running (a capture now is of what it wraps)."""
    ddp = _ddp_class()
    if ddp is None or not config.current().optimize_ddp:
        return None
    return ddp._get_active_ddp_module()


@dataclasses.dataclass
class _Bucket:
    size: int = 0
    nodes: list[fx.Node] = dataclasses.field(default_factory=list)


def _leaves_bucket(bucket: _Bucket) -> bool:
    """Some value of the bucket is read after it: the graph can be cut behind it."""
    inside = set(bucket.nodes)
    return any(u not in inside for n in bucket.nodes for u in n.users)


def bucket_nodes(
    gm: fx.GraphModule, params: dict[fx.Node, torch.Tensor], cap: int, first_cap: int
) -> list[list[fx.Node]]:
    """The graph's nodes in buckets, in forward order. Walking backwards (the order in which
    the backward produces gradients), a bucket takes nodes until the parameters they read
    fill `cap` bytes (`first_cap` for the first bucket: DDP all-reduces a small first bucket
    early), and ends where a value leaves it."""
    buckets = [_Bucket()]
    counted: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        full = buckets[0].size >= (first_cap if len(buckets) == 1 else cap)
        if full and _leaves_bucket(buckets[0]):
            buckets.insert(0, _Bucket())
        for arg in node.all_input_nodes:
            if arg in params and arg not in counted:
                counted.add(arg)
                buckets[0].size += params[arg].untyped_storage().nbytes()
        buckets[0].nodes.append(node)
    if len(buckets) > 1 and buckets[0].size == 0:  # a prologue without parameters
        buckets[1].nodes.extend(buckets.pop(0).nodes)
    return [b.nodes for b in buckets]


class _CompiledOnFirstCall(torch.nn.Module):
    """One part of a split graph, compiled by the backend for the inputs of its first call
    (the tensors the part before it made, with their real metadata)."""

    def __init__(self, gm: fx.GraphModule, compile_part: Compile) -> None:
        super().__init__()
        self.gm = gm
        self.compile_part = compile_part
        self.compiled: Callable[..., Any] | None = None

    def forward(self, *args: Any) -> Any:
        if self.compiled is None:
            self.compiled = self.compile_part(self.gm, list(args))
        return self.compiled(*args)


def split_at_buckets(
    gm: fx.GraphModule, example_inputs: list[Any], ddp: Any, compile_part: Compile
) -> Callable[..., Any]:
    """Compile `gm` in parts that end where DDP's gradient buckets end (one part: as is)."""
    ignored = {id(p) for p in ddp.parameters() if getattr(p, "_ddp_ignored", False)}
    trained = {id(p) for p in ddp.parameters() if p.requires_grad and id(p) not in ignored}
    placeholders = gm.graph.find_nodes(op="placeholder")
    params = {
        node: real
        for node, real in zip(placeholders, example_inputs)
        if isinstance(real, torch.Tensor) and id(real) in trained
    }
    first_cap = min(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, ddp.bucket_bytes_cap)
    buckets = bucket_nodes(gm, params, ddp.bucket_bytes_cap, first_cap)
    logs.log(
        "graph_breaks",
        "DDP: %d parameter bytes in %d buckets of at most %d bytes: %d graphs",
        sum(p.untyped_storage().nbytes() for p in params.values()),
        len(buckets),
        ddp.bucket_bytes_cap,
        len(buckets),
    )
    if len(buckets) == 1:
        return compile_part(gm, example_inputs)
    part_of = {node: i for i, nodes in enumerate(buckets) for node in nodes}
    split = split_module(gm, None, part_of.__getitem__)
    for name, part in list(split.named_children()):
        if name.startswith("submod_"):
            setattr(split, name, _CompiledOnFirstCall(part, compile_part))
    return split
