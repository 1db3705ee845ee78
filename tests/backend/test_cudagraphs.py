"""CUDA graphs (`mode="reduce-overhead"`): the recording/replay policy of
ember/backend/cudagraphs.py driven on the CPU by its CPU recorder, which replays into the
recorded output tensors exactly as a CUDA graph does (so an output still held by the caller
would be overwritten if the policy replayed over it). On a machine with CUDA, the last test
runs the real torch.cuda.CUDAGraph recorder."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember
import ember.backend
from ember.backend import compile as backend_compile
from ember.backend import cudagraphs
from ember.backend.cudagraphs import CPURecorder, CudaGraphed
from tests.backend.helpers import _close


def pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a * b + 1, (a - b).sum(0)


@pytest.fixture
def counts():
    """The change of cudagraphs.stats during the test."""
    before = dict(cudagraphs.stats)

    def delta() -> dict[str, int]:
        return {k: v - before.get(k, 0) for k, v in cudagraphs.stats.items() if v != before.get(k)}

    return delta


def test_replays_equal_eager_as_inputs_change(counts):
    g = CudaGraphed(pair, CPURecorder())
    w = torch.randn(4, 3)  # the same tensor every call: read in place
    for i in range(5):
        x = torch.randn(4, 3) * i  # a new tensor each call: copied into a static buffer
        _close(g(x, w), pair(x, w))
    assert counts() == {"plain_calls": 1, "records": 1, "replays": 4}
    ((sig),) = g.signatures.values()
    assert sorted(sig.static) == [0] and sorted(sig.recorded[0].ptrs) == [1]


def test_in_place_input_values_are_read_at_each_replay(counts):
    g = CudaGraphed(pair, CPURecorder())
    x, w = torch.randn(4, 3), torch.randn(4, 3)
    for _ in range(4):
        w.mul_(2)  # a parameter updated in place (an optimizer step)
        _close(g(x, w), pair(x, w))
    assert counts()["replays"] == 3


def test_a_new_shape_records_again(counts):
    g = CudaGraphed(pair, CPURecorder())
    for shape in ((4, 3), (4, 3), (7, 2), (7, 2), (7, 2), (4, 3)):
        x, w = torch.randn(shape), torch.randn(shape)
        _close(g(x, w), pair(x, w))
    assert counts() == {"plain_calls": 2, "records": 2, "replays": 4}
    assert len(g.signatures) == 2


def test_the_hazard_the_policy_avoids():
    """Replaying a recording writes its outputs in place: what a held output would see."""
    x = torch.randn(3)
    recording = CPURecorder().record(lambda args: [args[0] * 2], [x])
    (held,) = recording.outputs
    first = held.clone()
    x.add_(1)
    recording.replay([x])
    assert not torch.equal(held, first)


def test_an_output_still_held_is_not_overwritten(counts):
    g = CudaGraphed(pair, CPURecorder())
    w = torch.randn(4, 3)
    g(torch.randn(4, 3), w)  # warm-up
    x1, x2, x3 = (torch.randn(4, 3) for _ in range(3))
    y1 = g(x1, w)  # recording 1
    view = y1[0][1:]  # a view of an output holds its storage too
    y2 = g(x2, w)  # y1 held: recording 2
    _close(y1, pair(x1, w))
    _close(view, pair(x1, w)[0][1:])
    del y1
    y3 = g(x3, w)  # y1 itself dropped, but its view still held: recording 3
    _close(view, pair(x1, w)[0][1:])
    _close((y2, y3), (pair(x2, w), pair(x3, w)))
    assert counts()["records"] == 3
    y4 = g(x1, w)  # every recording's outputs held: a plain call
    _close((view, y2, y3, y4), (pair(x1, w)[0][1:], pair(x2, w), pair(x3, w), pair(x1, w)))
    assert counts()["plain_calls"] == 2
    del view, y2
    y5 = g(x2, w)  # recordings 1 and 2 free again: replayed, nothing recorded
    _close((y3, y4, y5), (pair(x3, w), pair(x1, w), pair(x2, w)))
    assert counts()["records"] == 3 and counts()["replays"] == 4


def test_an_in_place_input_that_moves_is_copied_from_then_on(counts):
    g = CudaGraphed(pair, CPURecorder())
    x, w = torch.randn(4, 3), torch.randn(4, 3)
    g(x, w)
    g(x, w)  # both read in place
    w2 = torch.randn(4, 3)
    _close(g(x, w2), pair(x, w2))  # w moved: recorded again with w copied
    _close(g(x, w), pair(x, w))
    (sig,) = g.signatures.values()
    assert sorted(sig.static) == [1] and counts()["records"] == 2


def test_mutated_inputs_fall_back_with_a_reason(counts):
    def bump(x):
        x.add_(1)
        return (x * 2,)

    g = CudaGraphed(bump, CPURecorder(), "bump")
    x, ref = torch.zeros(3), torch.zeros(3)
    for _ in range(3):
        _close(g(x), bump(ref))
        _close(x, ref)
    assert counts() == {"plain_calls": 3, "fallbacks": 1}
    assert cudagraphs.reasons[-1] == "bump: the graph mutates its input [0]"


class MetaRecorder(CPURecorder):  # records for a device the CPU inputs are not on
    device = torch.device("meta")


class Refusing(CPURecorder):  # as a capture refuses a sync or a CPU op
    def record(self, fn, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.mark.parametrize(
    "recorder, reason",
    [
        (MetaRecorder, "g: input 0 is on cpu, the graph records on meta"),
        (Refusing, "capture failed: RuntimeError: operation not permitted"),
    ],
    ids=["input on another device", "capture error"],
)
def test_graphs_that_cannot_be_recorded_fall_back(recorder, reason, counts):
    g = CudaGraphed(pair, recorder(), "g")
    x = torch.randn(2)
    for _ in range(3):
        _close(g(x, x), pair(x, x))
    assert reason in cudagraphs.reasons[-1]
    assert counts() == {"plain_calls": 3, "fallbacks": 1}


def test_too_many_shapes_fall_back(counts, monkeypatch):
    monkeypatch.setattr(cudagraphs, "MAX_SIGNATURES", 2)
    g = CudaGraphed(pair, CPURecorder(), "g")
    for n in (1, 2, 3, 3, 1):
        x = torch.randn(n)
        _close(g(x, x), pair(x, x))
    assert "more than 2 input signatures" in cudagraphs.reasons[-1]
    assert counts() == {"plain_calls": 4, "fallbacks": 1, "records": 1, "replays": 1}


def test_an_output_aliasing_an_input_is_a_view_of_the_callers_input(counts):
    def view_of_input(x, w):  # as a training forward returns its input, saved for backward
        return (x.view(-1), x * w, w.t())

    g = CudaGraphed(view_of_input, CPURecorder(), "g")
    w = torch.randn(2, 2)
    for _ in range(4):
        base = torch.randn(3, 2)
        x = base[1:]  # a view with a storage offset
        out = g(x, w)
        _close(out, view_of_input(x, w))
        assert out[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert out[0].data_ptr() == x.data_ptr() and out[2].data_ptr() == w.data_ptr()
        del out  # (held into the next call, it would make a second recording)
    assert counts() == {"plain_calls": 1, "records": 1, "replays": 3}

    def reinterpret(x):
        return (x.view(torch.int32), x + 1)

    g = CudaGraphed(reinterpret, CPURecorder(), "g")
    for _ in range(3):
        x = torch.randn(4)
        _close(g(x), reinterpret(x))
    assert "a view of an input with another dtype" in cudagraphs.reasons[-1]


def test_boxed_calls_clear_the_list():
    g = CudaGraphed(pair, CPURecorder())
    x = torch.randn(3)
    for _ in range(3):
        args = [x, x]
        _close(g.run_boxed(args), pair(x, x))
        assert args == []


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))).softmax(-1)


def test_reduce_overhead_inference_through_ember_compile(counts):
    net = Net().eval()
    with cudagraphs.emulated_on_cpu(), torch.no_grad():
        compiled = ember.compile(net, mode="reduce-overhead")
        outs = []
        for i in range(4):
            x = torch.randn(5, 8) + i
            outs.append((compiled(x), net(x)))  # every output kept: later replays must not
        for got, want in outs:  # overwrite them
            _close(got, want)
    c = counts()
    assert c["records"] >= 1 and c.get("fallbacks", 0) == 0, c


def test_reduce_overhead_training_steps_match_eager(counts):
    base = Net()
    x = torch.randn(6, 8)
    results = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with cudagraphs.emulated_on_cpu():
            fn = ember.compile(model, mode="reduce-overhead") if compiled else model
            losses = []
            for step in range(4):
                opt.zero_grad(set_to_none=step % 2 == 0)  # grads held across steps, or not
                loss = fn(x * (step + 1)).square().sum()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    _close(results[1], results[0], rtol=1e-5, atol=1e-5)
    c = counts()
    # forward and backward recorded at step 2, replayed after (the backward once more: its
    # gradients are held by .grad across a zero_grad(set_to_none=False))
    assert c == {"plain_calls": 2, "records": 3, "replays": 6}, c


def test_torch_compile_mode_reaches_the_backend(counts):
    net = Net().eval()
    x = torch.randn(5, 8)
    with cudagraphs.emulated_on_cpu(), torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(net, backend=ember.backend, mode="reduce-overhead")
        for _ in range(3):
            _close(compiled(x), net(x))
    assert counts()["replays"] >= 1


def test_default_mode_and_unemulated_cpu_record_nothing(counts):
    net = Net().eval()
    x = torch.randn(5, 8)
    wrapped = backend_compile.stats["cudagraphed"]
    with torch.no_grad():
        for mode in (None, "default", "max-autotune-no-cudagraphs", "reduce-overhead"):
            torch._dynamo.reset()
            _close(ember.compile(net, mode=mode)(x), net(x))  # CPU: no CUDA graphs
    assert backend_compile.stats["cudagraphed"] == wrapped and counts() == {}
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        backend_compile.compile_aten(None, [], mode="fast")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_on_the_gpu(counts):
    dev = torch.device("cuda")
    net = Net().to(dev).eval()
    with torch.no_grad():
        compiled = ember.compile(net, mode="reduce-overhead")
        outs = [(compiled(x), net(x)) for x in (torch.randn(5, 8, device=dev) for _ in range(5))]
    for got, want in outs:
        _close(got, want, rtol=1e-4, atol=1e-4)
    base = Net().to(dev)
    x = torch.randn(6, 8, device=dev)
    results = []
    for compiled_ in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fn = ember.compile(model, mode="max-autotune") if compiled_ else model
        for step in range(4):
            opt.zero_grad()
            fn(x * (step + 1)).square().sum().backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    _close(results[1], results[0], rtol=1e-4, atol=1e-4)
    c = counts()
    assert c["records"] >= 2 and c["replays"] >= 4 and c.get("fallbacks", 0) == 0, c
