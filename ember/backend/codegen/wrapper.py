"""The Python wrapper: a generated function that allocates, calls kernels and returns outputs.

Generating source once (instead of interpreting a plan per call) keeps the per-call Python
to what must happen: one allocation per live buffer, one ctypes call per kernel (argument
types preset, data pointers as ints), one torch call per extern. The source only refers to
`torch` and to kernel/op names bound at load, so it can be cached on disk with the library.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch

from ember import torch_compat
from ember.backend import sizes
from ember.backend.ir import nodes as ir
from ember.backend.ir.nodes import DType, Layout
from ember.backend.scheduler.fusion import Kernel, Schedule
from ember.backend.scheduler.memory import Plan
from ember.backend.sizes import py_tuple

# library ops called through their torch function (cheaper than an OpOverload call)
_FAST = {
    torch.ops.aten.mm.default: "torch.mm",
    torch.ops.aten.bmm.default: "torch.bmm",
    torch.ops.aten.addmm.default: "torch.addmm",
    torch.ops.aten.baddbmm.default: "torch.baddbmm",
    torch.ops.aten.convolution.default: "torch.convolution",
}


class Unrepresentable(Exception):
    """An extern argument that has no Python source form (the graph is then not cached)."""


def _torch_dtype(d: Any) -> torch.dtype:
    return d.torch if isinstance(d, DType) else d


def literal(v: Any) -> str:
    if isinstance(v, sympy.Expr):
        return sizes.py(v)  # a size computed from the call's size symbols
    if v is None or isinstance(v, bool | int | str):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, torch.dtype | torch.layout | torch.memory_format):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, list | tuple):
        inner = ", ".join(literal(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    raise Unrepresentable(repr(v))


class _Writer:
    def __init__(
        self, s: Schedule, params: dict[str, list[str]], plan: Plan, launches: dict[str, str]
    ) -> None:
        self.s = s
        self.params = params
        self.launches = launches
        self.plan = plan
        self.buffers = s.graph.buffer_map()
        self.var: dict[str, str] = {}  # buffer -> python variable holding its storage
        self.actual: dict[str, Layout] = {}  # variable -> layout of the tensor it holds
        self.relative: set[str] = set()  # variables whose storage_offset is not 0
        self.header: list[str] = ["import torch"]
        self.body: list[str] = []

    def view(self, buf: str, lay: Layout, alias: bool = False) -> str:
        """`buf` with layout `lay`: a view (`_as`), or with `alias` a bare tensor over the
        same memory (`_alias`: no view record, no shared version counter), for arguments an
        op only reads, since the wrapper runs without autograd."""
        v = self.var[buf]
        if self.actual.get(v) == lay and (lay.offset == 0):
            return v
        offset = sizes.py(lay.offset)
        size, stride = py_tuple(lay.size), py_tuple(lay.stride)
        if alias:  # _reinterpret_tensor adds the offset to the tensor's own
            return f"_alias({v}, {size}, {stride}, {offset})"
        if v in self.relative:
            off = f"{v}.storage_offset()" + (f" + {offset}" if offset != "0" else "")
        else:
            off = offset
        return f"_as({v}, {size}, {stride}, {off})"

    def arg(self, a: Any, read_only: bool = False) -> str:
        if isinstance(a, ir.TensorArg):
            return self.view(a.buffer, a.layout, alias=read_only)
        if isinstance(a, tuple):
            return "[" + ", ".join(self.arg(x, read_only) for x in a) + "]"
        return literal(a)

    def kernel(self, i: int, k: Kernel) -> None:
        for b, donor in self.plan.allocs[i]:
            buf = self.buffers[b]
            if donor is not None:
                src = self.var[donor]
                # the donor's name must go: it would keep the storage alive after b dies
                self.body.append(f"    {b} = {src}  # reuses the storage of {donor}")
                self.body.append(f"    del {src}")
                self.var[b], self.actual[b] = b, self.actual[src]
                self.var[donor] = b  # an in-place kernel still reads it, under b's name
                continue
            lay, dt = buf.layout, _torch_dtype(buf.dtype)
            size, stride = py_tuple(lay.size), py_tuple(lay.stride)
            self.body.append(f"    {b} = _new({size}, {stride}, {dt})")
            self.var[b], self.actual[b] = b, lay
        if k.name in self.launches:  # a Triton kernel: tensors and sizes, then its grid
            args = ", ".join(self.var.get(b, b) for b in self.params[k.name])
            self.body.append(f"    _{k.name}{self.launches[k.name].format(args=args)}")
            return
        ptrs = ", ".join(
            f"{self.var[b]}.data_ptr()" if b in self.buffers else b for b in self.params[k.name]
        )
        self.body.append(f"    _{k.name}({ptrs})")

    def extern(self, i: int, n: ir.ExternCall) -> None:
        name = f"_op{i}"
        self.header.append(f"{name} = {_FAST.get(n.op) or _op_source(n.op)}")
        # an op that writes no argument (by its schema) reads aliases; others get views
        read_only = isinstance(n.op, torch_compat.OpOverload) and not n.op._schema.is_mutable
        args = [self.arg(a, read_only) for a in n.args]
        args += [f"{k}={self.arg(v, read_only)}" for k, v in n.kwargs]
        call = f"{name}({', '.join(args)})"
        fix = n.kind == ir.ExternKind.FALLBACK or n.op == torch.ops.aten.convolution.default
        if len(n.outputs) == 1 and n.result_path == ((),):
            self.body.append(f"    {n.outputs[0]} = {call}")
        else:
            self.body.append(f"    _r = {call}")
            for b, path in zip(n.outputs, n.result_path):
                self.body.append(f"    {b} = _r{''.join(f'[{p}]' for p in path)}")
            self.body.append("    del _r")  # the tuple would keep every item alive
        for b in n.outputs:
            lay = self.buffers[b].layout
            if fix:
                size, stride = py_tuple(lay.size), py_tuple(lay.stride)
                self.body.append(f"    {b} = _fix({b}, {size}, {stride})")
            self.var[b], self.actual[b] = b, lay
            self.relative.add(b)

    def write(self) -> str:
        g = self.s.graph
        for b in g.inputs:
            self.var[b.name], self.actual[b.name] = b.name, b.layout
            self.relative.add(b.name)
        pooled = {d for allocs in self.plan.allocs for _, d in allocs if d}
        for i, step in enumerate(self.s.steps):
            if isinstance(step, Kernel):
                self.kernel(i, step)
            else:
                self.extern(i, step)
            dead = [b for b in self.plan.frees[i] if b not in pooled and self.var.get(b) == b]
            if dead:
                self.body.append(f"    del {', '.join(dead)}")
        outs = [
            self.view(o.buffer, o.layout) if isinstance(o, ir.Output) else literal(o)
            for o in g.outputs
        ]
        self.body.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        consts = {name for name, _ in g.constants}
        params = list(g.params) or [b.name for b in g.inputs if b.name not in consts]
        # each size symbol read from the call's inputs (see sizes.sources)
        self.body[:0] = [f"    {sym.name} = {src}" for sym, src in g.symbols]
        # call_boxed takes the list of inputs and empties it, so each input is freed at its
        # last use (the aot runtime's boxed convention, used for backward graphs)
        unpack = f"    {', '.join(params)}{',' if len(params) == 1 else ''} = args"
        boxed = (
            ["def call_boxed(args):", unpack, "    args.clear()"]
            if params
            else ["def call_boxed(args):"]
        )
        lines = self.header + ["", f"def call({', '.join(params)}):", *self.body, ""]
        return "\n".join(lines + boxed + self.body) + "\n"


def _op_source(op: Any) -> str:
    if not isinstance(op, torch_compat.OpOverload):  # a runtime helper of ember's (a function)
        return f"__import__({op.__module__!r}, fromlist=['_']).{op.__name__}"
    ns, rest = str(op).split(".", 1)
    name, overload = rest.rsplit(".", 1) if "." in rest else (rest, "default")
    return f"getattr(getattr(torch.ops.{ns}, {name!r}), {overload!r})"


def wrapper_source(
    s: Schedule, params: dict[str, list[str]], plan: Plan, launches: dict[str, str] | None = None
) -> str:
    """Python source defining `call(in0, in1, ...)` for the schedule. Kernels named in
    `launches` are Triton kernels, launched as `_name` + the launch text with `{args}` filled
    in; the others are C functions called through ctypes with data pointers."""
    return _Writer(s, params, plan, launches or {}).write()


def _fix(t: torch.Tensor, size: tuple, stride: tuple) -> torch.Tensor:
    """A fallback's result in the layout the kernels were generated for (copy if needed;
    strides that differ only along size-1 dims, as a 1x1 convolution's weight gradient's
    may between oneDNN and other kernels, only need a view)."""
    have = tuple(t.stride())
    if have == stride or t.numel() <= 1:
        return t
    if all(n == 1 or a == b for n, a, b in zip(size, have, stride)):
        return t.as_strided(size, stride)
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _allocator(device: torch.device) -> Any:
    """`_new(size, stride, dtype)` of the wrapper on a device other than the CPU (whose
    buffers come from torch_compat.empty_strided_cpu: a third of `torch.empty`'s cost,
    which a conv net's training step calls ~600 times)."""

    def new(size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    return new


def grid(xnumel: int) -> Any:
    """A Triton launch grid as a function of the launch's block sizes: enough programs of
    XBLOCK points each to cover `xnumel` (Triton calls it with the constexprs it launches
    with, so an autotuner's other XBLOCK gets its own grid)."""
    return lambda meta: ((xnumel + meta["XBLOCK"] - 1) // meta["XBLOCK"],)


def pow2(n: int) -> int:
    """The power of two at or above n (a Triton tile covering a row of n elements)."""
    return 1 << max(0, (n - 1).bit_length())


def instantiate(
    source: str,
    kernels: dict[str, Any],
    constants: dict[str, Any],
    device: torch.device | None = None,
) -> Any:
    """Execute wrapper source with kernel functions and graph constants bound; returns `call`.
    Buffers are allocated on `device` (on a GPU, from torch's caching allocator)."""
    on_cpu = device is None or device.type == "cpu"
    scope: dict[str, Any] = {
        **constants,
        "_new": torch_compat.empty_strided_cpu if on_cpu else _allocator(device),
        "_as": torch.as_strided,
        "_alias": torch_compat.reinterpret_tensor,
        "_fix": _fix,
        "_pow2": pow2,
        "_grid": grid,
    }
    scope.update({f"_{name}": fn for name, fn in kernels.items()})
    exec(compile(source, "<ember wrapper>", "exec"), scope)
    call = scope["call"]
    call.boxed_call = True  # the aot runtime then calls run_boxed(list) where it can
    call.run_boxed = scope["call_boxed"]
    return call
