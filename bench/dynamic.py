"""Dynamic shapes: ember's backend behind Dynamo against its own static kernels and Inductor.

Issue 13's backend-side numbers, in one process (per ../shared/BENCHMARKING.md: interleaved
blocks, medians, ratios; the CPU share other processes took is reported, the machine is
shared):

1. compiles: a workload called with N distinct sizes (automatic dynamic, `dynamic=None`)
   -> graphs handed to the backend and aten graphs ember generated (goal: at most 2 graphs);
2. steady state at one size: ember's static kernel (`dynamic=False`), ember's dynamic kernel
   (the batch/sequence dims marked dynamic) and Inductor's dynamic kernel, interleaved;
   goal: dynamic >= 0.9x static and >= Inductor dynamic;
3. compile time of the dynamic graph against the static one (first call, empty ember cache;
   imports warmed beforehand), goal <= 1.5x (stage by stage, repeated: dynamic_compile.py);
4. a loop over 64 sequence lengths of GPT-2 tiny (compile + run, automatic dynamic, empty
   caches): ember.compile and torch.compile with ember's backend against torch.compile
   (Inductor), graphs and total seconds (issue 13's goal: ember at most 1/10 of
   torch.compile's); `--seq-loop` runs only this section. While other processes hold the
   CPUs, the calls that do not compile are set by OpenMP threads spinning at region ends
   (both stacks'; 3-10x slower than with `OMP_WAIT_POLICY=passive`, which the line names;
   notes/backend.md, session 17);
5. ember.compile's own capture (automatic dynamic) against torch.compile on a loop over the
   sizes of each workload: graphs and total seconds (compile + run).

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184 \\
        .venv/bin/python bench/dynamic.py [--only softmax,mlp] [--blocks 11] [--no-loop]
        [--capture-only] [--seq-loop]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-bench-dynamic-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-dynamic-"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend import MLP, Block, hand_layer_norm, softmax  # noqa: E402
from timing import block, calls_per_block  # noqa: E402

import ember.backend  # noqa: E402
from ember import config  # noqa: E402
from ember.backend import compile as backend_compile  # noqa: E402


def gpt2_model():
    import transformers

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=2048)
        model = transformers.GPT2Model(cfg).eval()

    def run(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    return run


# name -> (factory of (fn, make_inputs(size) -> args, dynamic dims per arg), bench size,
#          sizes for the compile count)
def workloads() -> dict[str, tuple]:
    def rows(fn, cols=1024, extra=()):
        def make(n):
            return (torch.randn(n, cols), *extra)

        return fn, make, [(0,)] + [()] * len(extra)

    def ln():
        w, b = torch.randn(1024), torch.randn(1024)
        return rows(hand_layer_norm, extra=(w, b))

    def mlp():
        return MLP().eval(), lambda n: (torch.randn(n, 1024),), [(0,)]

    def block_():
        return Block().eval(), lambda t: (torch.randn(8, t, 256),), [(1,)]

    def gpt2():
        return gpt2_model(), lambda t: (torch.randint(0, 2048, (4, t)),), [(1,)]

    return {
        "softmax": (lambda: rows(softmax), 4096, [2, 3, 7, 17, 33, 64, 1023, 4096]),
        "layer norm": (ln, 4096, [2, 3, 7, 17, 33, 64, 1023, 4096]),
        "nn.LayerNorm cols": (
            lambda: (
                lambda x: F.layer_norm(x, x.shape[-1:]),
                lambda c: (torch.randn(512, c),),
                [(1,)],
            ),
            1024,
            [16, 17, 33, 64, 255, 1023, 1024],
        ),
        "MLP": (mlp, 256, [1, 2, 3, 17, 64, 100, 256]),
        "transformer block": (block_, 128, [3, 17, 33, 64, 100, 128]),
        "GPT-2 tiny": (gpt2, 128, list(range(1, 129, 9)) + [128]),
    }


class Counting:
    def __init__(self, backend) -> None:
        self.graphs = 0
        self.backend = backend

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.backend(gm, example_inputs)


class Timed:
    """ember's backend (a distinct object per variant, so Dynamo keeps the variants' cache
    entries apart), timing its calls: the graph's compile without Dynamo's capture."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, gm, example_inputs):
        start = time.perf_counter()
        try:
            return ember.backend(gm, example_inputs)
        finally:
            self.seconds += time.perf_counter() - start


