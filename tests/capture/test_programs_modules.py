"""Differential programs on nn.Modules: forward inlined, parameters and buffers as graph
inputs, containers of modules iterated (unrolled), real blocks (Linear, LayerNorm, GELU,
Dropout in eval, Embedding, Conv2d + BatchNorm in eval, MultiheadAttention) and a
hand-written transformer block, compiled as modules and called from compiled functions."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.testing import CompileCounter, assert_same, check_against_eager


def check_module(mod: nn.Module, *args, frames: int = 1, grads: bool = False, ref=None):
    """Compiled module against eager on the same inputs, twice; optionally gradients.
    `ref` is an identical module for eager (a deep copy by default)."""
    counter = CompileCounter()
    ref = copy.deepcopy(mod) if ref is None else ref
    compiled = ember.compile(mod, backend=counter, fullgraph=True)
    for _ in range(2):
        expected = ref(*args)
        actual = compiled(*args)
        assert_same(actual, expected, rtol=1e-4, atol=1e-5)
    assert counter.frame_count == frames
    if grads:
        loss_e = sum(t.sum() for t in _tensors(expected))
        loss_a = sum(t.sum() for t in _tensors(actual))
        loss_e.backward()
        loss_a.backward()
        for (name, p_e), (_, p_a) in zip(ref.named_parameters(), mod.named_parameters()):
            torch.testing.assert_close(p_a.grad, p_e.grad, rtol=1e-4, atol=1e-5, msg=name)
    return counter


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


class MLP(nn.Module):
    def __init__(self, d=8, hidden=16):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4))
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.offset = 0.5

    def forward(self, x):
        return x * self.weight * self.scale + self.offset


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(n)])
        self.norms = nn.ModuleDict({"pre": nn.LayerNorm(4), "post": nn.LayerNorm(4)})

    def forward(self, x):
        x = self.norms["pre"](x)
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        for name in self.norms:
            x = self.norms[name](x)
        return x, len(self.layers)


class SequentialModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x):
        return self.body(x) + self.body[0].bias.sum() + self.body[-1](x.new_ones(8))


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.pos = nn.Parameter(torch.randn(16, 8))
        self.ln = nn.LayerNorm(8)

    def forward(self, ids):
        return self.ln(self.emb(ids) + self.pos[: ids.shape[1]])


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        out, _ = self.mha(x, x, x, need_weights=False)
        return out


class SelfAttention(nn.Module):
    """Attention written by hand, as model code usually is."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d, 4 * d)

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, layers=2, d=16):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x[:, -1])


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)

    @property
    def out_features(self):
        return self.lin.out_features

    def helper(self, x):
        return x * 2


class Derived(Base):
    def forward(self, x):
        y = super().forward(x)
        return self.helper(y) + self.out_features


