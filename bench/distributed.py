"""Data-parallel training on two processes (gloo on localhost, the CPU): eager DDP,
torch.compile and ember, on four transformer blocks (bench/training.py's Block: seq 128,
d 256, 4 heads, batch 8 per rank).

Every variant starts from the same weights and sees the same batches (each rank its own),
so after the steps all must hold the same parameters: the table gives the largest
difference to eager DDP's. Graphs are what each compiler handed its backend (ember's and
Dynamo's counts, DDP split at its buckets included); the first step includes compiling.
Step times are medians of interleaved blocks of steps (A B C ... A B C ...), from rank 0
(the ranks wait for each other in every all-reduce); `cpu ms` is rank 0's process CPU time
per step (its compute and gloo's work, not the waits: steadier on a loaded machine). One
torch thread per process: the two processes share the machine's two cores, so other jobs
on the machine distort the times; the `others` column is their share of the CPU while the
blocks ran.

Variants: eager DDP; torch.compile(DDP(model)) and DDP(torch.compile(model)) with Inductor;
ember.compile(DDP(model)) and DDP(ember.compile(model)) with ember's backend; with --fsdp,
FSDP2 (fully_shard per block and at the root) eager, with each block compiled by ember, and
with each block compiled by torch.compile; with --fsdp1, FSDP1 (FullyShardedDataParallel
per block and at the root, use_orig_params=True) eager, ember.compile(FSDP1) and
torch.compile(FSDP1).

    .venv/bin/python bench/distributed.py [--steps 3] [--repeats 5] [--bucket-mb 25] [--fsdp]
        [--fsdp1]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("BENCH_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from training import Blocks, _busy_jiffies, _own_cpu  # noqa: E402

import ember  # noqa: E402


class Counting:
    """A backend that counts the graphs it compiles and compiles them with `inner`."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs += 1
        return self.inner(gm, example_inputs)


def _inductor() -> Counting:
    from torch._inductor.compile_fx import compile_fx

    return Counting(compile_fx)


def _ember() -> Counting:
    from ember.backend import compile_graph

    return Counting(compile_graph)