def _ember() -> Callable:
    return Timed()


def count_compiles(name: str, factory, sizes: list[int]) -> dict:
    torch._dynamo.reset()
    backend_compile.stats.clear()
    fn, make, _ = factory()
    counter = Counting(ember.backend)
    compiled = torch.compile(fn, backend=counter)
    worst = 0.0
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            worst = max(worst, (compiled(*args) - fn(*args)).abs().max().item())
    return {
        "graphs": counter.graphs,
        "generated": backend_compile.stats["generated"],
        "sizes": len(sizes),
        "diff": worst,
    }


def count_training(sizes: list[int]) -> dict:
    """The MLP in training (forward and backward) over a variable batch."""
    torch._dynamo.reset()
    backend_compile.stats.clear()
    model = MLP()
    counter = Counting(ember.backend)
    compiled = torch.compile(model, backend=counter)
    for n in sizes:
        compiled(torch.randn(n, 1024)).sum().backward()
    return {"graphs": counter.graphs, "generated": backend_compile.stats["generated"]}


def count_decoding(steps: int) -> dict:
    """A KV cache grown by one token per step (cat + attention over the cache)."""
    torch._dynamo.reset()
    backend_compile.stats.clear()

    def step(cache, x):
        cache = torch.cat([cache, x], dim=1)
        return cache, torch.softmax(x @ cache.transpose(1, 2) * 0.0625, -1) @ cache

    counter = Counting(ember.backend)
    compiled = torch.compile(step, backend=counter)
    cache = torch.randn(4, 1, 256)
    with torch.no_grad():
        for _ in range(steps):
            cache, _ = compiled(cache, torch.randn(4, 1, 256))
    return {"graphs": counter.graphs, "generated": backend_compile.stats["generated"]}


def _marked(args: tuple, dims: list[tuple[int, ...]]) -> tuple:
    out = []
    for a, ds in zip(args, dims):
        if ds:
            a = a.clone()
            torch._dynamo.mark_dynamic(a, list(ds))
        out.append(a)
    return tuple(out)


def steady(name: str, factory, size: int, blocks: int, block_s: float) -> dict:
    torch._dynamo.reset()
    fn, make, dims = factory()
    args = make(size)
    variants: dict[str, Callable] = {}
    compile_s: dict[str, float] = {}  # in ember's backend (aot + codegen + g++)
    first_s: dict[str, float] = {}  # the whole first call (Dynamo's capture included)
    with torch.no_grad():
        # the dynamic variant compiles first: a first-compile cost left after the warm-up
        # then counts against it, not against the static one it is compared with
        for v, backend, dynamic in (
            ("ember dynamic", _ember(), None),
            ("ember static", _ember(), False),
            ("inductor dynamic", "inductor", None),
        ):
            f = torch.compile(fn, backend=backend, dynamic=dynamic)
            first = _marked(args, dims) if dynamic is None else args
            # an empty cache per variant: the compile count above filled one
            with config.patch(cache_dir=tempfile.mkdtemp(prefix="ember-bench-variant-")):
                start = time.perf_counter()
                f(*first)
                first_s[v] = time.perf_counter() - start
            compile_s[v] = backend.seconds if isinstance(backend, Timed) else first_s[v]
            variants[v] = f
        expected = fn(*args)
        diffs = {v: (f(*args) - expected).abs().max().item() for v, f in variants.items()}
        counts = {v: calls_per_block(f, args, block_s) for v, f in variants.items()}
        samples: dict[str, list] = {v: [] for v in variants}
        for _ in range(blocks):
            for v, f in variants.items():
                samples[v].append(block(f, args, counts[v]))
    return {
        "s": {v: statistics.median(r["per_call"] for r in rs) for v, rs in samples.items()},
        "others": statistics.median(r["others"] for rs in samples.values() for r in rs),
        "compile": compile_s,
        "first": first_s,
        "diff": diffs,
    }


