"""The graph cache: everything needed to rebuild a compiled graph without lowering it again.

Keyed by the aten graph's code, the input metadata, the config, ember's version and the
backend's own source (so a changed backend never reuses stale artifacts). An entry stores
the C++ module and the wrapper source; the C++ itself goes through the kernel cache, so a
fresh process that hits both runs neither lowering nor g++. Entries are checksummed and
written atomically; unreadable or corrupt entries count as misses and are overwritten.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ember import config, logs
from ember.aot.program import MUTATIONS_META
from ember.backend.codegen.build import atomic_write, compiler_id
from ember.backend.lowering.graph import symbolic_value

FORMAT = 3
EMBER_VERSION = "0.1.0"


@dataclasses.dataclass(frozen=True, slots=True)
class Artifact:
    cpp: str  # the kernel module: C++, or Triton's Python where language == "triton"
    wrapper: str
    kernels: dict[str, str]  # kernel name -> argument kinds: "p" pointer, "s" int64 size
    constants: dict[str, str]  # buffer name -> fx attribute of a graph constant
    cacheable: bool = True
    ir_text: str = ""  # the loop IR and schedule, for logs and tests (not cached)
    language: str = "c++"  # "c++" or "triton"


@functools.cache
def _source_digest() -> str:
    """A hash of ember's sources: an artifact depends on the backend's code and also on the
    layouts the aot tracer records on the graph's nodes, which the graph's code omits."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()


def _input_meta(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"T{tuple(t.shape)}{tuple(t.stride())}{t.dtype}{t.device}"
    return f"V{type(t).__name__}:{t!r}"


def graph_key(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> str:
    """Everything the generated code depends on (constants by layout: values bind at load)."""
    cfg = dataclasses.asdict(config.current())
    cfg.pop("cache_dir", None)
    consts = [
        _input_meta(getattr(gm, n.target, None)) for n in gm.graph.nodes if n.op == "get_attr"
    ]
    # a symbolic input is keyed by its symbolic layout, never by the example's sizes: one
    # entry (one kernel library) serves every size
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    traced = [symbolic_value(n) for n in placeholders] if placeholders else []
    inputs = [
        f"S{tuple(v.shape)}{tuple(v.stride())}{v.dtype}"
        if isinstance(v, torch.Tensor)
        else f"S{v}"
        if v is not None
        else _input_meta(t)
        for v, t in zip(traced or [None] * len(example_inputs), example_inputs)
    ]
    parts = [
        gm.code,
        str(gm.meta.get(MUTATIONS_META, ())),  # outputs the wrapper may write into inputs
        "|".join(inputs),
        "|".join(consts),
        json.dumps(cfg, sort_keys=True, default=str),
        EMBER_VERSION,
        torch.__version__,
        torch.backends.cpu.get_cpu_capability(),  # eager's kernels, which lowerings match
        str(torch.get_default_dtype()),  # what `torch.ones(2)` in the graph makes
        _source_digest(),
        compiler_id(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _path(key: str) -> Path:
    return Path(config.current().cache_dir) / "graphs" / key[:2] / f"{key}.json"


def load(key: str) -> Artifact | None:
    """The cached artifact, or None when missing, truncated, corrupt or not of this format."""
    try:
        raw = _path(key).read_bytes()
    except OSError:
        return None
    digest, _, payload = raw.partition(b"\n")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not _well_formed(data):
        return None
    return Artifact(
        data["cpp"], data["wrapper"], data["kernels"], data["constants"], language=data["language"]
    )


def _well_formed(data: dict) -> bool:
    def str_dict(d: Any, values: type) -> bool:
        return isinstance(d, dict) and all(
            isinstance(k, str) and isinstance(v, values) for k, v in d.items()
        )

    return (
        isinstance(data.get("cpp"), str)
        and isinstance(data.get("wrapper"), str)
        and str_dict(data.get("kernels"), str)
        and str_dict(data.get("constants"), str)
        and data.get("language") in ("c++", "triton")
    )


def store(key: str, art: Artifact) -> None:
    """Write the entry; a cache directory that is read-only or full is logged, not raised
    (the graph still runs, it is only compiled again by the next process)."""
    payload = json.dumps(
        {
            "format": FORMAT,
            "cpp": art.cpp,
            "wrapper": art.wrapper,
            "kernels": art.kernels,
            "constants": art.constants,
            "language": art.language,
        }
    ).encode()
    digest = hashlib.sha256(payload).hexdigest().encode()
    try:
        atomic_write(_path(key), digest + b"\n" + payload)
    except OSError as e:
        logs.log("kernels", "graph cache not written (%s): %s", _path(key), e)
