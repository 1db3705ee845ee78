"""The backend entry point and its pipeline, one stage per line (see `generate`).

`compile_aten` compiles one functional aten graph: graph cache lookup, else lowering to the
loop IR, verification, dead-node elimination, fusion scheduling, memory planning, C++ and
wrapper generation; then the kernel cache/g++ and the generated wrapper. Should any stage
fail on a graph, the graph runs as aten ops (correct, never refused), the failure is logged
on the "kernels" channel with the stage's name, counted in `stats` and kept in `fallbacks`.
Under `EMBER_STRICT=1` (the test suite's setting) it raises BackendCompilerFailed instead,
so nothing that was meant to compile can pass a test by running as aten ops.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ember import config, logs
from ember.aot.program import MUTATIONS_META
from ember.backend import cudagraphs, sizes
from ember.backend.codegen import build, cache, dedup, triton_code, triton_runtime, wrapper
from ember.backend.codegen.cache import Artifact
from ember.backend.codegen.cpp import kernel_source
from ember.backend.codegen.plan import plan_kernel, plan_str
from ember.backend.codegen.prelude import PRELUDE
from ember.backend.ir import nodes as ir
from ember.backend.ir import printer, verifier
from ember.backend.lowering import layout
from ember.backend.lowering.graph import lower, symbolic_value
from ember.backend.scheduler import memory
from ember.backend.scheduler.dependencies import eliminate_dead
from ember.backend.scheduler.fusion import Schedule, schedule
from ember.errors import BackendCompilerFailed

stats: Counter[str] = Counter()
stage_seconds: Counter[str] = Counter()
stage_cpu_seconds: Counter[str] = Counter()
"""Wall and CPU seconds (this process's and its g++ processes') spent in each pipeline
stage, summed over graphs: what compile-time benchmarks read (bench/dynamic_compile.py)."""
fallbacks: list[str] = []  # why each graph that ran as aten ops did (stage: error), in order
_recorders: list[list[Artifact]] = []


class StageFailed(Exception):
    """A pipeline stage raised; carries the stage's name for the message."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage, self.cause = stage, cause
        super().__init__(f"{stage}: {type(cause).__name__}: {cause}")


@contextlib.contextmanager
def _stage(name: str) -> Iterator[None]:
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
        yield
    except StageFailed:
        raise
    except Exception as e:
        raise StageFailed(name, e) from e
    finally:
        stage_seconds[name] += time.perf_counter() - start
        stage_cpu_seconds[name] += cpu_seconds() - cpu


def cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (g++)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def record() -> Iterator[list[Artifact]]:
    """Collect the artifacts of graphs compiled (or loaded from cache) inside the block."""
    got: list[Artifact] = []
    _recorders.append(got)
    try:
        yield got
    finally:
        _recorders.remove(got)


def schedule_str(s: Schedule) -> str:
    lines = []
    for step in s.steps:
        if hasattr(step, "loops"):
            loops = " | ".join(
                f"{list(lp.inner)}: {', '.join(n.name for n in lp.nodes)}" for lp in step.loops
            )
            local = f" local={sorted(step.local)}" if step.local else ""
            lines.append(f"{step.name} outer={list(step.outer)} [{loops}]{local}")
        else:
            lines.append(f"extern {step.op} -> {', '.join(step.outputs)}")
    return "\n".join(lines)


def generate(
    gm: torch.fx.GraphModule, example_inputs: list[Any], language: str = "c++"
) -> Artifact:
    """Aten graph -> kernel module (C++, or Triton's Python) + wrapper source (no compiler
    run). Both printers read the same schedule and kernel plans."""
    with _stage("lowering to the loop IR"):
        g = lower(gm, example_inputs)
        g = verifier.verify(g)
    with _stage("scheduling"):
        g = eliminate_dead(g)
        s = schedule(g)
        plan = memory.plan(s, _written_in_place(gm, g))
    buffers = g.buffer_map()
    params: dict[str, list[str]] = {}
    if language == "triton":
        with _stage("Triton generation"):
            sources, launches = [triton_code.PRELUDE], {}
            for k in s.kernels():
                src, params[k.name], launches[k.name] = triton_code.kernel_source(k, buffers)
                sources.append(src)
            module = "\n\n".join(sources) + "\n"
            py = wrapper.wrapper_source(s, params, plan, launches)
    else:
        with _stage("C++ generation"):
            shared = memory.in_place_buffers(s, plan)
            written = []
            for k in s.kernels():
                src, params[k.name] = kernel_source(k, buffers, shared[k.name])
                written.append((k.name, src, params[k.name]))
            module = build.SPLIT.join([PRELUDE, *dedup.merge(written, buffers)])
            py = wrapper.wrapper_source(s, params, plan)
    cacheable = True
    ir_text = ""
    if _recorders or logs.enabled("schedule"):  # printing sympy indices is not free
        plans = "\n".join(plan_str(plan_kernel(k, buffers)) for k in s.kernels())
        ir_text = (
            printer.graph_str(g) + "\n\nschedule:\n" + schedule_str(s) + "\n\nplans:\n" + plans
        )
    # per kernel its argument kinds: p (a pointer) per buffer, s (an int64) per size symbol
    kernels = {name: "".join("p" if b in buffers else "s" for b in p) for name, p in params.items()}
    consts = dict(g.constants)
    return Artifact(module, py, kernels, consts, cacheable, ir_text, language)


