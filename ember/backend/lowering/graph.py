"""Lower a functional aten-level fx graph to a `LoopGraph`.

Walks the graph once in order. Each call goes to its registered lowering, or to a fallback
kernel when there is none (or the lowering declines); lazy values that many consumers would
recompute expensively are realized; outputs are realized with eager's strides.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ember.backend import (
    decompose,  # noqa: F401  (registers the decompositions)
    sizes,
)
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import DType, Size
from ember.backend.lowering import (  # noqa: F401  (registers lowerings)
    fallback,
    layout,
    losses,
    norms,
    pointwise,
    pooling,
    reductions,
    scatter,
    strided_conv,
    views,
)
from ember.backend.lowering.registry import LOWERINGS, LowerCtx, NotLowered
from ember.backend.lowering.values import (
    BufferValue,
    GraphBuilder,
    LazyValue,
    expr_size,
)
from ember.backend.sizes import expr_of, exprs_of, hint, hint_prod, is_static, same, sources

MAX_INLINE = 48  # expression nodes above which a value with several users is materialized
MAX_READS = 4  # distinct buffers read above which a value with several users is materialized


def _meta(a: Any) -> Any:
    """A meta-device stand-in for a value (to run ops for shapes, strides and dtypes)."""
    if isinstance(a, BufferValue | LazyValue):
        dt = a.dtype if isinstance(a.dtype, torch.dtype) else a.dtype.torch
        if isinstance(a, BufferValue):
            lay = a.layout
            base = torch.empty(max(lay.storage_numel(), 1), dtype=dt, device="meta")
            return base.as_strided(lay.size, lay.stride, lay.offset)
        return torch.empty(a.size, dtype=dt, device="meta")
    if isinstance(a, list | tuple):
        return type(a)(_meta(x) for x in a)
    return a


def _node_meta(node: torch.fx.Node, args, kwargs) -> Any:
    val = node.meta.get("val")
    if val is not None:
        return val
    return node.target(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})


def _map(a: Any, env: dict) -> Any:
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, list | tuple):
        return type(a)(_map(x, env) for x in a)
    if isinstance(a, dict):
        return {k: _map(v, env) for k, v in a.items()}
    return a


def _lower_call(builder: GraphBuilder, node: torch.fx.Node, env: dict, meta: Any = None) -> Any:
    """Lower one call; `meta`: its result's meta value when not the traced one (strides the
    layout plan chose)."""
    args, kwargs = _map(node.args, env), _map(node.kwargs, env)
    if meta is None:
        meta = _node_meta(node, args, kwargs)
    ctx = LowerCtx(builder, meta, node)
    fn = LOWERINGS.get(node.target)
    if fn is not None:
        mark = len(builder.nodes), len(builder.buffers)
        try:
            return fn(ctx, *args, **kwargs)
        except NotLowered:
            del builder.nodes[mark[0] :], builder.buffers[mark[1] :]
    return fallback.fallback(ctx, node.target, args, kwargs)


def _maybe_realize(builder: GraphBuilder, node: torch.fx.Node, value: Any, meta: Any) -> Any:
    """Materialize a lazy value when inlining it into every user would cost too much: a big
    expression, (with several users) one that reads many buffers, like a residual stream
    that every later layer would otherwise recompute from all of its terms, or one that a
    GEMM or fallback reads (through views or not), which needs it in memory anyway: realized
    here once, in eager's layout, instead of once per such reader (a transposed GEMM operand
    would otherwise get a transposed copy) and again as a graph output; or a transcendental
    value that a reader broadcasts (rotary embeddings' cos/sin of (seq, dim), read for every
    batch and head), which inlining would recompute for each element of the reader.
    `meta`: the value's meta value with the strides it is written in (eager's, or the
    layout plan's)."""
    if isinstance(value, LazyValue):
        size, reads, costly = expr_size(value)
        many_users = len(node.users) > 1
        if (
            size > 4 * MAX_INLINE
            or (many_users and (size > MAX_INLINE or reads >= MAX_READS))
            or (costly and _broadcast(node, hint_prod(value.size)))
            or _read_from_memory(node)
        ):
            # in eager's layout (a channels-last activation stays channels-last) or the plan's
            return builder.realize(value, _eager_stride(meta))
    return value


