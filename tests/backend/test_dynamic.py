"""Dynamic shapes through ember's backend behind Dynamo: one compile serves every size.

`torch.compile(fn, backend=..., dynamic=True)` (and Dynamo's automatic dynamic, which
recompiles with symbolic sizes after a second size) hands the backend graphs with SymInt
inputs and symbolically sized tensors. Each test runs a program over many sizes (0 and 1
where Dynamo allows them, primes, sizes that break the vector widths: 7, 15, 17, 33, 1023)
against eager, and counts what was compiled: graphs handed to the backend (against Dynamo's
own count with the "eager" backend), aten graphs generated, kernel libraries built. Before
this, such graphs failed in ember's aot stage ("symbolic sizes reached ember's aot tracer"),
so a user's second size raised BackendCompilerFailed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember.backend
from ember.backend import compile as backend_compile
from ember.backend.codegen import build
from tests.backend.test_models import Block  # nn.MultiheadAttention + MLP, pre-norm

ODD = [7, 15, 17, 33, 1023]


class Counting:
    """A backend that counts the graphs Dynamo hands it and compiles them with ember's."""

    def __init__(self, backend=ember.backend) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.backend = backend

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return self.backend(gm, example_inputs)


def _eager_graphs(fn, inputs, dynamic) -> int:
    """How many graphs Dynamo makes for the same calls with the eager backend."""
    torch._dynamo.reset()
    counter = Counting(lambda gm, _: gm.forward)
    compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
    for args in inputs:
        compiled(*args)
    torch._dynamo.reset()
    return len(counter.graphs)


def _run(fn, inputs, dynamic=True, atol=1e-5, rtol=1e-5):
    """Compile fn with ember behind Dynamo, call it on every input tuple, compare with eager;
    returns the counting backend."""
    counter = Counting()
    compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
    for args in inputs:
        torch.testing.assert_close(compiled(*args), fn(*args), atol=atol, rtol=rtol)
    assert backend_compile.stats["graph_fallbacks"] == 0
    return counter


@pytest.fixture(autouse=True)
def _stats():
    backend_compile.stats.clear()
    yield


def _pointwise(x, y):
    return torch.sigmoid(x * 2.0 + y).tanh() - y / 3


def test_pointwise_every_size_one_compile():
    sizes = [2, 3, *ODD, 64]
    inputs = [(torch.randn(n, 5), torch.randn(n, 5)) for n in sizes]
    assert len(_run(_pointwise, inputs).graphs) == 1
    # 0 and 1 are specialized by Dynamo (a graph each); ember makes no more graphs than it
    torch._dynamo.reset()
    inputs += [(torch.randn(n, 5), torch.randn(n, 5)) for n in (1, 0)]
    counter = _run(_pointwise, inputs)
    assert len(counter.graphs) == _eager_graphs(_pointwise, inputs, dynamic=True) == 3


def test_automatic_dynamic_compiles_at_most_two_graphs():
    """dynamic=None: static at the first size, symbolic at the second, then no compile."""
    fn = lambda x, w: torch.softmax(x @ w, -1) * 2  # noqa: E731 (issue 13's example)
    w = torch.randn(16, 8)
    inputs = [(torch.randn(n, 16), w) for n in range(2, 14)]
    counter = _run(fn, inputs, dynamic=None)
    assert len(counter.graphs) == 2
    assert backend_compile.stats["generated"] == 2


def test_one_kernel_library_for_every_size(monkeypatch):
    builds = []
    real = build._start_compile
    monkeypatch.setattr(build, "_start_compile", lambda *a: (builds.append(a[0]), real(*a))[1])
    fn = lambda x: (x.exp() * x.sum(-1, keepdim=True)).relu()  # noqa: E731
    _run(fn, [(torch.randn(n, m),) for n in (3, 17, 33) for m in (5, 64, 1023)])
    assert len(builds) <= 1  # a warm shared cache may hold it already
    assert backend_compile.stats["generated"] == 1


