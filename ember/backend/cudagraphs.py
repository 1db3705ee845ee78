"""CUDA graphs for `mode="reduce-overhead"` (and "max-autotune"): a compiled graph's calls
recorded once and replayed, so a step costs one graph launch instead of a Python wrapper
and a launch per kernel.

The policy (`CudaGraphed`) is written against a recorder injected at construction, which
records a callable over fixed input tensors and replays it into the same output tensors:
`CUDARecorder` (torch.cuda.CUDAGraph, the default on CUDA) or `CPURecorder`, which replays
by calling again and copying into the recorded outputs, so that the whole policy, and the
hazard it guards against (a replay overwriting outputs), runs in tests on a CPU machine.

Per input signature (sizes, strides, dtypes, devices; integer inputs by value):
1. the first call runs plainly (a warm-up: Triton compiles and autotunes, lazy inits run)
   and notes each input's data pointer;
2. the second call records: an input at the same address as in the warm-up (parameters,
   buffers, a tensor the caller reuses) is read in place; the others are copied into static
   buffers before each replay; then replays;
3. later calls copy the moving inputs in and replay. An in-place input found at another
   address is demoted to a copied one and the signature is recorded again.

Outputs are the recording's static tensors, returned as fresh aliases; an output that is a
view of an input (a training forward returns its input as a saved activation) is made a
view of the caller's input on each call, as in eager, never of a static buffer. A replay writes
them again, so an output the caller still holds (detected by the use count of its storage:
an alias, a view, or autograd's saved tensor holds it) must not be replayed over. ember
records the graph once more with fresh output buffers and alternates between recordings
whose outputs are free; past MAX_RECORDINGS per signature it runs the call plainly. Each
recording has its own memory pool: in a shared pool (Inductor's CUDA graph trees share one
per device) a later capture may place its outputs in an earlier one's temporaries, and the
earlier graph's replay would then overwrite them; making that safe needs the liveness
bookkeeping of a whole tree of recordings, which ember does not have. It does not
copy outputs out after each replay: that costs a copy kernel per output on every call,
where a second recording costs one capture and its output memory, and a held output is the
common case (autograd holds a forward's saved activations until the backward; a loop keeps
the last loss).

Plain calls, with the reason logged once on `EMBER_LOGS=cudagraphs` and kept in `reasons`:
an input on another device than the recorder's (a CPU tensor in a CUDA graph), a graph that
mutates an input (its version counter moves in the warm-up), an output that views an input
as another dtype, a capture that raises (a CPU sync, an op CUDA graphs refuse), more than
MAX_SIGNATURES signatures (dynamic shapes), repeated re-recording. `stats` counts
records, replays and plain calls.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ember import logs, torch_compat

MAX_SIGNATURES = 8  # distinct input signatures recorded per compiled graph
MAX_RECORDINGS = 3  # recordings per signature, for outputs still held by the caller
MAX_RERECORDS = 4  # recordings of one signature dropped for a moved in-place input

stats: Counter[str] = Counter()
"""'records', 'replays', 'plain_calls' (warm-ups included), 'fallbacks' (graphs or
signatures that stopped recording)."""
reasons: list[str] = []  # why each fallback happened, in order


class Recording(Protocol):
    outputs: list[Any]

    def replay(self, inputs: list) -> None:
        """Run again; `inputs` are the tensors at the recorded addresses (a CUDA graph
        reads its addresses and ignores them)."""


class Recorder(Protocol):
    device: torch.device

    def record(self, fn: Callable[[list], Any], inputs: list) -> Recording: ...


class CUDARecorder:
    """Records into torch.cuda.CUDAGraph, each recording in its own memory pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def record(self, fn: Callable[[list], Any], inputs: list) -> Recording:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = fn(list(inputs))
        return _CUDARecording(graph, list(outputs))


@dataclasses.dataclass
class _CUDARecording:
    graph: Any
    outputs: list[Any]

    def replay(self, inputs: list) -> None:
        self.graph.replay()


class CPURecorder:
    """The CUDA recorder's stand-in on the CPU: a recording holds its outputs; a replay
    calls the callable again on the tensors at the recorded addresses and copies the
    results into the recorded outputs, overwriting them exactly where a CUDA graph replay
    would. Like a CUDA graph, it keeps no input alive."""

    device = torch.device("cpu")

    def record(self, fn: Callable[[list], Any], inputs: list) -> Recording:
        return _CPURecording(fn, list(fn(list(inputs))))


@dataclasses.dataclass
class _CPURecording:
    fn: Callable[[list], Any]
    outputs: list[Any]

    def replay(self, inputs: list) -> None:
        for out, new in zip(self.outputs, self.fn(list(inputs)), strict=True):
            if isinstance(out, torch.Tensor):
                out.copy_(new)


