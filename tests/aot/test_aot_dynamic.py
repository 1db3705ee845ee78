"""ember's aot stage on graphs with symbolic sizes (Dynamo's dynamic=True).

The trace runs on meta tensors with the ShapeEnv's SymInts: one functional graph, with size
placeholders, serves every size. Checked against eager over many sizes with PyTorch's
kernels running the graphs (aot_eager) and with a recording compile_aten: the backward of a
variable batch, and sizes saved for the backward (passed as ints beside the tensors).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.aot import aot_compile, aot_eager, eager_compile_aten

SIZES = [2, 3, 7, 17, 33, 64]


class Recording:
    """compile_aten that records each graph and its example inputs, then runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[tuple[torch.fx.GraphModule, list]] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return eager_compile_aten(gm, example_inputs)


def _dynamo(fn, compile_aten):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_compile(gm, example_inputs, compile_aten)

    return torch.compile(fn, backend=backend, dynamic=True), graphs


def test_inference_one_trace_for_every_size():
    fn = lambda x, y: torch.softmax(x @ y, -1).view(x.shape[0], -1, 2).sum(1)  # noqa: E731
    rec = Recording()
    compiled, graphs = _dynamo(fn, rec)
    for n in SIZES:
        x, y = torch.randn(n, 8), torch.randn(8, 6)
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert len(graphs) == 1 and len(rec.graphs) == 1
    gm, examples = rec.graphs[0]
    kinds = [type(v).__name__ for v in examples]
    assert "SymInt" in kinds  # the size inputs reach the backend as SymInts
    code = gm.code
    assert "sym_size" in code or "primals_1" in code


def test_backward_of_a_variable_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    compiled, graphs = _dynamo(model, eager_compile_aten)
    for n in SIZES:
        x = torch.randn(n, 8)
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
        out.square().sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).square().sum().backward()
        for g, p in zip(got, model.parameters()):
            torch.testing.assert_close(g, p.grad)
        model.zero_grad()
    assert len(graphs) == 1


def test_sizes_saved_for_the_backward():
    """sum(0)'s backward expands the gradient to the input's shape, whose batch size only
    the input knows: the forward hands that size to the backward instead of the input."""
    rec = Recording()
    compiled, _ = _dynamo(lambda x: (x * 3).sum(0), rec)
    for n in SIZES:
        x = torch.randn(n, 5, requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((n, 5), 3.0))
    forward, backward = (gm for gm, _ in rec.graphs)
    saved_ints = [
        n
        for n in backward.graph.find_nodes(op="placeholder")
        if isinstance(n.meta["val"], torch.SymInt)
    ]
    assert saved_ints, backward.code
    backward_tensors = [
        n
        for n in backward.graph.find_nodes(op="placeholder")
        if isinstance(n.meta["val"], torch.Tensor) and n.meta["val"].dim() == 2
    ]
    assert not backward_tensors  # x itself is not saved


@pytest.mark.parametrize("n", [3, 17])
def test_no_specialization_of_the_traced_sizes(n):
    """Tracing adds no guard that pins a size: a later size does not recompile. (Widths
    differ from the batch sizes: Dynamo's duck sizing would tie equal sizes together.)"""
    compiled, graphs = _dynamo(lambda x: torch.cat([x, x * 2]).relu(), eager_compile_aten)
    for m in (n, n + 1, 2 * n + 5):
        x = torch.randn(m, 5, requires_grad=True)
        compiled(x).sum().backward()
        torch.testing.assert_close(x.grad, (x > 0) * 3.0)
    assert len(graphs) == 1


def test_aot_eager_backend_with_automatic_dynamic():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    fn = lambda x: x.exp().mean(-1)  # noqa: E731
    compiled = torch.compile(fn, backend=backend)
    for n in SIZES:
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(graphs) == 2  # static, then symbolic


def _scaled(x):
    return x * x.shape[1] ** -0.5  # a float of a symbolic size when dim 1 is dynamic


def test_symbolic_float_runs_uncompiled_with_a_reason():
    from ember import config

    compiled, graphs = _dynamo(_scaled, eager_compile_aten)
    with pytest.raises(Exception, match="symbolic float"):  # EMBER_STRICT=1 (the suite's)
        compiled(torch.randn(3, 4))
    torch._dynamo.reset()
    with config.patch(strict=False):
        compiled, graphs = _dynamo(_scaled, eager_compile_aten)
        for n in (3, 5, 9):
            x = torch.randn(n, n + 1)
            torch.testing.assert_close(compiled(x), _scaled(x))
    assert len(graphs) == 1


class _Layer(nn.Module):
    """Attention written out with views (-1 among their sizes), then an MLP."""

    def __init__(self, d: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) * 0.5, -1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x).view(-1, d)).view(b, t, d)