def test_symbolic_kernel_takes_sizes_as_arguments():
    from ember.backend.compile import record

    fn = lambda x: x * 2 + 1  # noqa: E731
    with record() as artifacts:
        _run(fn, [(torch.randn(n, 7),) for n in (3, 5)])
    (art,) = artifacts
    assert "const int64_t s" in art.cpp
    assert "omp parallel for" in art.cpp and "if(" in art.cpp  # threads decided at run time
    assert "s" in "".join(art.kernels.values())  # the kernel's int64 size arguments
    call = next(line for line in art.wrapper.splitlines() if "_kernel0(" in line)
    assert call.rstrip(")").split(", ")[-1].startswith("s")


@pytest.mark.parametrize("rows", [[3, 5, 17, 64]])
@pytest.mark.parametrize("cols", [[4, 15, 33, 1023]])
def test_softmax_and_layer_norm_rows_and_columns(rows, cols):
    def softmax(x):
        return torch.softmax(x, -1)

    def layer_norm(x):
        return F.layer_norm(x, x.shape[-1:]) * 2

    inputs = [(torch.randn(r, c),) for r in rows for c in cols]
    for fn in (softmax, layer_norm):
        torch._dynamo.reset()
        counter = _run(fn, inputs)
        assert len(counter.graphs) == 1


def test_log_softmax_and_sums_over_variable_rows():
    fns = [
        lambda x: torch.log_softmax(x, -1),
        lambda x: x.sum(0),
        lambda x: x.amax(-1) - x.mean(),
        lambda x: x.var(-1),
    ]
    for fn in fns:
        torch._dynamo.reset()
        _run(fn, [(torch.randn(r, c),) for r in (2, 7, 33) for c in (3, 17)])


def test_views_reshapes_and_cat_with_variable_sizes():
    def fn(x, y):
        b = x.shape[0]
        z = torch.cat([x, y], dim=1).view(b, -1, 2).transpose(1, 2).contiguous()
        return z.reshape(b * 2, -1)[:, 1:] + x.new_ones(1)

    _run(fn, [(torch.randn(n, 6), torch.randn(n, 4)) for n in (2, 3, 17, 33)])


def test_scalar_sizes_in_arithmetic():
    def fn(x):
        return x / x.shape[0] + torch.arange(x.shape[1])

    _run(fn, [(torch.randn(n, m),) for n, m in ((2, 3), (5, 7), (17, 33))])


class MLP(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def test_mlp_variable_batch_inference():
    model = MLP().eval()
    with torch.no_grad():
        counter = _run(model, [(torch.randn(n, 32),) for n in (2, 3, 17, 64, 1023)])
    assert len(counter.graphs) == 1


def test_mlp_variable_batch_large_gemm_choice():
    """A batch large enough for the oneDNN/torch.mm timing: chosen per size bucket."""
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU()).eval()
    with torch.no_grad():
        _run(model, [(torch.randn(n, 256),) for n in (300, 257, 511)], atol=1e-4, rtol=1e-4)


def test_gemm_choice_of_a_static_graph_serves_its_size_bucket(monkeypatch):
    """A static graph's oneDNN/torch.mm timing (batch 300) decides the dynamic graph's
    bucket of 256..511 too: the dynamic graph's first call at batch 400 times nothing."""
    from ember.backend.lowering import gemm

    monkeypatch.setattr(gemm, "_BY_BUCKET", {})
    gemm._onednn_faster.cache_clear()
    timed = []
    real = gemm._time_onednn
    monkeypatch.setattr(gemm, "_time_onednn", lambda *shape: timed.append(shape) or real(*shape))
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU()).eval()
    with torch.no_grad():
        x = torch.randn(300, 256)
        static = torch.compile(model, backend=Counting(), dynamic=False)
        torch.testing.assert_close(static(x), model(x), atol=1e-4, rtol=1e-4)
        assert [shape[:3] for shape in timed] == [(300, 256, 1024)]
        x = torch.randn(400, 256)
        dynamic = torch.compile(model, backend=Counting(), dynamic=True)
        torch.testing.assert_close(dynamic(x), model(x), atol=1e-4, rtol=1e-4)
    assert len(timed) == 1, timed
    gemm._onednn_faster.cache_clear()


