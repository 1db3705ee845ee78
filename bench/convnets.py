"""Convolution nets: eager vs Inductor vs ember, inference and one SGD training step, one process.

Workloads (hand-written, random weights, float32, NCHW unless the name says otherwise):
- `block`: the sweep's ResNet block (ember/testing/models.py `ResNetBlock`: conv-BN-ReLU,
  conv-BN-ReLU, conv-BN + shortcut, ReLU, global mean, linear), batch 2 x 3 x 32 x 32.
- `resnet`: a small ResNet (stem conv-BN-ReLU, 3x3 max pool, two basic blocks, the second with
  a strided 1x1 conv-BN shortcut, adaptive average pool, linear), batch 8 x 3 x 64 x 64.
- `resnet_cl`: the same with channels-last input and weights.

Each compiler runs the model's forward (`torch.compile(model)` for Inductor,
`ember.compile(model)` for ember); the loss's backward runs their backward graphs and the SGD
update is eager everywhere. Method (/work/shared/BENCHMARKING.md): interleaved blocks of
~0.1 s, medians, ratios over eager; max abs diff of outputs (inference) and of parameters
after the step (training) against eager beside every ratio.

    .venv/bin/python bench/convnets.py [--workloads block,resnet,resnet_cl] [--modes infer,train]
        [--blocks 11] [--threads 2] [--conv-layouts auto,eager] [--clock wall|cpu]

`--conv-layouts auto,eager` adds a column of ember with eager's convolution layout
(EMBER_CONV_LAYOUT=eager) beside the default (auto: channels-last where timed faster).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import warnings

_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "17179869184"}
if __name__ == "__main__" and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_MALLOC})

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from timing import block, calls_per_block  # noqa: E402

import ember  # noqa: E402
from ember import config  # noqa: E402
from ember.testing.models import ResNetBlock  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(width, width, 1)
        self.layer2 = BasicBlock(width, 2 * width, 2)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.pool(self.stem(x))))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


CONVNETS = ("block", "resnet", "resnet_cl")


def workload(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], bool]:
    """(model, inputs, whether the model returns its loss itself)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name == "block":
        x = torch.randn(2, 3, 32, 32, generator=gen)
        return ResNetBlock(), (x, torch.tensor([0, 1])), True
    model = SmallResNet()
    x = torch.randn(8, 3, 64, 64, generator=gen)
    if name == "resnet_cl":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, (x,), False


def _loss(out: torch.Tensor, returns_loss: bool) -> torch.Tensor:
    return out if returns_loss else out.square().mean()


def _runner(call, model: nn.Module, inputs, train: bool, returns_loss: bool):
    if not train:

        def infer():
            with torch.no_grad():
                return call(*inputs)

        return infer
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        loss = _loss(call(*inputs), returns_loss)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def measure(
    name: str, train: bool, blocks: int, block_s: float, layouts: list[str], clock: str
) -> dict:
    """Times of eager, Inductor and ember (one variant per EMBER_CONV_LAYOUT value in
    `layouts`: "ember" for the first, "ember[layout]" for the others), per call on the
    `clock` timing.block reports ("per_call": wall; "cpu_per_call": the process's CPU)."""
    base, inputs, returns_loss = workload(name)
    base.train(train)
    runners, models, layout_of = {}, {}, {}
    for i, layout in enumerate(layouts):
        layout_of["ember" if i == 0 else f"ember[{layout}]"] = layout
    for variant in ("eager", "inductor", *layout_of):
        model = copy.deepcopy(base)
        if variant in layout_of:
            call = ember.compile(model)
        else:
            call = torch.compile(model) if variant == "inductor" else model
        models[variant] = model
        runners[variant] = _runner(call, model, inputs, train, returns_loss)
    # correctness: one call (and step) from the same state, compared with eager's; the
    # first call compiles, so ember's variants make it under their layout setting
    results = {}
    for k, fn in runners.items():
        with config.patch(conv_layout=layout_of.get(k, "auto")):
            results[k] = fn()
    diffs = {}
    for k in runners:
        if k == "eager":
            continue
        if train:
            pairs = zip(models[k].state_dict().values(), models["eager"].state_dict().values())
            diffs[k] = max((a.float() - b.float()).abs().max().item() for a, b in pairs)
        else:
            diffs[k] = (results[k] - results["eager"]).abs().max().item()
    for fn in runners.values():
        fn()
    n = calls_per_block(runners["eager"], (), block_s)
    times: dict[str, list[float]] = {k: [] for k in runners}
    others: list[float] = []
    for _ in range(blocks):
        for k, fn in runners.items():
            r = block(fn, (), n)
            times[k].append(r[clock])
            others.append(r["others"])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"med": med, "diffs": diffs, "others": statistics.median(others)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", default="block,resnet,resnet_cl")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--blocks", type=int, default=11)
    p.add_argument("--block-s", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--conv-layouts",
        default="auto",
        help="EMBER_CONV_LAYOUT values, one ember column each (e.g. auto,eager)",
    )
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time per call (with --threads 1, what a call costs "
        "on a machine other jobs load: wall-clock medians there moved 10%% between runs)",
    )
    args = p.parse_args()
    clock = "per_call" if args.clock == "wall" else "cpu_per_call"
    layouts = args.conv_layouts.split(",")
    extra = [f"ember[{v}]" for v in layouts[1:]]
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = 64
    print(f"torch {torch.__version__}, {args.threads} threads, {args.clock} clock")
    head = "".join(f" {v} | {v}/inductor |" for v in extra)
    print(
        "| workload | mode | eager | inductor | ember | inductor/eager | ember/eager "
        f"| ember/inductor |{head} max diff (ind, ember) | CPU used by others |"
    )
    print("|---|---|---|---|---|---|---|---|" + "---|---|" * len(extra) + "---|---|")
    for name in args.workloads.split(","):
        for mode in args.modes.split(","):
            r = measure(name, mode == "train", args.blocks, args.block_s, layouts, clock)
            m, d = r["med"], r["diffs"]
            more = "".join(f" {m[v] * 1e3:.3f} ms | {m['inductor'] / m[v]:.2f}x |" for v in extra)
            print(
                f"| {name} | {mode} | {m['eager'] * 1e3:.3f} ms | {m['inductor'] * 1e3:.3f} ms "
                f"| {m['ember'] * 1e3:.3f} ms | {m['eager'] / m['inductor']:.2f}x "
                f"| {m['eager'] / m['ember']:.2f}x | {m['inductor'] / m['ember']:.2f}x |{more} "
                f"{d['inductor']:.1e}, {d['ember']:.1e} | {r['others']:.0%} |",
                flush=True,
            )
            ember.reset()
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
