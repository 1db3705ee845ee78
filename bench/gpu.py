"""ember.compile on CUDA tensors: the same answers as eager, and what it costs there.

A graph whose tensors live on one CUDA device is compiled to Triton kernels (GEMMs and
convolutions stay aten library calls); graphs on several devices run as their aten ops
(`ember.backend.compile.placement`). This script checks that end to end against eager on
the device (inference, a training step with its gradients and updated parameters, dropout's
mask between forward and backward, bfloat16 and float16, a graph break, a copy from the CPU
inside the compiled code) and times eager, ember.compile and torch.compile (Inductor, Triton)
per call. Then it prints a table per workload: eager, ember (default, reduce-overhead: CUDA graphs,
max-autotune: autotuned kernels and CUDA graphs), Inductor (default and reduce-overhead),
each with its first call (compile included) and its time per call. `--tests` first runs the
pytest tests that need a GPU (CUDA graphs, autotuning, kernels compiled for the device).
CI has no GPU; run it where one is; `--dry-run` runs it here, on the CPU under Triton's
interpreter (CUDA graphs by the policy's CPU stand-in), with small sizes, and then compiles
every kernel it launched for sm_90 with Triton's own compiler (`--install` first installs
wheels carried in .whl/, for a machine without a registry):

    python bench/gpu.py [--device cuda] [--repeats 7] [--no-inductor] [--tests] [--json FILE]
    python bench/gpu.py --dry-run
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from training import MLP, Block  # noqa: E402

import ember  # noqa: E402
from ember import config  # noqa: E402
from ember.backend import cudagraphs  # noqa: E402
from ember.backend.codegen import autotune, triton_runtime  # noqa: E402
from ember.backend.compile import stats  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 as float32
torch.backends.cudnn.allow_tf32 = False


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.5, self.training))


def close(got, want, what: str, tol: float = 1e-4) -> None:
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")
    if isinstance(got, torch.Tensor):
        assert got.device == want.device, f"{what}: on {got.device}, eager's on {want.device}"


def check_inference(dev: torch.device) -> None:
    def chain(x):
        return torch.sigmoid(x * 2 + 1).relu() - x.tanh()

    def norms(x, w):
        return torch.softmax(x, -1), F.layer_norm(x, (x.shape[-1],), w), x.sum(0)

    x, w = torch.randn(64, 128, device=dev), torch.randn(128, device=dev)
    close(ember.compile(chain)(x), chain(x), "pointwise chain")
    close(ember.compile(norms)(x, w), norms(x, w), "softmax / layer norm / sum")
    for make, shape in ((MLP, (32, 1024)), (Block, (2, 128, 256))):
        model = make().to(dev).eval()
        xin = torch.randn(shape, device=dev)
        with torch.no_grad():
            close(ember.compile(model)(xin), model(xin), f"{make.__name__} inference")


def check_training(dev: torch.device) -> None:
    for make, shape in ((MLP, (32, 1024)), (Block, (2, 128, 256))):
        base = make().to(dev)
        xin = torch.randn(shape, device=dev)
        results = []
        for compiled in (False, True):
            model = copy.deepcopy(base)
            fn = ember.compile(model) if compiled else model
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                loss = fn(xin).square().mean()
                loss.backward()
                opt.step()
            grads = [p.grad.clone() for p in model.parameters()]
            results.append((loss.detach(), grads, [p.detach().clone() for p in model.parameters()]))
        (l0, g0, p0), (l1, g1, p1) = results
        close(l1, l0, f"{make.__name__} loss")
        close(g1, g0, f"{make.__name__} gradients", 1e-3)
        close(p1, p0, f"{make.__name__} parameters after two SGD steps", 1e-3)


def check_dropout(dev: torch.device) -> None:
    """Seeded like eager, the compiled model drops the same elements (the fused kernel eager
    runs on GPUs is traced, ember/aot/dropout.py), and its backward uses the forward's mask:
    for y = dropout(x * w), d(sum y)/dw is the column sum of y / w."""
    base = DropoutMLP().to(dev).train()
    x = torch.randn(16, 64, device=dev, requires_grad=True)
    fn = ember.compile(base)
    torch.manual_seed(0)
    out = fn(x)
    out.sum().backward()
    torch.manual_seed(0)
    x2 = x.detach().clone().requires_grad_()
    ref = base(x2)
    ref.sum().backward()
    close(out, ref, "dropout output (same seed as eager)")
    close(x.grad, x2.grad, "dropout input gradient")

    w = torch.rand(64, device=dev, requires_grad=True)
    y = ember.compile(lambda a, w: F.dropout(a * w, 0.3, True))(x.detach(), w)
    y.sum().backward()
    close(w.grad, (y / w).sum(0).detach(), "dropout mask in backward = forward's")


def check_bf16_break_and_transfer(dev: torch.device) -> None:
    model = MLP().to(dev, torch.bfloat16).eval()
    xin = torch.randn(16, 1024, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        close(ember.compile(model)(xin), model(xin), "bfloat16 MLP", 2e-2)
        half = MLP().to(dev, torch.float16).eval()
        close(ember.compile(half)(xin.half()), half(xin.half()), "float16 MLP", 2e-2)

    seen = []

    def with_break(x):
        y = x.cos() * 2
        seen.append(float(y.sum()))  # a graph break: data-dependent Python value
        return y.sin()

    x = torch.randn(1000, device=dev)
    close(ember.compile(with_break)(x), with_break(x), "graph break")
    assert len(seen) == 2 and abs(seen[0] - seen[1]) < 1e-2, seen

    def moves(a):
        return (a.to(dev) * 3).exp().cpu() + 1

    a = torch.randn(100)
    close(ember.compile(moves)(a), moves(a), "copy to the device and back inside the graph")


def check_mixed_devices_and_dynamo(dev: torch.device) -> None:
    """A 0-dim CPU tensor beside device tensors (eager allows it), and ember's backend
    behind PyTorch's own capture (`torch.compile(backend=ember.backend)`)."""
    half = torch.tensor(0.5)

    def scaled(x):
        return (x * half).sin() + half

    x = torch.randn(64, 32, device=dev)
    close(ember.compile(scaled)(x), scaled(x), "0-dim CPU tensor with device tensors")
    model = MLP().to(dev).eval()
    xin = torch.randn(8, 1024, device=dev)
    with torch.no_grad():
        got = torch.compile(model, backend=ember.backend, dynamic=False)(xin)
        close(got, model(xin), "MLP behind torch.compile(backend=ember.backend)")


