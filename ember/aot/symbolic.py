"""Symbolic sizes in the aot stage: which inputs are symbolic, their traced stand-ins, hints.

A graph traced by Dynamo with dynamic shapes (and, later, by ember's own capture) takes
SymInt inputs (`s0: "Sym(s0)"`) and tensors whose placeholders carry fake tensors with
symbolic sizes (`meta["example_value"]`, or `meta["val"]`), all of one ShapeEnv. ember traces
such a graph on meta tensors *with those symbolic sizes* (meta tensors accept SymInts), so
every aten op's shape rules run on the ShapeEnv's symbols and whatever a rule assumes is
recorded there as a guard, which the front end checks on later calls. ember itself never
turns a symbolic size into a number to decide something that changes results: decisions
that only change speed (bytes to save, buffer reuse, loop order) read the *hint*, the size
the symbol had in the example call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(v: Any) -> bool:
    """A SymInt/SymFloat/SymBool whose value is not a constant of its ShapeEnv."""
    return isinstance(v, SYM_TYPES) and not v.node.expr.is_number


def symbolic_tensor(t: Any) -> bool:
    """A tensor (meta or fake) with a symbolic size, stride or storage offset."""
    if not isinstance(t, torch.Tensor):
        return False
    return any(is_symbolic(s) for s in (*t.shape, *t.stride(), t.storage_offset()))


def hint(v: Any) -> Any:
    """The example value of a size (an int stays itself): for decisions about speed only."""
    if isinstance(v, SYM_TYPES):
        node = v.node
        if node.hint is not None:
            return node.hint
        return node.shape_env.size_hint(node.expr)
    return v


def hints(vs: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(hint(v) for v in vs)


def numel_hint(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape:
        n *= hint(s)
    return n


def placeholder_value(node: torch.fx.Node) -> Any:
    """What a placeholder stood for when the graph was traced (Dynamo: example_value)."""
    return node.meta.get("example_value", node.meta.get("val"))


def symbolic_inputs(gm: torch.nn.Module, example_inputs: Sequence[Any]) -> list[Any] | None:
    """Per input: its symbolic stand-in (a SymInt, or a fake tensor with symbolic sizes) or
    None; None when no input is symbolic (the static path, unchanged)."""
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(example_inputs):
        return None
    out: list[Any] = []
    for node, example in zip(placeholders, example_inputs, strict=True):
        value = placeholder_value(node)
        if is_symbolic(example):
            out.append(example)
        elif is_symbolic(value) or symbolic_tensor(value):
            out.append(value)
        else:
            out.append(None)
    return out if any(v is not None for v in out) else None


def meta_like(fake: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A meta tensor with `fake`'s symbolic sizes, strides and offset (no FakeTensorMode)."""
    meta = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device="meta")
    if is_symbolic(fake.storage_offset()) or fake.storage_offset() != 0:
        meta = meta.as_strided(fake.shape, fake.stride(), fake.storage_offset())
    if requires_grad:
        meta.requires_grad_(True)
    return meta


def example_tensor(val: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An uninitialized real tensor with the hinted layout of a traced (maybe symbolic) one."""
    return torch.empty_strided(
        hints(val.shape), hints(val.stride()), dtype=val.dtype, device=device
    )


def example_input(val: Any, device: torch.device) -> Any:
    """A backend's example input for a traced placeholder value."""
    if isinstance(val, torch.Tensor):
        return example_tensor(val, device)
    return val  # a SymInt: backends read its expression (and hint) themselves


def traced_strides(val: torch.Tensor) -> Any:
    """The strides a traced value had, for checking a runtime tensor against: a tuple, or
    for symbolic strides a function of the runtime tensor (its sizes bind the symbols);
    None when they cannot be read back from the tensor's own sizes."""
    stride = val.stride()
    if not any(is_symbolic(s) for s in stride):
        return tuple(int(s) for s in stride)
    by_symbol = {
        s.node.expr: d
        for d, s in enumerate(val.shape)
        if is_symbolic(s) and isinstance(s.node.expr, sympy.Symbol)
    }
    exprs = [s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(s) for s in stride]
    if any(sym not in by_symbol for e in exprs for sym in e.free_symbols):
        return None

    def at(t: torch.Tensor) -> tuple[int, ...]:
        sub = {sym: t.shape[d] for sym, d in by_symbol.items()}
        return tuple(int(e.xreplace(sub)) for e in exprs)

    return at


_PY = {
    "FloorDiv": lambda a, b: a // b,
    "CleanDiv": lambda a, b: a // b,
    "CeilDiv": lambda a, b: -(-a // b),
    "PythonMod": lambda a, b: a % b,
    "Mod": lambda a, b: a % b,
    "ModularIndexing": lambda a, b, c: (a // b) % c,
    "Max": max,
    "Min": min,
}


class SizeBinder:
    """Reads a call's size symbols from its flat inputs (an int input that is the symbol, or
    a size of a tensor input) and evaluates size expressions with them: what replaying a
    view whose arguments were symbolic needs at run time."""

    def __init__(self, vals: Sequence[Any]) -> None:
        self.sources: dict[str, tuple[int, int | None]] = {}
        for i, v in enumerate(vals):
            if is_symbolic(v) and isinstance(v.node.expr, sympy.Symbol):
                self.sources.setdefault(v.node.expr.name, (i, None))
            elif isinstance(v, torch.Tensor):
                for d, s in enumerate(v.shape):
                    if is_symbolic(s) and isinstance(s.node.expr, sympy.Symbol):
                        self.sources.setdefault(s.node.expr.name, (i, d))
        self._code: dict[str, Any] = {}

    def bind(self, flat: Sequence[Any]) -> dict[str, int]:
        return {
            name: int(flat[i] if d is None else flat[i].shape[d])
            for name, (i, d) in self.sources.items()
        }

    def resolve(self, tree: Any, env: dict[str, int]) -> Any:
        """`tree` (view arguments) with every SymInt replaced by its value under `env`."""
        if isinstance(tree, tuple | list):
            return type(tree)(self.resolve(a, env) for a in tree)
        if not is_symbolic(tree):
            return tree
        text = str(tree.node.expr)
        code = self._code.get(text)
        if code is None:
            code = self._code[text] = compile(text, "<ember size>", "eval")
        return eval(code, _PY, env)  # noqa: S307 (an expression ember printed itself)