_use_count = torch_compat.storage_use_count


@dataclasses.dataclass
class _Recorded:
    recording: Recording
    ptrs: dict[int, int]  # in-place input index -> the data pointer recorded
    base: list[int]  # per output: its storage's use count when the caller holds nothing
    aliases: dict[int, tuple[int, tuple, tuple, int]]
    """Outputs that are views of inputs (a forward saving its input for the backward):
    output -> (input, size, stride, offset in the input's storage from the input's own).
    They are views of the caller's input on every call, as in eager, never of a static
    buffer (which the next call's copy overwrites)."""

    def free(self) -> bool:
        """Whether no output of the last replay is held outside (a replay may overwrite)."""
        outs = self.recording.outputs
        return all(
            _use_count(o) <= n for o, n in zip(outs, self.base) if isinstance(o, torch.Tensor)
        )

    def outputs(self, inputs: list) -> list:
        """Fresh aliases of the static outputs, views of `inputs` where outputs alias them."""
        out = [o.detach() if isinstance(o, torch.Tensor) else o for o in self.recording.outputs]
        for j, (i, size, stride, offset) in self.aliases.items():
            out[j] = inputs[i].as_strided(size, stride, inputs[i].storage_offset() + offset)
        return out


@dataclasses.dataclass
class _Signature:
    warm_ptrs: dict[int, int]  # tensor input index -> data pointer at the warm-up
    static: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # copied inputs
    recorded: list[_Recorded] = dataclasses.field(default_factory=list)
    rerecords: int = 0
    failed: str | None = None


def _signature(args: tuple | list) -> tuple:
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
        for a in args
    )