def check_modes(dev: torch.device) -> None:
    """mode="reduce-overhead" (CUDA graphs) and "max-autotune" (autotuned kernels and CUDA
    graphs): the same values as eager over calls with changing inputs, outputs kept across
    calls intact, a training step's parameters equal eager's."""
    for mode in ("reduce-overhead", "max-autotune"):
        model = MLP().to(dev).eval()
        compiled = ember.compile(model, mode=mode)
        with torch.no_grad():
            kept = [
                (compiled(x), model(x))
                for x in (torch.randn(8, 1024, device=dev) for _ in range(5))
            ]
        for i, (got, want) in enumerate(kept):
            close(got, want, f"{mode} MLP inference, call {i} (outputs kept)")
        base = Block().to(dev)
        xin = torch.randn(2, 16, 256, device=dev)
        params = []
        for compiled_ in (False, True):
            m = copy.deepcopy(base)
            fn = ember.compile(m, mode=mode) if compiled_ else m
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                fn(xin).square().mean().backward()
                opt.step()
            params.append([p.detach().clone() for p in m.parameters()])
        close(params[1], params[0], f"{mode} Block: parameters after three SGD steps", 1e-3)
    print(f"# CUDA graphs: {cudagraphs.summary()}; autotune: {dict(autotune.stats)}")
    if dev.type == "cuda":
        assert cudagraphs.stats["replays"] > 0, "nothing was replayed"