def _train(make_model, shapes, dynamic) -> Counting:
    """Forward and backward of a compiled model against eager at each input shape: outputs,
    input gradients, parameter gradients."""
    torch.manual_seed(0)
    model, reference = make_model(), make_model()
    reference.load_state_dict(model.state_dict())
    counter = Counting()
    compiled = torch.compile(model, backend=counter, dynamic=dynamic)
    for shape in shapes:
        x = torch.randn(shape)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, expected = compiled(xa), reference(xb)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
            p.grad = q.grad = None
    assert backend_compile.stats["graph_fallbacks"] == 0
    return counter


def test_mlp_variable_batch_training_gradients():
    counter = _train(MLP, [(n, 32) for n in (3, 17, 33, 64)], dynamic=True)
    assert len(counter.graphs) == 1


def test_transformer_block_variable_batch_and_sequence():
    """Automatic dynamic: the model width stays static (with dynamic=True it would be a
    symbol too, and `d ** -0.5` a symbolic float, which ember's aot stage does not trace)."""
    model = Block(32).eval()
    inputs = [(torch.randn(b, t, 32),) for b, t in ((2, 3), (3, 17), (2, 33), (4, 7), (5, 64))]
    with torch.no_grad():
        counter = _run(model, inputs, dynamic=None)
    assert len(counter.graphs) == 2


def test_transformer_block_training_variable_sequence():
    counter = _train(lambda: Block(32), [(2, t, 32) for t in (3, 17, 33, 7)], dynamic=None)
    assert len(counter.graphs) == 2


def _gpt2():
    import transformers

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.GPT2Config(
            n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128
        )
        torch.manual_seed(0)
        return transformers.GPT2Model(cfg).eval()


def test_gpt2_sequence_lengths_1_to_128():
    model = _gpt2()

    def run(ids):
        return model(input_ids=ids, use_cache=False).last_hidden_state

    gen = torch.Generator().manual_seed(1)
    lengths = [1, 2, 3, 5, 7, 16, 17, 33, 64, 100, 127, 128]
    inputs = [(torch.randint(0, 512, (2, n), generator=gen),) for n in lengths]
    counter = Counting()
    compiled = torch.compile(run, backend=counter)  # automatic dynamic
    with torch.no_grad():
        for (ids,) in inputs:
            torch.testing.assert_close(compiled(ids), run(ids), atol=2e-5, rtol=2e-5)
    assert len(counter.graphs) <= 3  # length 1 is specialized, then static, then dynamic
    assert len(counter.graphs) <= _eager_graphs(run, inputs, dynamic=None)
    assert backend_compile.stats["graph_fallbacks"] == 0


def _decode_step(cache, x):
    """One decoding step: append the token's vector to the cache, attend over the cache."""
    cache = torch.cat([cache, x], dim=1)
    att = torch.softmax(x @ cache.transpose(1, 2) * 0.125, -1)
    return cache, att @ cache


def test_kv_cache_growing_one_token_per_step():
    counter = Counting()
    compiled = torch.compile(_decode_step, backend=counter)
    cache = ref = torch.randn(2, 1, 16)
    for _ in range(40):
        x = torch.randn(2, 1, 16)
        cache, out = compiled(cache, x)
        ref, expected = _decode_step(ref, x)
        torch.testing.assert_close(cache, ref)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert len(counter.graphs) <= 3  # cache length 1 (specialized), 2 (static), symbolic
    assert len(counter.graphs) <= _eager_graphs(
        _decode_step, [(torch.randn(2, t, 16), torch.randn(2, 1, 16)) for t in range(1, 41)], None
    )
    assert backend_compile.stats["graph_fallbacks"] == 0


def test_schedule_log_shows_symbolic_sizes(caplog, tmp_path):
    import logging

    import ember
    from ember import config

    ember.set_logs("schedule", "kernels")
    # a private cache: the logs print what is generated, not what a cache hit loads
    with config.patch(cache_dir=str(tmp_path)), caplog.at_level(logging.DEBUG, logger="ember"):
        _run(lambda x: torch.softmax(x, -1), [(torch.randn(n, 33),) for n in (3, 5)])
    text = caplog.text
    assert "size s" in text  # where the wrapper reads each size symbol
    assert "outer=[s" in text  # the kernel's loop bounds, symbolic
    assert "const int64_t s" in text