class Training(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if self.training:
            return self.lin(x) * 2
        return self.lin(x)


def x_seq(d=16):
    return torch.randn(2, 5, d)


MODULE_CASES = [
    ("mlp_eval", lambda: MLP().eval(), lambda: torch.randn(3, 8)),
    ("buffer_and_float_attr", WithBuffer, lambda: torch.randn(4)),
    ("module_list_dict", Stack, lambda: torch.randn(2, 4)),
    ("sequential_index", SequentialModel, lambda: torch.randn(2, 4)),
    ("conv_bn_eval", lambda: ConvBN().eval(), lambda: torch.randn(2, 3, 8, 8)),
    ("embedding", Embed, lambda: torch.randint(0, 20, (2, 5))),
    ("multihead_attention", lambda: Attention().eval(), lambda: torch.randn(2, 5, 8)),
    ("self_attention", SelfAttention, x_seq),
    ("transformer_block", lambda: Block().eval(), x_seq),
    ("transformer", lambda: Transformer().eval(), x_seq),
    ("super_property_method", Derived, lambda: torch.randn(2, 4)),
    ("training_flag", Training, lambda: torch.randn(2, 4)),
    ("layer_norm", lambda: nn.LayerNorm(8), lambda: torch.randn(2, 8)),
    ("gelu", lambda: nn.GELU(approximate="tanh"), lambda: torch.randn(2, 8)),
    ("dropout_eval", lambda: nn.Dropout(0.5).eval(), lambda: torch.randn(2, 8)),
    ("linear", lambda: nn.Linear(8, 3), lambda: torch.randn(2, 8)),
]


@pytest.mark.parametrize(
    ("make", "make_input"), [c[1:] for c in MODULE_CASES], ids=[c[0] for c in MODULE_CASES]
)
def test_module(make, make_input):
    check_module(make(), make_input())


@pytest.mark.parametrize(
    ("make", "make_input"),
    [(MLP, lambda: torch.randn(3, 8)), (Block, x_seq), (ConvBN, lambda: torch.randn(2, 3, 8, 8))],
    ids=["mlp", "block", "conv_bn"],
)
def test_module_gradients(make, make_input):
    mod = make().eval()
    check_module(mod, make_input(), grads=True)


def test_parameters_and_buffers_reach_the_graph():
    counter = check_module(WithBuffer(), torch.randn(4))
    graph = counter.graphs[0]
    names = [n.name for n in graph.graph.nodes if n.op == "placeholder"]
    assert any("weight" in n for n in names), names
    assert any("scale" in n for n in names), names
    assert not any("offset" in n for n in names), "a float attribute is baked, not an input"


def test_module_called_from_compiled_function():
    mlp = MLP().eval()

    def f(x):
        return mlp(x) + mlp.fc1.weight.sum()

    check_against_eager(f, torch.randn(3, 8), frames=1)


def test_module_as_argument():
    def f(model, x):
        return model(x).relu()

    block = Block().eval()
    counter = CompileCounter()
    compiled = ember.compile(f, backend=counter, fullgraph=True)
    for _ in range(2):
        x = x_seq()
        assert_same(compiled(block, x), f(block, x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1
    # another module object of the class: its type and attributes are guarded, its
    # parameters are the graph's inputs, so the graph serves it (Dynamo's does too)
    other = Block().eval()
    x = x_seq()
    assert_same(compiled(other, x), f(other, x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1
    other.train()  # what the trace read of it differs: a new graph
    torch.manual_seed(0)
    got = compiled(other, x)
    torch.manual_seed(0)
    assert_same(got, f(other, x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 2


def test_training_mode_batchnorm_updates_running_stats():
    mod = nn.BatchNorm1d(4)
    ref = copy.deepcopy(mod)
    compiled = ember.compile(mod, backend="eager", fullgraph=True)
    for _ in range(2):
        x = torch.randn(8, 4)
        assert_same(compiled(x), ref(x))
    assert_same(mod.running_mean, ref.running_mean)
    assert_same(mod.running_var, ref.running_var)
    assert_same(mod.num_batches_tracked, ref.num_batches_tracked)


class GPTConfig:
    def __init__(self):
        self.vocab = 32
        self.block_size = 8
        self.n_embd = 16
        self.n_head = 2
        self.dropout = 0.0
        self.bias = True


class CausalSelfAttention(nn.Module):
    """GPT-2 style: fused qkv, a registered causal-mask buffer sliced to the sequence."""

    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        size = config.block_size
        self.register_buffer("bias", torch.tril(torch.ones(size, size)).view(1, 1, size, size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = F.dropout(att, p=self.dropout, training=self.training)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPTBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(
            dict(
                c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
                c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
                act=nn.GELU(approximate="tanh"),
            )
        )
        m = self.mlp
        self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


class MiniGPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([GPTBlock(config) for _ in range(2)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of {t} is too long"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss
        return self.lm_head(x[:, [-1], :]), None


def _mini_gpt():
    torch.manual_seed(0)  # the lambda closes over a submodule: built twice, not deep-copied
    return MiniGPT(GPTConfig()).eval()


def test_mini_gpt_with_tied_weights_and_loss():
    idx = torch.randint(0, 32, (2, 8))
    targets = torch.randint(0, 32, (2, 8))
    check_module(_mini_gpt(), idx, ref=_mini_gpt())
    check_module(_mini_gpt(), idx, targets, frames=1, grads=True, ref=_mini_gpt())


class Introspective(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.maybe = None

    def forward(self, x):
        name = self.__class__.__name__ + type(self).__name__
        if getattr(self, "maybe", None) is not None:
            x = self.maybe(x)
        if hasattr(self, "nothing"):
            x = x * 100
        n = sum(p.numel() for p in self.parameters())
        names = [k for k, _ in self.named_parameters()]
        extra = self.lin.extra_repr()
        return self.lin(x) * n, name, names, extra, isinstance(self.lin, nn.Linear)


def test_module_introspection():
    check_module(Introspective(), torch.randn(2, 3))


def test_parameter_update_under_no_grad_inside_forward():
    class Renorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            with torch.no_grad():
                self.lin.weight.div_(self.lin.weight.norm())
            return self.lin(x)

    mod = Renorm()
    ref = copy.deepcopy(mod)
    compiled = ember.compile(mod, backend="eager", fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 3)
        assert_same(compiled(x), ref(x))
    assert_same(mod.lin.weight, ref.lin.weight)


def test_forward_hooks_added_after_compiling_still_run():
    mod = MLP().eval()
    ref = copy.deepcopy(mod)
    compiled = ember.compile(mod, backend="eager")
    x = torch.randn(3, 8)
    assert_same(compiled(x), ref(x))
    calls = []

    def hook(module, inputs, output):
        calls.append(type(module).__name__)
        return output * 2

    mod.fc1.register_forward_hook(hook)
    ref.fc1.register_forward_hook(hook)
    assert_same(compiled(x), ref(x))
    assert calls == ["Linear", "Linear"]
    handle = mod.register_forward_pre_hook(lambda m, args: (args[0] + 1,))
    ref.register_forward_pre_hook(lambda m, args: (args[0] + 1,))
    assert_same(compiled(x), ref(x))
    handle.remove()


MORE_LAYERS = [
    ("conv1d", lambda: nn.Conv1d(3, 4, 3, padding=1), lambda: torch.randn(2, 3, 8)),
    ("group_norm", lambda: nn.GroupNorm(2, 4), lambda: torch.randn(2, 4, 5)),
    ("rms_norm", lambda: nn.RMSNorm(8), lambda: torch.randn(2, 8)),
    (
        "flatten_unflatten",
        lambda: nn.Sequential(nn.Flatten(), nn.Unflatten(1, (2, 4)), nn.Identity()),
        lambda: torch.randn(3, 8),
    ),
    ("upsample", lambda: nn.Upsample(scale_factor=2), lambda: torch.randn(1, 2, 4, 4)),
    ("lstm", lambda: nn.LSTM(4, 6, batch_first=True), lambda: torch.randn(2, 5, 4)),
    ("gru", lambda: nn.GRU(4, 6, num_layers=2), lambda: torch.randn(5, 2, 4)),
    (
        "transformer_encoder_layer",
        lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0),
        lambda: torch.randn(2, 5, 8),
    ),
    (
        "conv_transpose",
        lambda: nn.ConvTranspose2d(2, 3, 2, stride=2),
        lambda: torch.randn(1, 2, 4, 4),
    ),
    ("prelu", nn.PReLU, lambda: torch.randn(3, 4)),
]


@pytest.mark.parametrize(
    ("make", "make_input"), [c[1:] for c in MORE_LAYERS], ids=[c[0] for c in MORE_LAYERS]
)
def test_more_layers(make, make_input):
    check_module(make().eval(), make_input())


def test_rnn_weights_replaced_between_calls():
    mod = nn.LSTM(4, 6).eval()
    compiled = ember.compile(mod, backend="eager", fullgraph=True)
    x = torch.randn(3, 2, 4)
    assert_same(compiled(x), mod(x))
    mod.weight_ih_l0 = nn.Parameter(torch.randn_like(mod.weight_ih_l0))
    assert_same(compiled(x), mod(x))


class ForwardsArgs(nn.Module):
    """Arguments forwarded with *args/**kwargs into a child's keyword-only parameters."""

    class Inner(nn.Module):
        def forward(self, x, scale=1.0, *, bias=None, **extra):
            out = x * scale
            if bias is not None:
                out = out + bias
            return out + len(extra)

    def __init__(self):
        super().__init__()
        self.inner = self.Inner()

    def forward(self, x, *args, **kwargs):
        return self.inner(x, *args, **kwargs)


def test_args_and_kwargs_forwarded_through_modules():
    mod = ForwardsArgs()

    def f(x, b):
        return mod(x, 2.0, bias=b, flag=True), mod(x), mod(x, **{"scale": 3.0})

    check_against_eager(f, torch.randn(3), torch.randn(3), frames=1)


class CallsAroundForward(nn.Module):
    def __call__(self, x):
        return super().__call__(x) + 1

    def forward(self, x):
        return x * 2


def test_a_module_class_with_its_own_call_runs_it():
    """A subclass overriding `__call__` (which calls `super().__call__`): the override runs,
    called from a compiled function or compiled itself (ember called forward directly)."""
    m, x = CallsAroundForward(), torch.randn(3)

    def f(m, x):
        return m(x)

    assert_same(ember.compile(f, backend="eager", fullgraph=True)(m, x), f(m, x))
    assert_same(ember.compile(m, backend="eager", fullgraph=True)(x), m(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "ember"])
def test_a_global_forward_hook_that_changes_outputs(backend):
    """A global forward hook is traced with each module call; the aot stage ran the
    GraphModule through `Module.__call__`, so the hook fired on the graph itself too (on its
    tuple of outputs: TypeError in the backend)."""
    lin = nn.Linear(3, 3)

    def f(m, x):
        return m(x) * 2

    handle = nn.modules.module.register_module_forward_hook(lambda mod, i, o: o + 7)
    try:
        x = torch.randn(2, 3)
        assert_same(ember.compile(f, backend=backend)(lin, x), f(lin, x))
    finally:
        handle.remove()


class SelfInspecting(nn.Module):
    def __init__(self, extra=False, act=None):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        if extra:
            self.foo = 3.0
            self.extra_p = nn.Parameter(torch.ones(3))
        self.act = act or nn.ReLU()

    def forward(self, x):
        r = self.fc(x)
        if hasattr(self, "foo"):
            r = r * self.foo
        n = sum(1 for _ in self.parameters())
        names = [k for k, _ in self.named_parameters()]
        kids = len(list(self.children()))
        if isinstance(self.act, nn.ReLU):
            r = r + 100
        r = self.act(r)
        if "extra_p" in self._parameters:
            r = r + self._parameters["extra_p"]
        return r * n + kids, names, len(self.__dict__), "foo" in vars(self), len(self.state_dict())


def test_modules_that_look_at_themselves():
    """A forward reading its own tables, `self.__dict__` and `vars(self)`, for modules of one
    class that differ: `__dict__`/`vars` of a module broke (7 graphs, 7 breaks; Dynamo 6
    graphs); one graph per kind of module now, no break."""

    def f(m, x):
        return m(x)

    ember.reset()
    torch.manual_seed(0)
    mods = [SelfInspecting(), SelfInspecting(extra=True), SelfInspecting(act=nn.Tanh())]
    compiled = ember.compile(f, backend="eager")
    x = torch.randn(1, 3)
    for m in mods + mods:
        assert_same(compiled(m, x), f(m, x))
    mods[0].foo = 2.0  # an attribute added after the capture
    assert_same(compiled(mods[0], x), f(mods[0], x))
    stats = ember.stats()
    assert stats["graph_breaks"] == 0 and stats["eager_frames"] == 0, stats