CHECKS = [
    check_inference,
    check_modes,
    check_training,
    check_dropout,
    check_bf16_break_and_transfer,
    check_mixed_devices_and_dynamo,
]


def per_call(fn: Callable[[], object], dev: torch.device, repeats: int) -> float:
    """Median over `repeats` blocks of the mean time per call (synchronized per block), ms."""

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    if repeats <= 1:  # --dry-run: one timed call is enough to exercise the path
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e3
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    n = max(3, min(200, int(0.05 / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def _model_rows(dev: torch.device, small: bool) -> dict[str, Callable[[], tuple]]:
    """name -> factory of (module or function, inputs, training?) for the timing table."""
    n, rows, d = (4096, 64, 128) if small else (1 << 22, 4096, 1024)

    def chain(x):
        return torch.sigmoid(x * 2 + 1).relu() - x.tanh()

    def softmax(x):
        return torch.softmax(x, -1)

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def on(*shape):
        return torch.randn(*shape, device=dev)

    out = {
        "pointwise chain": lambda: (chain, [on(n)], False),
        "softmax": lambda: (softmax, [on(rows, d)], False),
        "layer norm": lambda: (layer_norm, [on(rows, d), on(d), on(d)], False),
        "MLP 1024-4096-1024": lambda: (
            MLP().to(dev).eval(),
            [on(8 if small else 256, 1024)],
            False,
        ),
        "transformer block": lambda: (
            (Block().to(dev).eval(), [on(2, 16, 256)], False)
            if small
            else (Block().to(dev).eval(), [on(8, 128, 256)], False)
        ),
        "training step (block)": lambda: (
            (Block().to(dev), [on(2, 16, 256)], True)
            if small
            else (Block().to(dev), [on(8, 128, 256)], True)
        ),
    }
    if not small:
        from backend import gpt2, llama  # bench/backend.py: tiny configs from transformers

        out["GPT-2 tiny"] = lambda: (*gpt2(dev), False)
        out["Llama tiny"] = lambda: (*llama(dev), False)
    return out


def _variants(inductor: bool) -> dict[str, Callable[[Callable], Callable]]:
    """name -> how a model is compiled: eager, ember in its three modes, Inductor's default
    and reduce-overhead (its max-autotune takes minutes to compile per row: left out)."""
    out: dict[str, Callable[[Callable], Callable]] = {
        "eager": lambda m: m,
        "ember": lambda m: ember.compile(m),
        "ember reduce-overhead": lambda m: ember.compile(m, mode="reduce-overhead"),
        "ember max-autotune": lambda m: ember.compile(m, mode="max-autotune"),
    }
    if inductor:
        out["inductor"] = lambda m: torch.compile(m, dynamic=False)
        out["inductor reduce-overhead"] = lambda m: torch.compile(
            m, dynamic=False, mode="reduce-overhead"
        )
    return out


def timings(dev: torch.device, repeats: int, inductor: bool, small: bool) -> dict:
    """Per workload and variant: the first call (compile included) in s, then ms per call."""
    table: dict[str, dict[str, float]] = {}
    for name, factory in _model_rows(dev, small).items():
        row: dict[str, float] = {}
        for variant, compile_ in _variants(inductor).items():
            torch._dynamo.reset()
            fn, inputs, training = factory()
            compiled = compile_(copy.deepcopy(fn) if isinstance(fn, nn.Module) else fn)
            if training:
                opt = torch.optim.SGD(fn.parameters(), lr=1e-3)

                def call(c=compiled, opt=opt, inputs=inputs) -> object:
                    opt.zero_grad(set_to_none=True)
                    c(*inputs).square().mean().backward()
                    opt.step()
            else:

                def call(c=compiled, inputs=inputs) -> object:
                    with torch.no_grad():
                        return c(*inputs)

            t0 = time.perf_counter()
            call()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            row[f"{variant} first s"] = time.perf_counter() - t0
            row[f"{variant} ms"] = per_call(call, dev, repeats)
        table[name] = row
        print(f"| {name} | " + " | ".join(f"{k} {v:.3f}" for k, v in row.items()) + " |")
    return table


def install() -> None:
    """Install what the GPU machine lacks from wheels carried in .whl/ (it reaches no
    registry): ember itself runs from the checkout (sys.path above)."""
    wheels = os.path.join(HERE, "..", ".whl")
    if os.path.isdir(wheels) and os.listdir(wheels):
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        subprocess.run([*cmd, "--find-links", wheels, *glob.glob(f"{wheels}/*.whl")], check=True)
    import triton

    print(f"# triton {triton.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--install", action="store_true", help="install carried wheels first")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="on the CPU with Triton's interpreter (EMBER_TRITON_INTERPRET=1), small sizes, "
        "no Inductor: exercises the script and ember's Triton path without a GPU",
    )
    ap.add_argument("--tests", action="store_true", help="run the GPU pytest tests first")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.install:
        install()
    failed = gpu_tests() if args.tests else []
    if args.dry_run:
        args.device, args.repeats, args.no_inductor = "cpu", 1, True
        # CUDA graphs by the policy's CPU stand-in; autotuning timed once per configuration
        autotune.WARMUP, autotune.REPEATS = 0, 1
        with (
            config.patch(triton_interpret=True),
            cudagraphs.emulated_on_cpu(),
            triton_runtime.record_launches() as launches,
        ):
            failed += run(args)
        failed += compile_for_sm90(launches)
    else:
        failed += run(args)
    sys.exit(1 if failed else 0)


GPU_TESTS = [
    "tests/backend/test_cudagraphs.py",
    "tests/triton/test_triton_autotune.py",
    "tests/triton/test_triton_gpu_compile.py",
]


def gpu_tests() -> list[str]:
    """The pytest files whose GPU-only tests run where CUDA is (skipped elsewhere, saying
    so), with the rest of each file; one C++ target for the backend tests."""
    env = {**os.environ, "EMBER_TEST_ISAS": "native"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *GPU_TESTS]
    done = subprocess.run(cmd, cwd=os.path.join(HERE, ".."), env=env)
    print(f"{'ok  ' if done.returncode == 0 else 'FAIL'} gpu tests ({' '.join(GPU_TESTS)})")
    return [] if done.returncode == 0 else ["gpu tests"]


def compile_for_sm90(launches: list) -> list[str]:
    """The kernels the dry run launched, compiled by Triton's compiler for an H100/H200
    (sm_90) down to the cubin: no GPU needed, more than the interpreter checks."""
    start = time.perf_counter()
    try:
        kernels = triton_runtime.compile_ahead(launches, capability=90)
    except Exception:
        print(f"FAIL compile_for_sm90\n{traceback.format_exc()}")
        return ["compile_for_sm90"]
    took = time.perf_counter() - start
    print(f"ok   compile_for_sm90: {len(kernels)} distinct kernels, cubins, {took:.1f} s")
    return []


def run(args: argparse.Namespace) -> list[str]:
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"# torch {torch.__version__} on {name}, Python {sys.version.split()[0]}")
    failed = []
    checks = (
        [check_inference, check_modes, check_mixed_devices_and_dynamo] if args.dry_run else CHECKS
    )
    for check in checks:
        try:
            check(dev)
            print(f"ok   {check.__name__}")
        except Exception:
            failed.append(check.__name__)
            print(f"FAIL {check.__name__}\n{traceback.format_exc()}")
    print(
        f"# graphs run as aten ops (no code generator for their device): {stats['off_cpu_graphs']}"
    )
    result = {"failed": failed, "off_cpu_graphs": stats["off_cpu_graphs"]}
    result["timings"] = timings(dev, args.repeats, not args.no_inductor, args.dry_run)
    result["cudagraphs"] = cudagraphs.summary()
    result["autotune"] = dict(autotune.stats)
    print(f"# CUDA graphs: {result['cudagraphs']}\n# autotune: {result['autotune']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return failed


if __name__ == "__main__":
    main()
