"""Issue 17: DistributedDataParallel under ember, on two gloo processes.

`ember.compile(DDP(model))` and `DDP(ember.compile(model))` capture the forward (DDP's own
forward runs in Python), train to the same parameters as eager DDP, split the graph at DDP's
gradient buckets into as many graphs as Dynamo's DDPOptimizer makes, and so let a bucket's
all-reduce start before the backward has finished."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import ember
from ember.testing import CompileCounter, CountingBackend

BUCKET_MB = 1  # Dynamo's DDPOptimizer needs buckets of at least its 1 MiB first bucket


def _model() -> nn.Module:
    """Five layers of 1 MiB of parameters: several buckets of DDP's."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(4)]
    return nn.Sequential(*layers, nn.Linear(512, 8))


def _train(fn, params, rank: int, steps: int = 3) -> list[torch.Tensor]:
    opt = torch.optim.SGD(params, lr=0.5)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(16, 512, generator=gen)
        loss = fn(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in params]


def ddp_program(rank: int, wrapping: str, backend: str) -> dict:
    model = _model()
    eager_model = copy.deepcopy(model)
    eager = _train(DDP(eager_model, bucket_cap_mb=BUCKET_MB), list(eager_model.parameters()), rank)
    counter = CountingBackend(backend)
    if wrapping == "ember.compile(DDP(model))":
        fn = ember.compile(DDP(model, bucket_cap_mb=BUCKET_MB), backend=counter)
    else:
        fn = DDP(ember.compile(model, backend=counter), bucket_cap_mb=BUCKET_MB)
    ours = _train(fn, list(model.parameters()), rank)
    stats = ember.stats()
    return {"eager": eager, "ember": ours, "graphs": counter.frame_count, "stats": stats}


def dynamo_program(rank: int) -> int:
    """Graphs of DDP(torch.compile(model)): the DDPOptimizer's split. (torch.compile of
    the DDP module itself captures nothing under torch 2.13: Dynamo breaks in DDP's forward,
    inside `with` blocks, and runs it eagerly; bench/distributed.py shows it.)"""
    torch._dynamo.reset()
    model = _model()
    counter = CompileCounter()
    fn = DDP(torch.compile(model, backend=counter), bucket_cap_mb=BUCKET_MB)
    _train(fn, list(model.parameters()), rank, steps=1)
    torch._dynamo.reset()
    return counter.frame_count


@pytest.mark.parametrize("wrapping", ["ember.compile(DDP(model))", "DDP(ember.compile(model))"])
@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_ddp_trains_as_eager_ddp_in_as_many_graphs_as_dynamo(pair, wrapping, backend):
    results = pair.run(ddp_program, wrapping, backend)
    dynamo_graphs = pair.run(dynamo_program)
    for rank, result in enumerate(results):
        for ours, eager in zip(result["ember"], result["eager"], strict=True):
            torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-6)
        assert result["stats"]["graph_breaks"] == 0, result["stats"]
        assert result["stats"]["eager_frames"] == 0, result["stats"]
        assert 1 < result["graphs"] <= dynamo_graphs[rank], (result["graphs"], dynamo_graphs)
    for a, b in zip(results[0]["ember"], results[1]["ember"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the ranks stay in step


def overlap_program(rank: int, optimize: bool) -> list[list[str]]:
    """What happens first in each backward: a bucket's all-reduce, or the gradient of the
    model's input (which the backward computes last)."""
    with ember.config.patch(optimize_ddp=optimize):
        ddp = DDP(_model(), bucket_cap_mb=BUCKET_MB)
        events: list[str] = []

        def record_allreduce(state, bucket):
            events.append("all-reduce")
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, record_allreduce)
        fn = ember.compile(ddp, backend="aot_eager")
        orders = []
        for _ in range(3):
            events.clear()
            x = torch.randn(16, 512, requires_grad=True)
            x.register_hook(lambda g: events.append("input gradient"))
            fn(x).square().mean().backward()
            orders.append(list(events))
        return orders


@pytest.mark.parametrize("optimize", [True, False], ids=["split", "one_graph"])
def test_bucket_all_reduces_start_before_the_backward_ends(pair, optimize):
    """Split at the buckets, all-reduces start while the backward still runs (before the
    input's gradient, its last result); as one graph (EMBER_OPTIMIZE_DDP=0), only after it.
    DDP rebuilds its buckets after the first step: the later steps show the overlap."""
    for orders in pair.run(overlap_program, optimize):
        for events in orders[1:]:
            before = events[: events.index("input gradient")]
            if optimize:
                assert len(before) >= 2 and set(before) == {"all-reduce"}, events
            else:
                assert not before and events.count("all-reduce") >= 2, events