def _broadcast(node: torch.fx.Node, numel: int) -> bool:
    """Whether a pointwise reader of `node` (looking through views, expand among them)
    computes more elements than `node` has, i.e. would evaluate it again for each."""
    for user in node.users:
        if user.op != "call_function":
            continue
        if _is_view(user):
            if _broadcast(user, numel):
                return True
            continue
        val = user.meta.get("val")
        elementwise = torch.Tag.pointwise in getattr(user.target, "tags", ())
        if elementwise and isinstance(val, torch.Tensor) and hint_prod(exprs_of(val.shape)) > numel:
            return True
    return False


def _read_from_memory(node: torch.fx.Node) -> bool:
    """Whether a library GEMM/convolution or a fallback reads `node`, directly or through
    view ops, or the graph returns it (through views or not) and something else reads it."""
    uses = list(_uses(node))
    return "memory" in uses or ("output" in uses and len(uses) > 1)


def _uses(node: torch.fx.Node):
    """How each final reader of `node`, looking through views, takes it: "memory" (a
    library call's matrix operand or a fallback), "output" (the graph returns it) or
    "inline" (a lowering that inlines lazy values)."""
    for user in node.users:
        if user.op == "output":
            yield "output"
        elif user.op != "call_function":
            continue
        elif _is_view(user):
            yield from _uses(user)
        elif user.target not in LOWERINGS:
            yield "memory"
        elif user.target in fallback.LIBRARY_OPS and _gemm_operand(node, user):
            yield "memory"
        else:
            yield "inline"


def _is_view(user: torch.fx.Node) -> bool:
    """A getitem or a view op (lowered as index arithmetic): readers are looked for beyond it."""
    fn = LOWERINGS.get(user.target)
    return user.target is operator.getitem or (fn is not None and fn.__module__ == views.__name__)