def _layouts(gm: torch.fx.GraphModule) -> list[str]:
    def text(v):
        if isinstance(v, torch.Tensor):
            return f"{v.dtype} {tuple(v.shape)} {v.stride()} {v.storage_offset()}"
        return str(v)

    return [
        f"{n.format_node()} :: {[text(v) for v in torch.utils._pytree.tree_leaves(n.meta['val'])]}"
        for n in gm.graph.nodes
        if "val" in n.meta
    ]


def _gpt2_tiny():
    from ember.testing.models import VOCAB, by_name

    model = by_name("gpt2").build()[0].eval()

    def run(ids):
        return model(input_ids=ids, use_cache=False).logits

    return run, lambda b, t: torch.randint(0, VOCAB, (b, t))


@pytest.mark.parametrize("case", ["layers", "layers training", "gpt2"])
def test_symbolic_meta_shortcuts_trace_the_same_graph(monkeypatch, case):
    """The symbolic trace's shortcuts (aot/symbolic_meta.py: layouts recalled from an
    earlier op on the same layouts, views of contiguous tensors, elementwise ops on
    contiguous operands, products, layer norms) give every node the layout the meta kernels
    give it: the same graphs, node for node, with and without them."""
    from ember.aot import symbolic_meta

    torch.manual_seed(0)
    training = case == "layers training"
    if case == "gpt2":
        fn, make = _gpt2_tiny()
    else:
        fn = nn.Sequential(_Layer(), _Layer()).train(training)
        make = lambda b, t: torch.randn(b, t, 16, requires_grad=training)  # noqa: E731
    traced = {}
    for enabled in (True, False):
        rec, backend = _recording_trace(monkeypatch, enabled)
        # marked rather than dynamic=True, under which Dynamo makes LayerNorm's eps an input
        compiled = torch.compile(fn, backend=backend)
        for b, t in ((2, 3), (3, 7)):
            x = make(b, t)
            torch._dynamo.mark_dynamic(x, [0, 1])
            with torch.set_grad_enabled(training):
                out = compiled(x)
                torch.testing.assert_close(out, fn(x))
            if training:
                out.sum().backward()
        traced[enabled] = [_layouts(gm) for gm, _ in rec.graphs]
        if enabled:
            assert symbolic_meta.stats["recalled"] > 10
            assert symbolic_meta.stats["contiguous_view"] > 3
            assert symbolic_meta.stats["pointwise"] > 3
            assert symbolic_meta.stats["matmul"] >= 4
            assert symbolic_meta.stats["layer_norm"] >= 1
            if case == "gpt2":
                assert symbolic_meta.stats["unsqueeze"] and symbolic_meta.stats["like"]
                assert symbolic_meta.stats["along_a_dim"]  # the attention mask's cumsum
                assert symbolic_meta.stats["full_index"]  # and its index by position
    assert len(traced[True]) == (2 if training else 1)
    assert traced[True] == traced[False]


def _recording_trace(monkeypatch, shortcuts: bool):
    """A fresh Dynamo and an aot backend recording its graphs, with ember.aot's symbolic
    layout shortcuts on or off (the two traces the shortcut tests compare)."""
    from ember.aot import symbolic_meta

    monkeypatch.setattr(symbolic_meta, "ENABLED", shortcuts)
    symbolic_meta.stats.clear()
    torch._dynamo.reset()
    rec = Recording()
    return rec, lambda gm, example_inputs: aot_compile(gm, example_inputs, rec)


def _along_a_dim_and_where(x, mask_src):
    """Softmax-like ops along a dim and `where` with Python numbers, on symbolic layouts:
    contiguous inputs (the shortcuts' case), a transposed and an offset one (left to the
    meta kernels), bool/int/float/half dtypes."""
    mask = mask_src > 0
    outs = [
        torch.softmax(x, -1),
        torch.log_softmax(x, 1),
        torch.softmax(x.half(), 0),
        torch.softmax(x, -1, dtype=torch.float64),
        mask.cumsum(-1),
        mask_src.cumsum(0),
        x.cumsum(1),
        x.cumsum(-1, dtype=torch.float64),
        x.transpose(0, 1).cumsum(0),
        x[1:].softmax(-1),
        torch.where(mask, 0.0, x),
        torch.where(mask, x, -1),
        torch.where(mask, 1, 2),
        torch.where(mask, 0.5, torch.tensor(2.0)),
    ]
    att = torch.nn.functional.scaled_dot_product_attention(
        x[None, None], x[None, None], x[None, None]
    )
    return [*outs, att]


