"""Jumps on values known while tracing, loops (unrolled), with-blocks, return and raise."""

from __future__ import annotations

import builtins
import types
from typing import Any

import torch

from ember.bytecode import Op, stack_effect
from ember.capture.autocast import AutocastMode
from ember.capture.handlers import handler
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import IteratorValue, iter_of
from ember.capture.values.generator_drop import close_at_frame_end
from ember.capture.values.inference_mode import InferenceModeValue, enter_again
from ember.capture.values.objects import GradModeValue, UserObjectValue
from ember.errors import BreakReason, Unsupported


@handler(Op.JUMP)
def jump(tx, inst):
    tx.ip = inst.target


def _jump_if(expect: bool):
    def run(tx, inst):
        if tx.pop().truth(tx) is expect:
            tx.ip = inst.target

    return run


handler(Op.POP_JUMP_IF_TRUE)(_jump_if(True))
handler(Op.POP_JUMP_IF_FALSE)(_jump_if(False))


def _is_none(value: Value) -> bool:
    return value.is_constant() and value.as_constant() is None


@handler(Op.POP_JUMP_IF_NONE)
def pop_jump_if_none(tx, inst):
    if _is_none(tx.pop()):
        tx.ip = inst.target


@handler(Op.POP_JUMP_IF_NOT_NONE)
def pop_jump_if_not_none(tx, inst):
    if not _is_none(tx.pop()):
        tx.ip = inst.target


def _jump_or_pop(expect: bool):
    def run(tx, inst):
        if tx.peek().truth(tx) is expect:
            tx.ip = inst.target
        else:
            tx.pop()

    return run


handler(Op.JUMP_IF_TRUE_OR_POP)(_jump_or_pop(True))
handler(Op.JUMP_IF_FALSE_OR_POP)(_jump_or_pop(False))


@handler(Op.GET_ITER)
def get_iter(tx, inst):
    tx.push(iter_of(tx, tx.pop()))


@handler(Op.FOR_ITER)
def for_iter(tx, inst):
    iterator = tx.peek()
    if not isinstance(iterator, IteratorValue):
        raise Unsupported(BreakReason.DYNAMIC_CONTROL_FLOW, f"for over {iterator.describe()}")
    item = iterator.next(tx)
    if item is None:
        tx.pop()
        tx.ip = inst.target
    else:
        tx.push(item)


@handler(Op.END_FOR)
def end_for(tx, inst):
    # never reached while tracing (an exhausted FOR_ITER continues past it): kept exact anyway
    tx.popn(-stack_effect(inst))


@handler(Op.RETURN_VALUE)
def return_value(tx, inst):
    tx.returned = tx.pop()
    close_at_frame_end(tx)


@handler(Op.RETURN_CONST)
def return_const(tx, inst):
    tx.returned = tx.ctx.builder.wrap_const(inst.argval)
    close_at_frame_end(tx)


class ExitValue(Value):
    """The bound __exit__ that BEFORE_WITH leaves on the stack."""

    def __init__(self, manager: Value, user_exit: Value | None = None) -> None:
        self.manager = manager
        self.user_exit = user_exit

    def call(self, tx, args, kwargs) -> Value:
        if self.user_exit is not None:  # normal exit: __exit__(None, None, None), inlined
            return self.user_exit.call(tx, args, kwargs)
        return self.manager.exit(tx)

    def reconstruct(self, em) -> None:
        """At a break inside the block: for a grad-mode block, an `__exit__` that restores the
        mode outside it; for a context manager written in Python, its bound `__exit__`, as
        BEFORE_WITH left it (a resume function inlines either where the block ends)."""
        from ember.capture.resume import leave_grad_block

        if self.user_exit is None:
            em.cg.load_const(leave_grad_block(self.manager.saved[-1]))
            return
        em.reconstruct(self.manager)
        em.cg.load_attr("__exit__")


def enters_in_python(manager: Value) -> bool:
    """A context manager written in Python (contextlib.nullcontext, @contextmanager, a
    user's class), whose `__enter__` and `__exit__` ember inlines. Not autocast, whose
    methods set process state that the capture keeps instead (AutocastExit)."""
    return (
        isinstance(manager, UserObjectValue)
        and not is_autocast(manager)
        and all(
            isinstance(getattr(manager.cls, name, None), types.FunctionType)
            for name in ("__enter__", "__exit__")
        )
    )


def is_autocast(manager: Value) -> bool:
    return isinstance(manager, UserObjectValue) and issubclass(
        manager.cls, torch.amp.autocast_mode.autocast
    )


