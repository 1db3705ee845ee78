"""ember's backend against eager and Inductor, in one process, per BENCHMARKING.md.

Workloads: pointwise chain (4M floats), softmax 4096x1024, hand-written layer norm and
nn.LayerNorm 4096x1024, MLP block (1024->4096->1024, batch 256), transformer block (seq 128,
d 256, batch 8), tiny call (3 pointwise ops on 16 floats), GPT-2 and Llama with tiny configs (if
`transformers` is installed). Variants: eager, torch.compile (Inductor), ember.compile
(ember's capture and backend: "ember") and torch.compile(backend=ember.backend) (ember's
backend behind PyTorch's capture: "ember (dynamo)").

Method: eager and compiled variants timed in interleaved blocks of ~0.1 s, median of 11
blocks; a block during which other processes used more than 10% of the CPUs is timed again.
Every row records the max abs difference to eager, and memory-bound rows the fraction of the
triad bandwidth measured in the same run. First calls are timed in fresh processes (imports
timed separately): cold with empty EMBER_CACHE_DIR/TORCHINDUCTOR_CACHE_DIR, warm reusing them.

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=17179869184 \\
        .venv/bin/python bench/backend.py [--only softmax,tiny] [--no-first-call]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import block, calls_per_block, triad_gbs  # noqa: E402

# ----------------------------------------------------------------------------- workloads


def pointwise_chain(x):
    return torch.sigmoid(x * 1.5 + 0.5) * torch.tanh(x) - x.abs()


def softmax(x):
    return torch.softmax(x, -1)


def hand_layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    d = x - mean
    var = (d * d).mean(-1, keepdim=True)
    return d / torch.sqrt(var + 1e-5) * w + b


def tiny(x):
    return torch.relu(x * 2.0 + 1.0)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(1024, 4096), nn.Linear(4096, 1024)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5, -1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def gpt2(device: str | torch.device = "cpu"):
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=2048, n_positions=256)
    return _hidden_states(GPT2Model(cfg).eval().to(device), device)


def llama(device: str | torch.device = "cpu"):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return _hidden_states(LlamaModel(cfg).eval().to(device), device)


def _hidden_states(model: nn.Module, device: str | torch.device) -> tuple[Callable, list]:
    """A transformers model as a function of token ids (4 x 128 of a 2048 vocabulary)."""

    def run(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    return run, [torch.randint(0, 2048, (4, 128), device=device)]


def workloads() -> dict[str, Callable[[], tuple[Callable, list, float | None]]]:
    """name -> factory of (function, inputs, minimum bytes moved or None)."""
    big = 4096 * 1024 * 4

    def ln_module():
        m = nn.LayerNorm(1024).eval()
        return m, [torch.randn(4096, 1024)], 2 * big

    return {
        "pointwise chain 4M": lambda: (pointwise_chain, [torch.randn(1 << 22)], 2 * (4 << 22)),
        "softmax 4096x1024": lambda: (softmax, [torch.randn(4096, 1024)], 2 * big),
        "layer norm (hand) 4096x1024": lambda: (
            hand_layer_norm,
            [torch.randn(4096, 1024), torch.randn(1024), torch.randn(1024)],
            2 * big,
        ),
        "nn.LayerNorm 4096x1024": ln_module,
        "MLP 1024-4096-1024 b256": lambda: (MLP().eval(), [torch.randn(256, 1024)], None),
        "transformer block s128 d256 b8": lambda: (
            Block().eval(),
            [torch.randn(8, 128, 256)],
            None,
        ),
        "tiny call 16 floats": lambda: (tiny, [torch.randn(16)], None),
        "GPT-2 tiny": lambda: (*gpt2(), None),
        "Llama tiny": lambda: (*llama(), None),
    }


def variants(fn: Callable) -> dict[str, Callable]:
    """eager, Inductor, ember's backend behind PyTorch's capture, and ember.compile (ember's
    own capture in front of the same backend: the product)."""
    import ember
    import ember.backend

    return {
        "eager": fn,
        "inductor": torch.compile(fn, dynamic=False),
        "ember (dynamo)": torch.compile(fn, backend=ember.backend, dynamic=False),
        "ember": ember.compile(fn),
    }


def _max_diff(a, b) -> float:
    if isinstance(a, tuple | list):
        return max(_max_diff(x, y) for x, y in zip(a, b))
    return (a.float() - b.float()).abs().max().item()


# ----------------------------------------------------------------------------- steady state


@torch.no_grad()
def steady(name: str, factory, blocks: int, block_s: float) -> dict:
    fn, inputs, nbytes = factory()
    vs = variants(fn)
    expected = fn(*inputs)
    diffs = {}
    for v, f in vs.items():
        for _ in range(3):
            out = f(*inputs)
        diffs[v] = _max_diff(out, expected)
    counts = {v: calls_per_block(f, inputs, block_s) for v, f in vs.items()}
    samples: dict[str, list] = {v: [] for v in vs}
    retimed = 0
    for _ in range(blocks):
        for v, f in vs.items():
            for _attempt in range(3):
                s = block(f, inputs, counts[v])
                if s["others"] <= 0.10:
                    break
                retimed += 1
            samples[v].append(s)
    res = {"bytes": nbytes, "retimed": retimed, "variants": {}}
    for v, rows in samples.items():
        res["variants"][v] = {
            "s": statistics.median(r["per_call"] for r in rows),
            "faults": statistics.median(r["faults"] for r in rows),
            "diff": diffs[v],
        }
    return res


# ----------------------------------------------------------------------------- first call


def _child(name: str, variant: str) -> None:
    """One first call in a fresh process. Imports are timed apart: Inductor's compiler
    package (`torch._dynamo`, `torch._inductor.compile_fx`) for "inductor", ember's (`ember`,
    `ember.backend`, which imports its whole compiler) for "ember" (ember's own capture) and
    "ember (dynamo)" (`torch.compile(backend=ember.backend)`). The first call includes making
    the compiled callable."""
    packages = {
        "inductor": ["torch._dynamo", "torch._inductor.compile_fx"],
        "ember": ["ember", "ember.backend"],
        "ember (dynamo)": ["torch._dynamo", "ember", "ember.backend"],
    }[variant]
    t0 = time.perf_counter()
    for package in packages:
        importlib.import_module(package)
    t1 = time.perf_counter()
    fn, inputs, _ = workloads()[name]()
    with torch.no_grad():
        t2 = time.perf_counter()
        if variant == "ember":
            f = sys.modules["ember"].compile(fn)
        elif variant == "inductor":
            f = torch.compile(fn, dynamic=False)
        else:
            f = torch.compile(fn, backend=sys.modules["ember.backend"], dynamic=False)
        f(*inputs)
        t3 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "first_s": t3 - t2}))


def first_call(name: str, variant: str, cache: str) -> dict:
    env = dict(os.environ, EMBER_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=cache)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, variant],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name}/{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


FIRST_CALL_VARIANTS = ("inductor", "ember", "ember (dynamo)")


def first_calls(name: str) -> dict:
    out = {}
    for variant in FIRST_CALL_VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            cold = first_call(name, variant, tmp)
            warm = first_call(name, variant, tmp)
        out[variant] = {
            "cold": cold["first_s"],
            "warm": warm["first_s"],
            "import": cold["import_s"],
        }
    return out


# ----------------------------------------------------------------------------- report


def report(rows: dict, firsts: dict, triad: float) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; triad {triad:.1f} GB/s")
    print(
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')} "
        f"MALLOC_TRIM_THRESHOLD_={os.environ.get('MALLOC_TRIM_THRESHOLD_', 'unset')}"
    )
    print()
    print(
        "| workload | eager | inductor | ember | ember (dynamo) | ember/eager | ember/inductor "
        "| ember (dynamo)/eager | ember % triad | max abs diff (ind, ember) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        v = r["variants"]
        e, i, m, d = (v[k]["s"] for k in ("eager", "inductor", "ember", "ember (dynamo)"))
        bw = f"{r['bytes'] / m / 1e9 / triad * 100:.0f}%" if r["bytes"] else "-"
        print(
            f"| {name} | {_t(e)} | {_t(i)} | {_t(m)} | {_t(d)} | {e / m:.2f}x | {i / m:.2f}x "
            f"| {e / d:.2f}x | {bw} | {v['inductor']['diff']:.1e}, {v['ember']['diff']:.1e} |"
        )
    if not firsts:
        return
    print()
    print(
        "First calls (fresh processes; import = the compiler's package, timed apart; "
        "ember = ember.compile, ember (dynamo) = torch.compile(backend=ember.backend))"
    )
    print()
    print(
        "| workload | import ind / ember | cold ind / ember / ember (dynamo) "
        "| warm ind / ember / ember (dynamo) | ember cold, warm as a fraction of inductor's |"
    )
    print("|---|---|---|---|---|")
    for name, f in firsts.items():
        ind, emb, dyn = (f[k] for k in FIRST_CALL_VARIANTS)
        print(
            f"| {name} | {ind['import']:.2f} s / {emb['import']:.2f} s "
            f"| {ind['cold']:.2f} s / {emb['cold']:.2f} s / {dyn['cold']:.2f} s "
            f"| {ind['warm']:.2f} s / {emb['warm']:.2f} s / {dyn['warm']:.2f} s "
            f"| 1/{ind['cold'] / emb['cold']:.0f}, 1/{ind['warm'] / emb['warm']:.0f} |"
        )


def _t(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", nargs=2)
    p.add_argument("--only", default="")
    p.add_argument("--blocks", type=int, default=11)
    p.add_argument("--block-s", type=float, default=0.1)
    p.add_argument("--no-first-call", action="store_true")
    a = p.parse_args()
    if a.child:
        _child(*a.child)
        return
    names = [n for n in workloads() if not a.only or any(k in n for k in a.only.split(","))]
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("# transformers is not installed: GPT-2 and Llama rows skipped", file=sys.stderr)
        names = [n for n in names if n not in ("GPT-2 tiny", "Llama tiny")]
    triad = triad_gbs()
    rows, firsts = {}, {}
    for name in names:
        rows[name] = steady(name, workloads()[name], a.blocks, a.block_s)
        if not a.no_first_call:
            firsts[name] = first_calls(name)
        print(f"# done {name}", file=sys.stderr)
    report(rows, firsts, triad)


if __name__ == "__main__":
    main()