def test_softmax_cumsum_and_scalar_where_shortcuts_give_the_meta_kernels_layouts(monkeypatch):
    """`along_a_dim` (softmax, log-softmax, _safe_softmax, cumsum) and `where` with numbers
    (answered by `pointwise`) give every node the layout and dtype torch's meta kernels give
    it, and every output is eager's."""
    from ember.aot import symbolic_meta

    traced = {}
    for enabled in (True, False):
        rec, backend = _recording_trace(monkeypatch, enabled)
        compiled = torch.compile(_along_a_dim_and_where, backend=backend)
        for n, m in ((3, 5), (4, 9)):
            x, src = torch.randn(n, m), torch.randint(-3, 3, (n, m))
            torch._dynamo.mark_dynamic(x, [0, 1])
            torch._dynamo.mark_dynamic(src, [0, 1])
            for got, want in zip(compiled(x, src), _along_a_dim_and_where(x, src), strict=True):
                torch.testing.assert_close(got, want)
        traced[enabled] = [_layouts(gm) for gm, _ in rec.graphs]
        if enabled:
            assert symbolic_meta.stats["along_a_dim"] >= 5
    assert len(traced[True]) == 1
    assert traced[True] == traced[False]


def _indexed(x, i, j):
    """Advanced indexing on symbolic layouts: every dim indexed by integer tensors that
    broadcast (the `full_index` shortcut's case), of int32 and int64, on a transposed
    input; a bool mask and a partial index (left to the meta kernel)."""
    return [
        x[i[:, None], j[None, :]],
        x[i.int()[:, None, None], j[None, None, :]],
        x.t()[j[:, None], i],
        x[i[:1], j[:1]],
        x[x > 0],
        x[i],
        (x[i[:, None], j] * 2).sum(-1),
    ]


def test_full_index_shortcut_gives_the_meta_kernels_layouts(monkeypatch):
    """`full_index` gives every node the layout and dtype torch's meta kernel gives it, and
    every output is eager's."""

    def inputs(n, m):
        x = torch.randn(n, m)
        i, j = torch.randint(0, n, (n,)), torch.randint(0, m, (m,))
        return (x, i, j), {x: [0, 1], i: [0], j: [0]}

    traced = _traced_with_and_without(monkeypatch, _indexed, inputs, ((3, 5), (4, 9)))
    assert traced[True][1]["full_index"] >= 3
    assert traced[True][0] == traced[False][0]


def _traced_with_and_without(monkeypatch, fn, inputs, sizes) -> dict:
    """{shortcuts on: (the recorded graphs' layouts, the shortcuts' stats)} for `fn`
    compiled on the inputs of each (n, m) in `sizes` (`inputs(n, m)` -> arguments and the
    dims to mark dynamic per tensor), every output compared with eager."""
    from ember.aot import symbolic_meta

    traced = {}
    for enabled in (True, False):
        rec, backend = _recording_trace(monkeypatch, enabled)
        compiled = torch.compile(fn, backend=backend)
        for n, m in sizes:
            args, dims = inputs(n, m)
            for t, d in dims.items():
                torch._dynamo.mark_dynamic(t, d)
            for got, want in zip(compiled(*args), fn(*args), strict=True):
                torch.testing.assert_close(got, want)
        traced[enabled] = ([_layouts(gm) for gm, _ in rec.graphs], dict(symbolic_meta.stats))
    return traced


def _broadcasts(x, i, j):
    """Elementwise ops whose operands broadcast each other (none has the result's shape):
    GPT-2's mask comparisons on index views, mixed ranks and dtypes, three operands; a
    sliced operand (not contiguous: left to the meta kernel)."""
    a, b = i[:, None], j[None, :]
    return [
        a <= b,
        i[None, None, :, None] == j[None, None, None, :],
        (a > 0) & (b > 0),
        a + x[0],
        x[:, None, :] * x[None, :, :].half(),
        torch.where(a > 1, b, 0.5),
        a * j,
        x[:, :1] - x[:1, :],
        (i[:, None, None] - j[None, :, None]).float().sum(-1),
    ]


@pytest.mark.parametrize("sizes", [((3, 5), (4, 9)), ((4, 4), (6, 6))])
def test_mutually_broadcast_elementwise_ops_give_the_meta_kernels_layouts(monkeypatch, sizes):
    """`pointwise` on operands that broadcast each other (`_mutually_broadcast`) gives every
    node the layout and dtype torch's meta kernels give it, with distinct and with shared
    size symbols, and every output is eager's."""

    def inputs(n, m):
        x, i, j = torch.randn(n, m), torch.arange(n) - 1, torch.arange(m) - 2
        return (x, i, j), {x: [0, 1], i: [0], j: [0]}

    traced = _traced_with_and_without(monkeypatch, _broadcasts, inputs, sizes)
    assert traced[True][1]["mutually_broadcast"] >= 6
    assert len(traced[True][0]) == 1
    assert traced[True][0] == traced[False][0]
