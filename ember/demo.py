"""`make demo`: compile a small real model with ember and show what the compiler did.

The model is a two-layer pre-norm transformer (multi-head attention written out with softmax,
GELU MLP, residuals) built from plain `torch.nn` pieces, because that is what ember's users will
hand it; `nn.TransformerEncoderLayer` is avoided on purpose, since its fast path dispatches to a
fused kernel that hides the ordinary module code the capture has to read.

The demo checks the compiled output against eager (a compiler that is fast but wrong is
useless), then prints the three artefacts a user reads when something goes wrong: the captured
graph, the guard function that decides whether the cached code may run, and the time of the first
call (capture + backend compile) and of later calls (guard check + compiled code) against eager.

It asks for ember's own backend ("ember", C++ codegen) and, if that fails, says so and falls back
to backend "eager" (the captured graph run by torch), so the capture stage is still shown. It
compiles with fullgraph=True: without it an unsupported construct would quietly run the model
eagerly, and the demo would show matching outputs from a compiler that did nothing.

Run: `make demo`, or `python -m ember.demo [--backend NAME]`.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.capture import cache as frame_cache
from ember.capture.frame import graph_code

BATCH, SEQ, DIM, HEADS, LAYERS = 2, 16, 64, 4, 2


class Attention(nn.Module):
    """Multi-head self-attention with the softmax written out (no fused kernel), so the graph
    shows every step."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.reshape(b, s, h, d // h).transpose(1, 2)
        k = k.reshape(b, s, h, d // h).transpose(1, 2)
        v = v.reshape(b, s, h, d // h).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        attn = torch.softmax(scores, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, s, d)
        return self.proj(out)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def _time_once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _interleaved(
    a: Callable[[], object], b: Callable[[], object], rounds: int
) -> tuple[list[float], list[float]]:
    """Seconds per call of a and b, alternating so that both see the same machine load."""
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_time_once(a))
        tb.append(_time_once(b))
    return sorted(ta), sorted(tb)


def _readable_guard(guard_source: str, conditions: list[str]) -> str:
    """The generated guard returns `(c1) and (c2) and ...` on one line; show the same function
    with one condition per line (display only: the text on the entry is what runs)."""
    lines = guard_source.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("return (") and conditions:
            indent = line[: len(line) - len(line.lstrip())]
            body = [f"{indent}    ({conditions[0]})"]
            body += [f"{indent}    and ({c})" for c in conditions[1:]]
            shown = [*lines[:i], f"{indent}return (", *body, f"{indent})", *lines[i + 1 :]]
            return "\n".join(shown)
    return guard_source


def _compile_and_check(
    model: nn.Module, x: torch.Tensor, expected: torch.Tensor, backend: str
) -> tuple[nn.Module, float, float]:
    """Compile, run the first call, compare; returns (compiled, first-call seconds, max diff).
    Raises if the backend fails or the result is not close to eager."""
    ember.reset()
    compiled = ember.compile(model, backend=backend, fullgraph=True)
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(x)
    first = time.perf_counter() - start
    diff = (out - expected).abs().max().item()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    return compiled, first, diff


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ember", help="ember backend name (default: ember)")
    parser.add_argument("--rounds", type=int, default=200, help="timed calls of each kind")
    parser.add_argument("--quiet", action="store_true", help="skip printing graph and guards")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: this model is too small to gain from more, and"
        " on a busy machine spinning OpenMP workers make timings erratic)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = Transformer(DIM, HEADS, LAYERS).eval()
    x = torch.randn(BATCH, SEQ, DIM)
    with torch.no_grad():
        expected = model(x)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {LAYERS}-layer transformer, dim {DIM}, {HEADS} heads, {n_params} parameters")
    print(
        f"input: {tuple(x.shape)} float32, torch {torch.__version__}, eval mode, no_grad,"
        f" {torch.get_num_threads()} thread(s)\n"
    )

    backend = args.backend
    try:
        compiled, first, diff = _compile_and_check(model, x, expected, backend)
    except Exception as exc:
        if backend == "eager":
            raise
        print(f"NOTE: backend {backend!r} failed, falling back to backend 'eager'.")
        print("      (the capture stage below is ember's; the graph then runs as torch code)")
        print("      the failure was:")
        lines = traceback.format_exception_only(type(exc), exc)
        for line in "".join(lines).strip().splitlines()[:12]:
            print(f"        {line}")
        print()
        backend = "eager"
        compiled, first, diff = _compile_and_check(model, x, expected, backend)

    print(f"backend: {backend!r}")
    print(f"correctness: max abs diff to eager = {diff:.3g} (assert_close passed)\n")

    entries = frame_cache.cache_for(type(model).forward.__code__).entries
    if not args.quiet:
        entry = entries[-1]
        print(f"=== captured graph ({len(entries)} cache entry) ===")
        print(graph_code(entry.graph) if entry.graph is not None else "(empty graph)")
        n_cond = len(entry.guard.conditions)
        print(f"=== guard function ({n_cond} conditions, one per line) ===")
        print(_readable_guard(entry.guard.source_text, entry.guard.conditions))

    with torch.no_grad():
        for _ in range(10):  # warm both paths before timing
            compiled(x)
            model(x)
        t_eager, t_compiled = _interleaved(lambda: model(x), lambda: compiled(x), args.rounds)
        out = compiled(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    if len(entries) != 1:
        raise AssertionError(f"later calls recompiled: {len(entries)} cache entries")

    p10 = args.rounds // 10
    print("=== timing ===")
    print(f"first call (capture + {backend!r} compile + run): {first * 1e3:.1f} ms")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"later calls, {args.rounds} interleaved: median (fastest 10%); load average {load}")
    for name, ts in (("eager", t_eager), (f"ember, backend {backend!r}", t_compiled)):
        print(f"  {name:<26} {statistics.median(ts) * 1e6:9.1f} us ({ts[p10] * 1e6:.1f} us)")
    ratio = statistics.median(t_compiled) / statistics.median(t_eager)
    print(f"  compiled / eager           {ratio:9.2f}x")
    print("(per-call guard cost grows with the number of parameters; see notes/capture.md)")


if __name__ == "__main__":
    main()