def _fsdp(model: torch.nn.Module, compile_block: Callable | None) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh)
        if compile_block is not None:
            model.blocks[i] = compile_block(block)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp1(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({type(model.blocks[0])})
    cpu = torch.device("cpu")
    return FullyShardedDataParallel(
        model, auto_wrap_policy=policy, use_orig_params=True, device_id=cpu
    )


def variants(
    bucket_mb: float, fsdp: bool, fsdp1: bool
) -> dict[str, Callable[[torch.nn.Module], tuple]]:
    """Name -> (model -> (callable, parameters' owner, counting backend or None))."""

    def ddp(m: torch.nn.Module) -> DDP:
        return DDP(m, bucket_cap_mb=bucket_mb)

    def compiled(wrap: Callable, compiler: Callable) -> Callable:
        def build(m: torch.nn.Module) -> tuple:
            counter = compiler()
            return wrap(m, counter), m, counter

        return build

    table = {
        "eager DDP": lambda m: (ddp(m), m, None),
        "torch.compile(DDP)": compiled(
            lambda m, c: torch.compile(ddp(m), backend=c, dynamic=False), _inductor
        ),
        "DDP(torch.compile)": compiled(
            lambda m, c: ddp(torch.compile(m, backend=c, dynamic=False)), _inductor
        ),
        "ember.compile(DDP)": compiled(lambda m, c: ember.compile(ddp(m), backend=c), _ember),
        "DDP(ember.compile)": compiled(lambda m, c: ddp(ember.compile(m, backend=c)), _ember),
    }
    if fsdp:

        def sharded(compile_block: Callable | None, compiler: Callable | None) -> Callable:
            def build(m: torch.nn.Module) -> tuple:
                counter = compiler() if compiler is not None else None
                block = None if counter is None else lambda b: compile_block(b, counter)
                model = _fsdp(m, block)
                return model, model, counter

            return build

        table["eager FSDP"] = sharded(None, None)
        table["FSDP, blocks ember.compile"] = sharded(
            lambda b, c: ember.compile(b, backend=c), _ember
        )
        table["FSDP, blocks torch.compile"] = sharded(
            lambda b, c: torch.compile(b, backend=c, dynamic=False), _inductor
        )
    if fsdp1:

        def wrapped(m: torch.nn.Module) -> tuple:
            model = _fsdp1(m)
            return model, model, None

        def compiled1(compiler: Callable, compile_root: Callable) -> Callable:
            def build(m: torch.nn.Module) -> tuple:
                counter, model = compiler(), _fsdp1(m)
                return compile_root(model, counter), model, counter

            return build

        table["eager FSDP1"] = wrapped
        table["ember.compile(FSDP1)"] = compiled1(_ember, lambda m, c: ember.compile(m, backend=c))
        table["torch.compile(FSDP1)"] = compiled1(
            _inductor, lambda m, c: torch.compile(m, backend=c, dynamic=False)
        )
    return table


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _parameters(owner: torch.nn.Module) -> list[torch.Tensor]:
    """The owner's whole parameters (FSDP2's DTensors gathered, FSDP1's flat shards
    summoned), a collective each rank runs in the same order."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp1 = getattr(fsdp, "FullyShardedDataParallel", None)
    if fsdp1 is not None and isinstance(owner, fsdp1):
        with fsdp1.summon_full_params(owner):
            return [p.detach().clone() for p in owner.parameters()]
    return [_full(p).detach() for p in owner.parameters()]


def worker(rank: int, store: str, args: argparse.Namespace, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        results.put((rank, run(rank, args)))
    finally:
        dist.destroy_process_group()


def run(rank: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    base = Blocks()
    gen = torch.Generator().manual_seed(rank)
    total = 1 + args.repeats * args.steps
    batches = [torch.randn(8, 128, 256, generator=gen) for _ in range(total)]
    runners = {}
    for name, build in variants(args.bucket_mb, args.fsdp, args.fsdp1).items():
        model = copy.deepcopy(base)
        fn, owner, counter = build(model)
        opt = torch.optim.SGD(owner.parameters(), lr=1e-3)
        runners[name] = {"fn": fn, "owner": owner, "opt": opt, "counter": counter, "step": 0}

    def step(r: dict) -> None:
        loss = r["fn"](batches[r["step"]]).square().mean()
        r["opt"].zero_grad(set_to_none=True)
        loss.backward()
        r["opt"].step()
        r["step"] += 1

    row: dict[str, dict] = {}
    for name, r in runners.items():
        t0 = time.perf_counter()
        step(r)  # compiles
        row[name] = {"first_s": time.perf_counter() - t0, "times": [], "cpu": [], "others": []}
    hz = os.sysconf("SC_CLK_TCK")
    for _ in range(args.repeats):
        for name, r in runners.items():
            dist.barrier()
            busy0, total0 = _busy_jiffies()
            own0 = _own_cpu()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(r)
            row[name]["times"].append((time.perf_counter() - t0) / args.steps)
            busy1, total1 = _busy_jiffies()
            row[name]["cpu"].append((_own_cpu() - own0) / args.steps)
            own = (_own_cpu() - own0) * hz
            row[name]["others"].append(max(0.0, busy1 - busy0 - 2 * own) / max(1, total1 - total0))
    reference = _parameters(runners["eager DDP"]["owner"])
    for name, r in runners.items():
        params = _parameters(r["owner"])
        row[name]["maxdiff"] = max(float((a - b).abs().max()) for a, b in zip(params, reference))
        row[name]["graphs"] = r["counter"].graphs if r["counter"] is not None else 0
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per variant")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 variants too")
    parser.add_argument("--fsdp1", action="store_true", help="FSDP1 variants too")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=worker, args=(r, os.path.join(tmp, "store"), args, results))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        rows = dict(results.get() for _ in procs)
        for p in procs:
            p.join()
    print(
        f"# torch {torch.__version__}, 2 processes x 1 thread, gloo; bucket_cap_mb "
        f"{args.bucket_mb}; {args.repeats} blocks of {args.steps} steps per variant"
    )
    print(
        f"{'variant':28} {'graphs r0/r1':>12} {'first s':>8} {'step ms':>8} {'vs eager':>8} "
        f"{'cpu ms':>7} {'vs eager':>8} {'maxdiff':>8} {'others':>6}"
    )
    eager_ms = statistics.median(rows[0]["eager DDP"]["times"]) * 1e3
    eager_cpu = statistics.median(rows[0]["eager DDP"]["cpu"]) * 1e3
    for name, r0 in rows[0].items():
        r1 = rows[1][name]
        ms = statistics.median(r0["times"]) * 1e3
        cpu = statistics.median(r0["cpu"]) * 1e3
        diff = max(r0["maxdiff"], r1["maxdiff"])
        print(
            f"{name:28} {r0['graphs']:>5}/{r1['graphs']:<6} {r0['first_s']:8.2f} {ms:8.1f} "
            f"{eager_ms / ms:7.2f}x {cpu:7.1f} {eager_cpu / cpu:7.2f}x {diff:8.1e} "
            f"{statistics.median(r0['others']):6.0%}"
        )


if __name__ == "__main__":
    main()