def _gemm_operand(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    """Whether `node` is a matrix operand of a library call (addmm's bias can join an
    epilogue instead)."""
    if user.target is torch.ops.aten.addmm.default:
        return node in user.args[1:3]
    return True


def _eager_stride(meta: Any) -> tuple[Size, ...] | None:
    if isinstance(meta, torch.Tensor) and _dense(meta):
        return exprs_of(meta.stride())
    return None


def _output(
    builder: GraphBuilder, value: Any, meta: Any, relaid: set[str]
) -> ir.Output | Size | None:
    """A graph output in eager's strides: a lazy value written in them, a buffer the
    layout plan wrote channels-last (`relaid`) copied into them, and a buffer that differs
    from them only along size-1 dims viewed with them."""
    if value is None or not isinstance(value, BufferValue | LazyValue):
        return value  # None, or a size (a forward graph returns those its backward needs)
    want = _eager_stride(meta)
    if (
        isinstance(value, BufferValue)
        and value.buffer in relaid
        and want is not None
        and not layout.same_strides(value.size, value.layout.stride, want)
    ):
        value = LazyValue(value.size, value.dtype, value.load)
    if isinstance(value, LazyValue):
        value = builder.realize(value, want)
    lay = value.layout
    if want is not None and lay.stride != want and layout.same_strides(lay.size, lay.stride, want):
        lay = ir.Layout(lay.size, tuple(want), lay.offset)  # eager's strides of size-1 dims
    return ir.Output(value.buffer, lay)


def _dense(t: torch.Tensor) -> bool:
    """Whether strides are a permutation of contiguous ones (safe to store with them)."""
    pairs = [(st, s) for s, st in zip(exprs_of(t.shape), exprs_of(t.stride())) if s != 1]
    pairs.sort(key=lambda p: hint(p[0]))
    acc: Size = 1
    for st, s in pairs:
        if not same(st, acc):
            return False
        acc *= s
    return True


def lower(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> ir.LoopGraph:
    """The loop IR of `gm`; inputs are named in0, in1, ... in placeholder order."""
    tensors = (t for t in example_inputs if isinstance(t, torch.Tensor))
    builder = GraphBuilder(next((t.device for t in tensors), None))
    env: dict[torch.fx.Node, Any] = {}
    inputs = iter(example_inputs)
    n_in = 0
    constants: list[tuple[str, str]] = []
    outputs: tuple[Any, ...] = ()
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    params = tuple(f"in{i}" for i in range(len(placeholders)))
    traced = [symbolic_value(n) for n in placeholders]
    symbols = sources(traced, params) if any(v is not None for v in traced) else {}
    kept = layout.plan(gm, lambda n: "output" in set(_uses(n)))
    relaid: set[str] = set()  # buffers written in the plan's layout instead of eager's
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            t = next(inputs)
            value = traced[n_in]
            if isinstance(value, torch.SymInt):
                env[node] = expr_of(value)
            else:
                env[node] = _input(builder, f"in{n_in}", value if value is not None else t)
            n_in += 1
        elif node.op == "get_attr":
            t = _fetch_attr(gm, node.target)
            name = f"const{len(constants)}"
            env[node] = _input(builder, name, t)
            constants.append((name, node.target))
        elif node.op == "call_function" and isinstance(node.meta.get("val"), torch.SymInt):
            env[node] = expr_of(node.meta["val"])  # size arithmetic: its expression
        elif node.op == "call_function":
            meta, mark = kept.get(node), len(builder.buffers)
            if node.target is operator.getitem:
                value = env[node.args[0]][node.args[1]]
            else:
                value = _lower_call(builder, node, env, meta)
            written = node.meta.get("val") if meta is None else meta
            env[node] = _maybe_realize(builder, node, value, written)
            if meta is not None:
                relaid.update(b.name for b in builder.buffers[mark:])
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, list | tuple) else (outs,)
            metas = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None for o in outs]
            outputs = tuple(_output(builder, _map(o, env), m, relaid) for o, m in zip(outs, metas))
        else:
            raise NotLowered(f"fx node kind {node.op}")
    used = sizes.symbols(*[o for o in outputs if not isinstance(o, ir.Output)])
    for b in (*builder.inputs, *builder.buffers):
        used |= sizes.symbols(b.layout.size, b.layout.stride, b.layout.offset)
    missing = used - set(symbols)
    if missing:
        raise NotLowered(f"sizes {sorted(map(str, missing))} are not sizes of any input")
    return ir.LoopGraph(
        tuple(builder.inputs),
        tuple(builder.buffers),
        tuple(builder.nodes),
        outputs,
        tuple(constants),
        params if symbols else (),
        tuple(sorted(symbols.items(), key=lambda kv: kv[0].name)),
    )


def symbolic_value(node: torch.fx.Node) -> Any:
    """A placeholder's traced value when it is symbolic (a SymInt, a tensor with symbolic
    sizes), else None (its example input says everything)."""
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        return val
    if isinstance(val, torch.Tensor):
        dims = (*val.shape, *val.stride(), val.storage_offset())
        if any(isinstance(s, torch.SymInt) and not is_static(expr_of(s)) for s in dims):
            return val
    return None


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _input(builder: GraphBuilder, name: str, t: Any) -> Any:
    """A tensor input (its layout from the example, or from the traced value when that is
    symbolic)."""
    if not isinstance(t, torch.Tensor):
        raise NotLowered(f"non-tensor graph input {type(t).__name__}")
    dtype = DType.of(t.dtype) or t.dtype
    return builder.add_input(name, exprs_of(t.shape), exprs_of(t.stride()), dtype)