class CudaGraphed:
    """A compiled graph's callable, recorded and replayed (see the module docstring)."""

    boxed_call = True  # called as run_boxed(list) by ember's aot runtime

    def __init__(self, fn: Callable[..., Any], recorder: Recorder, name: str = "graph") -> None:
        self.fn, self.recorder, self.name = fn, recorder, name
        self.signatures: dict[tuple, _Signature] = {}
        self.failed: str | None = None  # why the whole graph runs plainly
        self.overflowed = False  # whether a signature past MAX_SIGNATURES was seen
        self._overflow = _Signature({})  # stands for those signatures in _give_up

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any) -> Any:
        return self.run_boxed(list(args))

    def run_boxed(self, args: list) -> Any:
        inputs = list(args)
        args.clear()  # as the wrapped callable would: inputs die at their last use
        if self.failed is not None:
            return self._plain(inputs)
        key = _signature(inputs)
        sig = self.signatures.get(key)
        if sig is None:
            return self._warm_up(key, inputs)
        if sig.failed is not None:
            return self._plain(inputs)
        rec = self._free_recording(sig, inputs)
        if rec is None:
            return self._plain(inputs)
        at_addresses = list(inputs)
        for i, buf in sig.static.items():
            buf.copy_(inputs[i])
            at_addresses[i] = buf
        rec.recording.replay(at_addresses)
        del at_addresses
        stats["replays"] += 1
        return rec.outputs(inputs)

    def _plain(self, inputs: list) -> Any:
        stats["plain_calls"] += 1
        return self._inner(inputs)

    def _inner(self, inputs: list) -> Any:
        run_boxed = getattr(self.fn, "run_boxed", None)
        return run_boxed(inputs) if run_boxed is not None else self.fn(*inputs)

    def _give_up(self, why: str, sig: _Signature | None = None) -> None:
        """Run plainly from now on (the signature's calls, or every call), saying why."""
        reason = f"{self.name}: {why}"
        if sig is None:
            self.failed = reason
        else:
            sig.failed, sig.recorded, sig.static = reason, [], {}
        stats["fallbacks"] += 1
        reasons.append(reason)
        logs.log("cudagraphs", "running without CUDA graphs: %s", reason)

    # ------------------------------------------------------------------ steps

    def _warm_up(self, key: tuple, inputs: list) -> Any:
        tensors = {i: a for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)}
        for i, t in tensors.items():
            if t.device != self.recorder.device:
                self._give_up(
                    f"input {i} is on {t.device}, the graph records on {self.recorder.device}"
                )
                return self._plain(inputs)
        if len(self.signatures) >= MAX_SIGNATURES:  # the recorded ones still replay
            if not self.overflowed:
                self.overflowed = True
                self._give_up(
                    f"more than {MAX_SIGNATURES} input signatures (dynamic "
                    "shapes): new ones run without CUDA graphs",
                    self._overflow,
                )
            return self._plain(inputs)
        versions = {i: t._version for i, t in tensors.items()}
        sig = self.signatures[key] = _Signature({i: t.data_ptr() for i, t in tensors.items()})
        out = self._plain(list(inputs))
        moved = [i for i, t in tensors.items() if t._version != versions[i]]
        if moved:
            self._give_up(f"the graph mutates its input{'s' * (len(moved) > 1)} {moved}", sig)
        return out

    def _free_recording(self, sig: _Signature, inputs: list) -> _Recorded | None:
        """A recording of this signature that may replay now, recording one if needed."""
        for rec in sig.recorded:
            moved = [i for i, p in rec.ptrs.items() if inputs[i].data_ptr() != p]
            if moved:  # read in place when recorded, now elsewhere: copy it from now on
                for i in moved:
                    sig.warm_ptrs.pop(i, None)
                sig.recorded, sig.rerecords = [], sig.rerecords + 1
                logs.log("cudagraphs", "%s: inputs %s moved; recording again", self.name, moved)
                if sig.rerecords > MAX_RERECORDS:
                    self._give_up(f"inputs kept moving ({sig.rerecords} recordings dropped)", sig)
                    return None
                break
            if rec.free():
                return rec
        if len(sig.recorded) >= MAX_RECORDINGS:
            logs.log(
                "cudagraphs",
                "%s: the outputs of all %d recordings are still held; a plain call",
                self.name,
                len(sig.recorded),
            )
            return None
        return self._record(sig, inputs)

    def _record(self, sig: _Signature, inputs: list) -> _Recorded | None:
        ptrs = {}
        static_inputs = list(inputs)
        for i, a in enumerate(inputs):
            if not isinstance(a, torch.Tensor):
                continue
            if sig.warm_ptrs.get(i) == a.data_ptr():
                ptrs[i] = a.data_ptr()
                continue
            buf = sig.static.get(i)
            if buf is None:
                buf = sig.static[i] = torch.empty_strided(
                    a.size(), a.stride(), dtype=a.dtype, device=a.device
                )
            buf.copy_(a)
            static_inputs[i] = buf
        try:
            recording = self.recorder.record(self._inner, static_inputs)
        except Exception as e:
            self._give_up(f"capture failed: {type(e).__name__}: {e}", sig)
            return None
        aliases = self._input_aliases(recording, static_inputs)
        if aliases is None:
            self._give_up(
                "an output is a view of an input with another dtype; it cannot be "
                "regenerated from the caller's input",
                sig,
            )
            return None
        base = [_use_count(o) if isinstance(o, torch.Tensor) else 0 for o in recording.outputs]
        rec = _Recorded(recording, ptrs, base, aliases)
        sig.recorded.append(rec)
        stats["records"] += 1
        logs.log(
            "cudagraphs",
            "%s: recorded (signature %d, recording %d; inputs read in place: %s, copied: %s)",
            self.name,
            len(self.signatures),
            len(sig.recorded),
            sorted(ptrs),
            sorted(sig.static),
        )
        return rec

    @staticmethod
    def _input_aliases(recording: Recording, inputs: list) -> dict | None:
        """Outputs that are views of inputs (see _Recorded.aliases), taken out of the
        recording's outputs; None if one reinterprets its input's dtype."""
        storages: dict[int, int] = {}
        for i, a in enumerate(inputs):
            if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes():
                storages.setdefault(a.untyped_storage().data_ptr(), i)
        aliases = {}
        for j, out in enumerate(recording.outputs):
            if not isinstance(out, torch.Tensor) or not out.untyped_storage().nbytes():
                continue
            i = storages.get(out.untyped_storage().data_ptr())
            if i is None:
                continue
            if out.dtype != inputs[i].dtype:
                return None
            offset = out.storage_offset() - inputs[i].storage_offset()
            aliases[j] = (i, tuple(out.size()), out.stride(), offset)
            recording.outputs[j] = None  # not a static output: never checked nor copied into
        return aliases


_cpu_emulation = False


class emulated_on_cpu:
    """Inside this block, CPU graphs compiled in a CUDA-graph mode are wrapped with the CPU
    recorder (tests drive the whole policy on a CPU machine)."""

    def __enter__(self) -> None:
        global _cpu_emulation
        self.saved, _cpu_emulation = _cpu_emulation, True

    def __exit__(self, *exc: object) -> None:
        global _cpu_emulation
        _cpu_emulation = self.saved


def recorder_for(device: torch.device) -> Recorder | None:
    """The default recorder for graphs on `device`: CUDA graphs on a CUDA device, the CPU
    stand-in on the CPU under `emulated_on_cpu()`, else None."""
    if device.type == "cuda":
        return CUDARecorder(device)
    if device.type == "cpu" and _cpu_emulation:
        return CPURecorder()
    return None


def summary() -> dict[str, Any]:
    """The counts of `stats` and the fallback reasons, for tests and reports."""
    return {**stats, "reasons": list(reasons)}