class AutocastExit(ExitValue):
    """The `__exit__` of a traced `with torch.autocast(...)` block: leaving the block drops
    its mode from the capture's autocast modes (the ops inside had their casts recorded).
    At a break inside the block, break code enters the (rebuilt) manager for real, after the
    graph, so the rest of the block runs under autocast in CPython and in the resume
    function, which ends the block with the real `__exit__`."""

    def call(self, tx, args, kwargs) -> Value:
        tx.ctx.autocast = tx.ctx.autocast[:-1]
        return ConstantValue(False)  # exceptions raised inside propagate, as autocast's do

    def reconstruct(self, em) -> None:
        with em.cg.callee():
            em.cg.load_const(_enter_again)
        em.reconstruct(self.manager)
        em.cg.call(1)


class InferenceModeExit(ExitValue):
    """The `__exit__` of a traced `with torch.inference_mode()` block; at a break inside it,
    one of a real block that break code enters (values/inference_mode.py)."""

    def reconstruct(self, em) -> None:
        with em.cg.callee():
            em.cg.load_const(enter_again)
        block = self.manager.entered[-1]
        em.cg.load_const(block.grad_outside)
        em.cg.load_const(block.mode)
        em.cg.load_const(block.grad_inside)
        em.cg.call(3)


def _enter_again(manager: torch.amp.autocast_mode.autocast) -> Any:
    """Break code inside a traced autocast block: enter it, and leave its `__exit__`."""
    manager.__enter__()
    return manager.__exit__


def leave_entered_block(tx, manager: Value) -> Value:
    """The real `__exit__` of a torch.autocast block that CPython entered (break code, then
    a resume function that the block ends in): from here the trace casts as autocast's
    state was before the block (the object's `prev*` attributes, which its `__enter__`
    set), and the real `__exit__` runs after the graph."""
    before = _read_mode(tx, manager, ("prev_fastdtype", "prev", "prev_cache_enabled"))
    tx.ctx.autocast = (*tx.ctx.autocast, before)
    tx.ctx.effects.exit_autocast(manager)
    return ConstantValue(False)


def _autocast_mode(tx, manager: Value) -> AutocastMode:
    """The mode a torch.autocast object enters, from the attributes its __init__ set."""
    return _read_mode(tx, manager, ("fast_dtype", "_enabled", "_cache_enabled"))


def _read_mode(tx, manager: Value, names: tuple[str, str, str]) -> AutocastMode:
    """An AutocastMode of the object's device and the (dtype, enabled, cache enabled)
    attributes named, which must be constants."""
    fields = []
    for name in ("device", *names):
        value = manager.getattr(tx, name)
        if not value.is_constant():
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL, f"torch.autocast with a non-constant {name}"
            )
        fields.append(value.as_constant())
    device, dtype, enabled, cache_enabled = fields
    return AutocastMode(device, dtype, bool(enabled), bool(cache_enabled))


@handler(Op.BEFORE_WITH)
def before_with(tx, inst):
    manager = tx.pop()
    if isinstance(manager, GradModeValue):
        tx.push(ExitValue(manager))
        tx.push(manager.enter(tx))
        return
    if isinstance(manager, InferenceModeValue):
        tx.push(InferenceModeExit(manager))
        tx.push(manager.enter(tx))
        return
    if is_autocast(manager):
        tx.ctx.autocast = (*tx.ctx.autocast, _autocast_mode(tx, manager))
        tx.push(AutocastExit(manager))
        tx.push(manager)  # autocast's __enter__ returns the object itself
        return
    if enters_in_python(manager):
        # A context manager written in Python (contextlib.nullcontext, a user's timer-free
        # scope): both methods are inlined, so their effects land in the graph or ledger.
        exit_method = manager.getattr(tx, "__exit__")
        entered = manager.getattr(tx, "__enter__").call(tx, [], {})
        tx.push(ExitValue(manager, exit_method))
        tx.push(entered)
        return
    raise Unsupported(
        BreakReason.UNSUPPORTED_CALL,
        f"`with` on {manager.describe()} (grad-mode context managers and ones written in "
        "Python are captured)",
    )


@handler(Op.LOAD_ASSERTION_ERROR)
def load_assertion_error(tx, inst):
    tx.push(tx.ctx.builder.wrap_const(AssertionError))


@handler(Op.LOAD_BUILD_CLASS)
def load_build_class(tx, inst):
    """A class statement's builder: calling it breaks the graph (class bodies run in CPython),
    and the code after the statement is captured again."""
    tx.push(tx.ctx.builder.wrap_const(builtins.__build_class__))
