"""A suspended generator of the trace that the code drops for good is closed there, as
CPython closes it when its last reference goes.

`for y in gen(x): ... break` pops the loop's iterator at the `break` (POP_TOP, also in
3.12 and 3.13); when nothing else refers to the generator its refcount reaches zero there
and CPython closes it: GeneratorExit is thrown in at its `yield`, so its `finally` blocks
and `with` exits run before the code after the loop. The trace does the same
(generator_methods.close) when it can tell that nothing else refers to it: no frame
running now (locals, cells, stack), no value reachable from them (containers, objects,
closures, other generators' frames) and nothing the side-effect ledger will store holds
it. Found anywhere, it stays open, as in CPython (it is closed when that holder goes,
which the trace does not follow). A generator pulled ahead of its consumer is not at the
yield CPython's would be at: a graph break there. An exception leaving the `finally`
(or "generator ignored GeneratorExit") is dropped, as CPython drops it (it prints it to
stderr as "Exception ignored", which the trace does not reproduce).

A generator held by the compiled function's own frame when it returns (a local, or inside
one) dies with the frame: it is closed after the return value is computed, as CPython
does; at an inlined frame's return too, unless its arguments or cells reach it (see
`close_at_frame_end`). Not modelled (open): the iterator dropped by an exception leaving
the loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember.capture.values.base import Value
from ember.capture.values.exceptions import TracedRaise
from ember.capture.values.iterators import GeneratorIterator
from ember.capture.values.reachability import frame_contents, reachable
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.translator import Translator


def close_if_dropped(tx: Translator, value: Value) -> None:
    """`value` was just popped off the stack and discarded (POP_TOP): the suspended
    generators it held (itself, or inside a zip, enumerate, ...) that nothing else holds
    are closed."""
    suspended = _suspended(tx)
    if not suspended:
        return
    dropped = reachable([value], suspended)
    if dropped:
        kept = reachable(_roots(tx), dropped)
        dropped = [g for g in dropped if g not in kept]
    if len(dropped) > 1:
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{len(dropped)} generators dropped at once: the order CPython closes them in "
            "is not followed",
        )
    for gen in dropped:
        _close(tx, gen)


def _suspended(tx: Translator) -> list[GeneratorIterator]:
    """The generators the trace made that started and have not ended (closing one that
    has not started runs nothing)."""
    return [g for g in tx.ctx.generators if g.items and not g.exhausted]


def _close(tx: Translator, gen: GeneratorIterator) -> None:
    if gen.position < len(gen.items):
        raise Unsupported(
            BreakReason.UNSUPPORTED_CALL,
            f"{gen.describe()} dropped after being pulled ahead: CPython closes it here",
        )
    from ember.capture.values import generator_methods

    try:
        generator_methods.close(tx, gen)
    except TracedRaise:
        gen.exhausted = True  # eagerly printed to stderr ("Exception ignored") and dropped
    except Unsupported as exc:
        if exc.reason is not BreakReason.EXCEPTION_RAISED:
            raise
        gen.exhausted = True  # the same, raised where no handler of the trace catches it


def close_at_frame_end(tx: Translator) -> None:
    """Frame `tx` returns (its return value computed): the suspended generators that only
    its locals (and, for the compiled function's own frame, its cells) held die with it
    and are closed, in the order CPython clears the locals (`co_varnames`, then the
    cells). An inlined frame's caller may hold values the frames do not show, popped off
    its stack for the call (BEFORE_WITH calls `__enter__` with the manager popped; an
    operator's operands): those are the frame's arguments as called (`tx.arguments`), so
    what they reach is kept, and so is what its cells reach (shared with other
    closures). A generator frame's end is not followed (open)."""
    if tx.yielded is not None or not tx.ctx.frames or tx.ctx.frames[-1] is not tx:
        return
    suspended = _suspended(tx)
    if not suspended:
        return
    roots = _roots(tx, skip=tx)
    names = [*tx.code.co_varnames, *tx.code.co_cellvars, *tx.code.co_freevars]
    held = [tx.locals.get(n) for n in names]
    if tx.parent is None:
        held += [tx.cells.get(n) for n in names]
    else:
        roots += [tx.arguments, tx.cells]
    kept = reachable(roots, suspended)
    order: list[GeneratorIterator] = []
    for holder in held:
        for gen in reachable([holder], suspended):
            if gen not in kept and gen not in order:
                order.append(gen)
    for gen in order:
        others = [g.frame for g in order if g is not gen]
        if reachable([c for f in others for c in frame_contents(f)], [gen]):
            raise Unsupported(
                BreakReason.UNSUPPORTED_CALL,
                f"{gen.describe()} dies with its frame inside another generator that dies "
                "with it: the order CPython closes them in is not followed",
            )
    for gen in order:
        _close(tx, gen)


def _roots(tx: Translator, skip: Translator | None = None) -> list[Any]:
    """What the trace knows may hold values: the frames running now (less `skip`, the
    frame that ends, whose return value counts) and the side-effect ledger."""
    roots: list[Any] = [vars(tx.ctx.effects)]
    frames = list(tx.ctx.frames)
    if tx not in frames:
        frames.append(tx)
    for frame in frames:
        roots += [frame.returned] if frame is skip else frame_contents(frame)
        roots.append(frame.calling)  # the callable of a call in flight
    return roots
