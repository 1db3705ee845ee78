"""`optimizer._init_group(group, params, grads, ...)` of a torch.optim optimizer, run on the
real optimizer while capturing instead of traced or broken at.

Every torch.optim step calls `_init_group` once per parameter group: it collects the
parameters that have gradients, their gradients and their state tensors into the lists it
is given, creating the state (zeros, a step counter) the first time a parameter is seen.
torch.compile marks it never to be compiled (a graph break per step). What it does depends
only on the optimizer's Python state (which parameters have a gradient, which state
exists), not on tensor values, and once the state exists it changes nothing: so ember runs
it for real at the point the trace reaches it, and the lists it filled hold the tensors as
graph inputs read through their sources (`opt.param_groups[i]['params'][j]`, `p.grad`,
`opt.state[p]['exp_avg']`). The guards read the state as the call left it (its keys, each
parameter's entries) and each gradient's presence, so a later call reuses the graph once
the state exists, and recompiles if it is cleared or replaced.

Where the trace's view of that state could differ from the real one (the trace wrote the
group, a gradient or the state before the call, or read the state before the call made
it) or the arguments are not a group and fresh empty lists, the call goes its usual way:
traced, or a break where torch marked it disable. Only torch.optim's own `_init_group`s
are run so: a subclass's override might do anything, and running it once at capture
instead of on every call could change what the program computes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ember import torch_compat
from ember.capture.guards import GuardKind
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import DictValue, ListValue
from ember.capture.values.functions import BoundMethodValue, UserFunctionValue

if TYPE_CHECKING:
    from ember.capture.translator import Translator


_PLAIN = (bool, int, float, str, type(None))


def init_group_method(owner: Value, cls: type, method: Value) -> Value:
    """What `opt._init_group` reads as, for an optimizer reached through a source: the
    method that runs for real (InitGroupMethod) when torch.optim defines it."""
    if owner.source is None or not isinstance(method, BoundMethodValue):
        return method
    if not isinstance(method.fn, UserFunctionValue):
        return method
    fn = getattr(cls, "_init_group", None)
    original = getattr(fn, "__wrapped__", fn)  # torch._dynamo's disable wraps it
    module = getattr(original, "__module__", "") or ""
    if not module.startswith("torch.optim."):
        return method
    return InitGroupMethod(method.fn, owner, method.source)


def super_init_group(owner: Value, klass: type, fn: Any) -> Value | None:
    """`super()._init_group` in a subclass's override, found on `klass` of the MRO: torch.optim's
    own method, run for real as above (the override's own code around the call is traced);
    None where it is not torch.optim's."""
    original = getattr(fn, "__wrapped__", fn)
    if owner.source is None or not (getattr(original, "__module__", "") or "").startswith(
        "torch.optim."
    ):
        return None
    return InitGroupMethod(UserFunctionValue(fn), owner)


class _Traced(Exception):
    """The call cannot be run ahead: it is traced (or breaks) as any call."""


class InitGroupMethod(BoundMethodValue):
    """`opt._init_group` of a torch.optim optimizer (see the module's docstring)."""

    def call(self, tx: Translator, args: list[Value], kwargs: dict[str, Value]) -> Value:
        try:
            return _run_ahead(tx, self.receiver, self.fn.fn, args, kwargs)
        except _Traced:
            return super().call(tx, args, kwargs)


def _run_ahead(
    tx: Translator, receiver: Value, function: Any, args: list[Value], kwargs: dict
) -> Value:
    """`function(opt, group, *lists)` run for real (the class's `_init_group`, which is not
    `opt._init_group` where a subclass overrides it and calls this one through super())."""
    builder, effects = tx.ctx.builder, tx.ctx.effects
    opt = builder.real_object(receiver)
    if not isinstance(opt, torch.optim.Optimizer) or kwargs or not args:
        raise _Traced
    group_value, lists = args[0], args[1:]
    group = builder.real_object(group_value) if isinstance(group_value, DictValue) else None
    if group is None or not any(g is group for g in opt.param_groups):
        raise _Traced
    if not all(isinstance(v, ListValue) and v.source is None and not v.items for v in lists):
        raise _Traced
    if effects.has_attr_writes(receiver) or effects.is_mutated(group_value):
        raise _Traced
    if torch_compat.callers_inference_mode():  # eager makes inference tensors: let it
        raise _Traced
    tx.ctx.guards.add(GuardKind.INFERENCE_MODE, None, False)
    for g in opt.param_groups:
        for p in g["params"]:
            seen = builder.existing(p)
            if seen is not None and effects.has_attr_writes(seen):  # `p.grad = ...` pending
                raise _Traced
    before = _state_layout(opt)
    stale_before = _state_values(tx, opt, group)
    filled = [[] for _ in lists]
    try:
        # every group at once: the state is complete before the trace first reads it, so
        # the calls for later groups find it unchanged (see _state_values)
        for g in opt.param_groups:
            result = function(opt, g, *([[] for _ in lists] if g is not group else filled))
            if g is group:
                returned = result
    except Exception as exc:  # raised again where the call runs in Python
        raise _Traced from exc
    if stale_before and _state_layout(opt) != before:
        raise _Traced
    if not isinstance(returned, _PLAIN):
        raise _Traced
    items = _read_back(tx, receiver, group_value, filled)
    for value, list_items in zip(lists, items, strict=True):
        for item in list_items:
            value.call_method(tx, "append", [item], {})
    return ConstantValue(returned)


def _state_layout(opt: torch.optim.Optimizer) -> list[tuple[int, tuple]]:
    """Which parameters have state and the names of their entries, in order."""
    return [(id(p), tuple(s)) for p, s in opt.state.items()]


def _state_values(tx: Translator, opt: torch.optim.Optimizer, group: dict) -> bool:
    """Whether the trace holds values of the optimizer's state made before this call (a
    change the call makes would not show in them). Refused outright where the trace
    changed the state it reads (the state dict, or the entries of this group's
    parameters): the real state is then not what the trace sees."""
    builder, effects = tx.ctx.builder, tx.ctx.effects
    whole = builder.existing(opt.state)
    if whole is None:
        return False
    if effects.is_mutated(whole):
        raise _Traced
    for p in group["params"]:
        entries = builder.existing(opt.state[p]) if p in opt.state else None
        if entries is not None and effects.is_mutated(entries):
            raise _Traced
    return True


def _read_back(
    tx: Translator, receiver: Value, group_value: Value, filled: list[list[Any]]
) -> list[list[Value]]:
    """The values of what the real call put in the lists: parameters through the group,
    gradients through `p.grad` (also read where None: the trace relied on that), state
    tensors through `opt.state`; plain constants as they are."""
    builder = tx.ctx.builder
    params = group_value.getitem(tx, ConstantValue("params"))
    for param in params.iterate(tx):
        param.getattr(tx, "grad")
    receiver.getattr(tx, "state")
    values = []
    for items in filled:
        row = []
        for item in items:
            if isinstance(item, _PLAIN):
                row.append(ConstantValue(item))
                continue
            found = builder.existing(item)
            if found is None or not isinstance(item, torch.Tensor):
                raise _Traced
            row.append(found)
        values.append(row)
    return values