def _written_in_place(gm: torch.fx.GraphModule, g: ir.LoopGraph) -> dict[str, str]:
    """Output buffers that may take the storage of the input whose new value they are (aot's
    note, program.MUTATIONS_META): the output is the whole buffer, laid out as the input,
    and nothing else the graph returns (a user output, a value saved for the backward)
    shares that buffer, since it would then alias the caller's tensor."""
    inputs = {b.name: b for b in g.inputs}
    buffers = g.buffer_map()
    returned = Counter(o.buffer for o in g.outputs if isinstance(o, ir.Output))
    pairs = {}
    for k, i in gm.meta.get(MUTATIONS_META, ()):
        out, src = g.outputs[k], inputs.get(f"in{i}")
        if not isinstance(out, ir.Output) or src is None or returned[out.buffer] != 1:
            continue
        buf = buffers[out.buffer]
        same = out.layout == buf.layout == src.layout and buf.dtype == src.dtype
        if same and out.buffer not in inputs:
            pairs[out.buffer] = src.name
    return pairs


def _load(
    art: Artifact, gm: torch.fx.GraphModule, device: torch.device, mode: str | None = None
) -> Callable[..., Any]:
    if art.language == "triton":
        with _stage("loading the Triton kernels"):
            tune = mode in config.AUTOTUNE_MODES
            kernels = triton_runtime.load(art.cpp, list(art.kernels), device, autotune=tune)
    else:
        with _stage("starting g++"):
            pending = build.start(art.cpp) if art.kernels else None
        if pending is not None and not pending.done and config.current().background_build:
            return _Joining(lambda: _instantiate(art, gm, device, pending), gm)
        with _stage("g++ and loading the kernels"):
            kernels = build.open_library(pending, art.kernels) if pending else {}
    return _instantiate(art, gm, device, kernels)


def _instantiate(
    art: Artifact, gm: torch.fx.GraphModule, device: torch.device, kernels: Any
) -> Callable[..., Any]:
    if isinstance(kernels, build.Pending):
        with _stage("g++ and loading the kernels"):
            kernels = build.open_library(kernels, art.kernels)
    with _stage("loading the wrapper"):
        consts = {buf: _attr(gm, target) for buf, target in art.constants.items()}
        return wrapper.instantiate(art.wrapper, kernels, consts, device)


class _Joining:
    """A compiled graph whose kernels g++ is still building (build.start): the compile
    returns at once, so the compiler runs while the caller goes on (aot's runtime, the
    capture's guards and replacement bytecode), and the first call waits for it. Then the
    boxed entry is the wrapper's own, so later calls through aot's runtime cost nothing
    more. A failed build is what a failed stage is at compile time: BackendCompilerFailed
    under EMBER_STRICT=1, else the graph runs as aten ops."""

    boxed_call = True

    def __init__(self, make: Callable[[], Callable[..., Any]], gm: torch.fx.GraphModule):
        self._make, self._gm, self._fn = make, gm, None
        self._strict = config.current().strict

    def _join(self) -> Callable[..., Any]:
        if self._fn is None:
            try:
                fn = self._make()
            except StageFailed as e:
                if self._strict:
                    raise BackendCompilerFailed("ember", e.stage, self._gm.code, e.cause) from e
                _fell_back(e, self._gm)
                fn = self._gm.forward
            self._fn = fn
            boxed = getattr(fn, "run_boxed", None)
            self.run_boxed = boxed if boxed is not None else lambda args: fn(*args)
        return self._fn

    def run_boxed(self, args: list) -> Any:
        self._join()
        return self.run_boxed(args)  # the instance's own now: the compiled graph's

    def __call__(self, *args: Any) -> Any:
        return self._join()(*args)


def _fell_back(e: StageFailed, gm: torch.fx.GraphModule) -> None:
    stats["graph_fallbacks"] += 1
    fallbacks.append(str(e))
    logs.log("kernels", "running the aten graph instead; failed in %s\n%s", e, gm.code)


def _attr(gm: torch.nn.Module, target: str) -> Any:
    for part in target.split("."):
        gm = getattr(gm, part)
    return gm