SEQ_LENGTHS = list(range(1, 129, 2))
"""Issue 13's loop: 64 sequence lengths of GPT-2 tiny."""


def seq_loop(backend, lengths: list[int]) -> float:
    """Total seconds of GPT-2 tiny over the lengths (compile and run), automatic dynamic."""
    torch._dynamo.reset()
    run = gpt2_model()
    compiled = torch.compile(run, backend=backend)
    ids = [torch.randint(0, 2048, (4, n)) for n in lengths]
    start = time.perf_counter()
    with torch.no_grad():
        for x in ids:
            compiled(x)
    return time.perf_counter() - start


def capture_loop(factory, sizes: list[int]) -> dict:
    """ember.compile's own capture (automatic dynamic, ember's backend) over the sizes against
    torch.compile (Dynamo + Inductor, automatic dynamic) on the same loop: graphs compiled and
    total seconds (capture, compile and run), each with an empty cache."""
    from torch._inductor.compile_fx import compile_fx

    from ember.testing import CountingBackend

    fn, make, _ = factory()
    args = [make(n) for n in sizes]
    ember.reset()
    torch._dynamo.reset()
    ember_counter = CountingBackend("ember")
    inductor_counter = Counting(compile_fx)
    runs = {
        "ember": ember.compile(fn, backend=ember_counter),
        "torch.compile": torch.compile(fn, backend=inductor_counter),
    }
    graphs = {
        "ember": lambda: ember_counter.frame_count,
        "torch.compile": lambda: inductor_counter.graphs,
    }
    seconds, compiling, worst = {}, {}, {}
    with torch.no_grad():
        start = time.perf_counter()
        expected = [fn(*a) for a in args]
        eager_s = time.perf_counter() - start
        for name, compiled in runs.items():
            with config.patch(cache_dir=tempfile.mkdtemp(prefix="ember-bench-capture-")):
                outs, compiling[name] = [], 0.0
                start = time.perf_counter()
                for a in args:
                    before, call_start = graphs[name](), time.perf_counter()
                    outs.append(compiled(*a))
                    if graphs[name]() != before:
                        compiling[name] += time.perf_counter() - call_start
                seconds[name] = time.perf_counter() - start
            worst[name] = max((o - e).abs().max().item() for o, e in zip(outs, expected))
    return {
        "graphs": (ember_counter.frame_count, inductor_counter.graphs),
        "s": seconds,
        "compiling": compiling,
        "eager": eager_s,
        "diff": max(worst.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--blocks", type=int, default=11)
    ap.add_argument("--block-s", type=float, default=0.1)
    ap.add_argument("--no-loop", action="store_true")
    ap.add_argument("--capture-only", action="store_true", help="only ember.compile's section")
    ap.add_argument("--seq-loop", action="store_true", help="only the 64 GPT-2 lengths")
    opts = ap.parse_args()
    torch.manual_seed(0)
    # warm imports (Dynamo, Inductor, ember) so compile times hold no import
    warm = torch.compile(lambda x: x + 1, backend=_ember())
    warm(torch.randn(3))
    torch.compile(lambda x: x * 2)(torch.randn(3))
    ember.compile(lambda x: x * 3)(torch.randn(3))
    if opts.seq_loop:
        print_seq_loop(dynamo_backend=False)
        return
    chosen = workloads()
    if opts.only:
        chosen = {k: v for k, v in chosen.items() if k in opts.only.split(",")}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        "\nember.compile's own capture (automatic dynamic) vs torch.compile, a loop over the"
        " sizes, compile + run:\n\n| workload | sizes | graphs ember / torch.compile | total s"
        " ember / torch.compile | ratio | max abs diff |\n|---|---|---|---|---|---|"
    )
    for name, (factory, _, sizes) in chosen.items():
        c = capture_loop(factory, sizes)
        e, t = c["s"]["ember"], c["s"]["torch.compile"]
        print(
            f"| {name} | {len(sizes)} | {c['graphs'][0]} / {c['graphs'][1]} | {e:.2f} / "
            f"{t:.2f} | {t / e:.1f}x | {c['diff']:.1e} |"
        )
    if opts.capture_only:
        return
    print("\n| workload | sizes | graphs | aten graphs generated | max abs diff |")
    print("|---|---|---|---|---|")
    for name, (factory, _, sizes) in chosen.items():
        c = count_compiles(name, factory, sizes)
        print(f"| {name} | {c['sizes']} | {c['graphs']} | {c['generated']} | {c['diff']:.1e} |")
    if not opts.only:
        t = count_training([2, 3, 17, 64, 100, 256])
        print(f"| MLP training | 6 | {t['graphs']} | {t['generated']} | - |")
        d = count_decoding(64)
        print(f"| KV cache, 64 decoding steps | 64 | {d['graphs']} | {d['generated']} | - |")
    print(
        "\n| workload | size | ember static | ember dynamic | inductor dynamic | dyn/static "
        "speed | dyn vs inductor | backend compile static / dynamic s (ratio) | first call "
        "static / dynamic / inductor dynamic s | others |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (factory, size, _) in chosen.items():
        r = steady(name, factory, size, opts.blocks, opts.block_s)
        s, c, first = r["s"], r["compile"], r["first"]
        st, dy, ind = s["ember static"], s["ember dynamic"], s["inductor dynamic"]
        ratio = c["ember dynamic"] / c["ember static"]
        print(
            f"| {name} | {size} | {st * 1e3:.3f} ms | {dy * 1e3:.3f} ms | {ind * 1e3:.3f} ms | "
            f"{st / dy:.2f}x | {ind / dy:.2f}x | {c['ember static']:.2f} / "
            f"{c['ember dynamic']:.2f} ({ratio:.2f}x) | {first['ember static']:.2f} / "
            f"{first['ember dynamic']:.2f} / {first['inductor dynamic']:.2f} | "
            f"{r['others']:.0%} |"
        )
    if not opts.no_loop:
        print_seq_loop(dynamo_backend=True)


def print_seq_loop(dynamo_backend: bool) -> None:
    """Section 4: GPT-2 tiny over 64 sequence lengths, compile and run."""
    c = capture_loop(workloads()["GPT-2 tiny"][0], SEQ_LENGTHS)
    e, t = c["s"]["ember"], c["s"]["torch.compile"]
    ce, ct = c["compiling"]["ember"], c["compiling"]["torch.compile"]
    print(
        f"\nGPT-2 tiny over {len(SEQ_LENGTHS)} sequence lengths (compile + run): ember.compile"
        f" {e:.2f} s in {c['graphs'][0]} graphs, torch.compile (Inductor) {t:.2f} s in "
        f"{c['graphs'][1]} graphs ({t / e:.1f}x), max abs diff {c['diff']:.1e}\n"
        f"calls that compiled: ember {ce:.2f} s, torch.compile {ct:.2f} s; the other calls: "
        f"ember {e - ce:.2f} s, torch.compile {t - ct:.2f} s; eager over the loop "
        f"{c['eager']:.2f} s; load average {os.getloadavg()[0]:.1f}; OMP_WAIT_POLICY "
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    )
    if dynamo_backend:
        ember_s = seq_loop(ember.backend, SEQ_LENGTHS)
        print(f"torch.compile with ember's backend: {ember_s:.2f} s ({t / ember_s:.1f}x)")


if __name__ == "__main__":
    main()