def _hints(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> dict:
    """Example values of the size symbols of a graph with symbolic sizes (else empty)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    traced = [symbolic_value(n) for n in placeholders]
    if not any(v is not None for v in traced):
        return {}
    return sizes.hints_of(traced, example_inputs)


def placement(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.device | str:
    """The one device a graph's tensors live on (its inputs, constants and the devices its
    nodes name; the CPU when none), or why there is not one, as a message."""
    found: dict[torch.device, str] = {}

    def see(device: torch.device, where: str) -> None:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        found.setdefault(device, where)

    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor):
            see(t.device, f"input {i}")
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            t = _attr(gm, node.target)
            if isinstance(t, torch.Tensor):
                see(t.device, f"constant {node.target}")
        for a in tree_leaves((node.args, node.kwargs)):
            if isinstance(a, torch.device):
                see(a, f"{node.name}'s device argument")
    if len(found) > 1:
        return "tensors on several devices: " + ", ".join(f"{w} on {d}" for d, w in found.items())
    return next(iter(found), torch.device("cpu"))


def language_for(device: torch.device) -> str | None:
    """The code generator for graphs on `device`: "c++" on the CPU (or "triton" under
    EMBER_TRITON_INTERPRET=1), "triton" on a CUDA device; None where ember has none."""
    if device.type == "cpu":
        return "triton" if config.current().triton_interpret else "c++"
    if device.type == "cuda" and triton_runtime.version() is not None:
        return "triton"
    return None


def compile_aten(
    gm: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None
) -> Callable[..., Any]:
    """Compile one functional aten graph into a callable taking its flat tensor inputs.
    A graph ember has no code generator for (tensors on several devices, or on a device
    other than the CPU and, with Triton installed, CUDA) runs as its aten ops; such graphs
    are counted in stats["off_cpu_graphs"]. `mode` is torch.compile's: "max-autotune" and
    "max-autotune-no-cudagraphs" autotune the Triton kernels (codegen/autotune.py);
    "reduce-overhead" and "max-autotune" record the graph's calls into CUDA graphs
    (cudagraphs.py)."""
    if mode not in config.MODES:
        known = ", ".join(map(str, config.MODES))
        raise ValueError(f"unknown mode {mode!r}; known modes: {known}")
    build.begin(restart=False)
    device = placement(gm, example_inputs)
    fn = _compile_aten(gm, example_inputs, device, mode)
    if mode not in config.CUDAGRAPH_MODES:
        return fn
    if not isinstance(device, torch.device):
        why = device
    else:
        recorder = cudagraphs.recorder_for(device)
        if recorder is not None:
            stats["cudagraphed"] += 1
            return cudagraphs.CudaGraphed(fn, recorder, f"graph {stats['cudagraphed']}")
        why = f"no CUDA graphs on {device}"
    logs.log("cudagraphs", "mode=%r: running the graph without CUDA graphs: %s", mode, why)
    return fn


def _compile_aten(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    device: torch.device | str,
    mode: str | None,
) -> Callable[..., Any]:
    language = language_for(device) if isinstance(device, torch.device) else None
    if language is None:
        stats["off_cpu_graphs"] += 1
        why = device if isinstance(device, str) else f"no code generator for {device}"
        logs.log("kernels", "running the aten graph: %s", why)
        return gm.forward
    if language == "triton" and triton_runtime.version() is None:
        raise BackendCompilerFailed(
            "ember",
            "Triton generation",
            gm.code,
            ImportError("EMBER_TRITON_INTERPRET=1 needs Triton: pip install -e '.[triton]'"),
        )
    try:
        with _stage("graph cache lookup"):
            key = cache.graph_key(gm, example_inputs)
            art = cache.load(key)
        if art is None:
            with sizes.hinting(_hints(gm, example_inputs)):
                art = generate(gm, example_inputs, language)
            if logs.enabled("schedule"):
                logs.log("schedule", "%s", art.ir_text)
            if logs.enabled("kernels"):
                prelude = PRELUDE if language == "c++" else triton_code.PRELUDE
                logs.log("kernels", "%s\n%s", art.cpp[len(prelude) :], art.wrapper)
            fn = _load(art, gm, device, mode)
            if art.cacheable:
                cache.store(key, art)  # best effort: an unwritable cache only costs speed
            stats["generated"] += 1
        else:
            fn = _load(art, gm, device, mode)
            stats["graph_cache_hits"] += 1
    except StageFailed as e:
        if config.current().strict:
            raise BackendCompilerFailed("ember", e.stage, gm.code, e.cause) from e.cause
        _fell_back(e, gm)
        return gm.forward
    for r in _recorders:
        r.append(art)
    return fn


# aot asks this before compiling a training graph (aot/channels_last.py): trace it again
# with its image inputs channels-last?
compile_aten.channels_last_training = layout.channels_last_training  # type: ignore[attr-defined]
