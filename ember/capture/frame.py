"""Capture one call of one function: interpret it, harvest the graph, compile it with the
backend, build guards and replacement code, and return the cache entry.

This is the capture stage's pipeline, in order:
  root translator -> run -> harvest -> backend -> install __compiled_fn_N -> replacement code
  -> guard function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import io
import itertools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ember import logs, torch_compat
from ember.backends import backend_name
from ember.bytecode import Op
from ember.capture import stats
from ember.capture.autocast import without_callers_autocast
from ember.capture.break_site import BreakSite, CallerSite, Handler
from ember.capture.cache import CacheEntry
from ember.capture.codegen import (
    build_break_replacement,
    build_replacement,
    can_resume_after,
)
from ember.capture.guards import GuardKind, GuardSet, build_guard_function
from ember.capture.handlers.control import enters_in_python, is_autocast
from ember.capture.live_values import live_tensors
from ember.capture.nested import frame_function, passes_free_cells
from ember.capture.resume import (
    StackSlot,
    handler_at,
    live_locals,
    make_resume_function,
    super_receiver,
)
from ember.capture.shapes import DynamicPolicy, SizeRecord
from ember.capture.translator import (
    CaptureContext,
    NestedStop,
    RestartCapture,
    root_translator,
)
from ember.capture.values.exceptions import TracedRaise
from ember.capture.values.functions import RealCell
from ember.capture.values.inference_mode import grad_mode_outside_blocks
from ember.capture.values.iterators import GeneratorNotRebuilt, SettleFailed, settle_iterators
from ember.capture.values.objects import CellValue
from ember.capture.values.reachability import CycleNotRebuilt
from ember.distributed import active_ddp, split_at_buckets
from ember.errors import BackendCompilerFailed, Unsupported

_counter = itertools.count()
_listeners: list[Callable[[CacheEntry], None]] = []
"""Called with every new cache entry (ember.explain records captures this way)."""


def graph_code(gm: torch.fx.GraphModule) -> str:
    """The graph in seed 000's form: annotated placeholders, `= None` after last use."""
    for node in gm.graph.nodes:
        if "example_value" in node.meta and "val" not in node.meta:
            node.meta["val"] = node.meta["example_value"]
    return gm.print_readable(print_output=False, include_stride=False, include_device=False)


def _disassemble(code: types.CodeType) -> str:
    out = io.StringIO()
    dis.dis(code, file=out)
    return out.getvalue()


def capture_call(
    fn: types.FunctionType,
    args: tuple,
    kwargs: dict,
    backend: Callable[..., Any],
    wrap: Callable[[types.FunctionType], Callable[..., Any]] | None = None,
    policy: DynamicPolicy | None = None,
) -> CacheEntry:
    """Capture `fn(*args, **kwargs)`. With `wrap` (how to compile a resume function), an
    unsupported instruction becomes a graph break; without it, Unsupported propagates.
    `policy` says which argument sizes are symbols (ember/capture/shapes.py)."""
    stop_before = None
    lazy: frozenset[int] = frozenset()
    while True:
        try:
            ctx, tracer, brk, harvest, compiled_name, code = _capture(
                fn, args, kwargs, wrap, policy, stop_before, lazy
            )
            break
        except _BreakInCaller as retry:  # break code for the inlined frame failed
            stop_before = retry.stop
        except _RebuildLazily as retry:
            lazy |= {retry.index}
        except _BreakAtCreation as retry:  # the iterators alive there are others now
            stop_before, lazy = retry.stop, frozenset()
        except _ResumesIntoItself as repeat:
            return _as_written(fn, repeat.reason)
    graph = None
    if compiled_name is not None:
        graph = harvest.gm
        if logs.enabled("graph_code"):
            logs.log("graph_code", "TRACED GRAPH %s\n%s", compiled_name, graph_code(graph))
        compiled = _compile_graph(backend, graph, harvest.example_inputs)
        fn.__globals__[compiled_name] = compiled
    ctx.out.guard_sizes()
    _guard_distinct_from_changed(ctx)
    guard = build_guard_function(ctx.guards, fn)
    if logs.enabled("guards"):
        logs.log("guards", "GUARDS for %s\n%s", fn.__qualname__, guard.source_text)
    if logs.enabled("bytecode"):
        logs.log(
            "bytecode",
            "ORIGINAL %s\n%s\nREPLACEMENT\n%s",
            fn.__qualname__,
            _disassemble(fn.__code__),
            _disassemble(code),
        )
    replacement = types.FunctionType(
        code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    replacement.__kwdefaults__ = fn.__kwdefaults__
    sizes = SizeRecord(ctx.shapes.observed, fn) if ctx.shapes.observed else None
    entry = CacheEntry(
        guard,
        replacement,
        code,
        graph,
        compiled_name,
        brk.reason if brk is not None else None,
        sizes,
    )
    if graph is not None:
        stats.record_graph()
    if brk is not None:
        stats.record_break(brk.reason)
    for listener in _listeners:
        listener(entry)
    return entry


def _guard_distinct_from_changed(ctx: Any) -> None:
    """An outside list, dict or object the trace changed is a different object from every
    other outside value of its type the trace read: the graph and ledger assumed so (a
    later `f(x, l, l)` after `f(x, [], [])` must not reuse them: the append through one
    name is seen through the other)."""
    outside = ctx.builder.outside_values()
    guarded: set[frozenset[int]] = set()
    for changed in ctx.effects.changed_outside():
        kind = changed.python_type()
        for other in outside:
            pair = frozenset((id(changed), id(other)))
            if other is changed or pair in guarded or other.python_type() is not kind:
                continue
            guarded.add(pair)
            ctx.guards.add(GuardKind.DISTINCT_OBJECTS, changed.source, other.source)


class _BreakInCaller(Exception):
    """Break code for a break taken in an inlined frame cannot be made (a value of that
    frame cannot be rebuilt, an iterator cannot be settled): capture again and take the
    break in its caller, at the call."""

    def __init__(self, stop: tuple[int, Unsupported]) -> None:
        super().__init__("take the break in the caller")
        self.stop = stop


class _RebuildLazily(Exception):
    """An iterator alive at the break cannot be computed ahead (pulling it has side
    effects, or reads tensor data): capture again, and let break code make it again lazily
    (`map(f, ...)`) instead, so that CPython pulls it after the break, in order. `index`
    is its position among the lazy iterators alive there."""

    def __init__(self, index: int) -> None:
        super().__init__("make the iterator again lazily")
        self.index = index


class _BreakAtCreation(Exception):
    """A generator (or another iterator break code cannot make again) alive at the break
    can neither be computed ahead nor rebuilt: capture again and end the graph at the
    instruction that made it, so that CPython makes it and the resume function holds the
    real generator, instead of the whole frame running eagerly."""

    def __init__(self, stop: tuple[int, Unsupported]) -> None:
        super().__init__("break where the iterator is made")
        self.stop = stop


class _ResumesIntoItself(Exception):
    """The capture of a resume function broke before any graph work at the instruction it
    resumes after (a loop whose every iteration breaks there and computes nothing else:
    `[l.item() for l in losses]`): its break code would call the very same function, whose
    next capture would break again for the next item (its iterator is one further: a
    recompile per iteration). The function runs as written instead."""

    def __init__(self, reason: Unsupported) -> None:
        super().__init__("the resume function resumes into itself")
        self.reason = reason


_MOVES_ONLY = frozenset(
    """END_FOR POP_TOP SWAP COPY NOP STORE_FAST LOAD_FAST LOAD_FAST_CHECK LOAD_FAST_AND_CLEAR
    LOAD_FAST_LOAD_FAST STORE_FAST_STORE_FAST STORE_FAST_LOAD_FAST LOAD_CONST BUILD_TUPLE
    BUILD_LIST RETURN_VALUE RETURN_CONST""".split()
)


def _nothing_to_capture_after_the_loop(insts: list, at: Any) -> bool:
    """Whether the code after the innermost `for` loop around the break `at` only moves
    values to the return (a comprehension's list). A resume function that breaks into
    itself runs as written only then: as written, whatever comes after the loop (the head
    after a loop over FSDP1 blocks) would run uncompiled on every call, so there the loop
    keeps a capture per remaining item instead, whose last one compiles the rest."""
    loops = [i for i in insts[: at.index] if i.opname == "FOR_ITER" and i.target > at.index]
    if not loops:
        return True
    for inst in insts[loops[-1].target :]:
        if inst.opname not in _MOVES_ONLY:
            return False
        if inst.opname.startswith("RETURN"):
            return True
    return False


def _as_written(fn: types.FunctionType, reason: Unsupported) -> CacheEntry:
    """An entry that runs `fn` itself, for any arguments: the break it repeats was counted
    where it was first taken (the capture that made this resume function), so it is not
    counted again (Dynamo skips such a frame: a break in a loop)."""
    logs.log("graph_breaks", "%s runs as written: it breaks again at %s", fn.__qualname__, reason)
    guard = build_guard_function(GuardSet(), fn)
    return CacheEntry(guard, fn, fn.__code__, None, None, reason)


def _capture(
    fn: types.FunctionType,
    args: tuple,
    kwargs: dict,
    wrap: Callable[[types.FunctionType], Callable[..., Any]] | None,
    policy: DynamicPolicy | None,
    stop_before: tuple[int, Unsupported] | None,
    lazy: frozenset[int] = frozenset(),
) -> tuple:
    """Translate, harvest the graph and make the replacement code (before the backend
    compiles the graph: break code that cannot be made changes what the graph holds)."""
    grad_mode = torch.is_grad_enabled()
    try:
        ctx, frames, result = _translate(fn, args, kwargs, wrap is not None, policy, stop_before)
        tracer, host = frames[0], frames[-1]
        brk = host.graph_break
        # where the capture stopped or returned; inside an inference-mode block, the mode
        # outside it (break code enters a real block, which turns grad mode off itself)
        mode_at_break = grad_mode_outside_blocks(ctx.out)
        if brk is not None:
            _check_resumable(host)
            parts = [
                _FrameAtBreak.of(fn if tx is tracer else frame_function(tx), tx, tx is host)
                for tx in frames
            ]
            live = [v for part in parts for v in part.values()]
            with _in_caller_on_failure(frames):
                _settle_iterators(host, live, lazy, tracer)
        else:
            live = [result]
        outputs = live_tensors([*live, *ctx.effects.pending_values()])
        harvest = ctx.out.harvest(outputs)
    finally:
        torch_compat.set_grad_enabled(grad_mode)
    compiled_name = None if harvest.is_empty() else f"__compiled_fn_{next(_counter)}"
    if brk is None:
        changed = mode_at_break if mode_at_break != grad_mode else None
        with _break_where_generators_are_made(tracer, None):
            code = build_replacement(
                fn.__code__, compiled_name, harvest, ctx.effects, result, changed, tracer.raised
            )
        return ctx, tracer, brk, harvest, compiled_name, code
    logs.log("graph_breaks", "graph break in %s: %s", fn.__qualname__, brk.reason)
    *callers, at = parts
    made: list[types.FunctionType] = []
    site = BreakSite(
        brk.inst,
        host.stack,
        at.kept,
        at.untouched,
        host.kw_names,
        at.cells,
        functools.partial(_install_resume, at.fn, host, wrap, tuple(at.cells), made),
        wrap,
        mode_at_break if mode_at_break != grad_mode else None,
        _handler(at.fn.__code__, host),
        [
            part.caller(wrap, below.tracer.entry_grad_mode)
            for part, below in zip(callers, parts[1:])
        ],
        brk.reason.sets_grad_mode,
    )
    try:
        with _break_where_generators_are_made(tracer, host), _in_caller_on_failure(frames):
            code = build_break_replacement(fn.__code__, compiled_name, harvest, ctx.effects, site)
    except Unsupported as exc:  # the break's own reason first: it is what to change
        raise _runs_eagerly(brk.reason, f"and at the break, {exc.detail}") from exc
    repeats = host is tracer and compiled_name is None and any(r is fn for r in made)
    if repeats and _nothing_to_capture_after_the_loop(host.insts, brk.inst):
        raise _ResumesIntoItself(brk.reason)
    return ctx, tracer, brk, harvest, compiled_name, code


@contextlib.contextmanager
def _break_where_generators_are_made(root: Any, host: Any) -> Iterator[None]:
    """A generator of the trace that the generated code would have to make again (the
    function returns it, or an object holding it such as a @contextmanager's manager; or it
    is alive at the break inside such an object): capture again and end the graph where it
    is made, so that CPython makes it."""
    try:
        yield
    except (GeneratorNotRebuilt, CycleNotRebuilt, _BreakInCaller) as exc:
        cause = exc if not isinstance(exc, _BreakInCaller) else exc.__cause__
        if isinstance(cause, CycleNotRebuilt) and cause.step is not None:
            raise _BreakAtCreation((cause.step, _cycle_reason(cause, host))) from exc
        if not isinstance(cause, GeneratorNotRebuilt):
            raise
        made_at = _made_at(cause.value, root)
        if made_at is None:
            raise
        where = "" if host is None else f" past the graph break at {host.location()[0]}"
        raise _BreakAtCreation(
            (
                made_at,
                Unsupported(
                    cause.reason,
                    f"{cause.value.describe()} is made here and lives on{where} part-way "
                    "through (returned, or held by an object such as a @contextmanager's "
                    "manager), and a running generator cannot be made again: the graph "
                    "ends where it is made, and CPython runs it",
                ),
            )
        ) from exc


@contextlib.contextmanager
def _in_caller_on_failure(frames: tuple) -> Iterator[None]:
    """Where the break is taken in an inlined frame, a failure to hand that frame to CPython
    takes the break in its caller instead (_BreakInCaller)."""
    try:
        yield
    except Unsupported as exc:
        if len(frames) == 1:
            raise
        raise _BreakInCaller((frames[-2].before, frames[-1].graph_break.reason)) from exc


def _translate(
    fn: types.FunctionType,
    args: tuple,
    kwargs: dict,
    allow_break: bool,
    policy: DynamicPolicy | None,
    stop_before: tuple[int, Unsupported] | None = None,
) -> tuple:
    """Run the root translator; again, stopping earlier, while it asks for a restart (a
    break inside a callee, then where a `with` block's manager was made, ...). Each restart
    stops strictly before the last one, so this ends. Again too when the capture writes
    back a changed int it read (a counter): with that int a symbol (a new one each time)."""
    grad_mode = torch.is_grad_enabled()
    while True:
        ctx = CaptureContext.new(fn, policy)
        tracer = root_translator(ctx, fn, args, kwargs, allow_break, stop_before)
        try:
            frames, result = (tracer,), tracer.run()
        except TracedRaise as raised:  # leaves the function: its replacement raises it
            tracer.raised = raised.value
            frames, result = (tracer,), raised.value
        except NestedStop as stop:  # the break is taken in an inlined frame
            frames, result = stop.frames, None
        except RestartCapture as restart:
            torch_compat.set_grad_enabled(grad_mode)
            if stop_before is not None and restart.steps >= stop_before[0]:
                raise AssertionError("a restarted capture asked to restart as late") from restart
            stop_before = (restart.steps, restart.reason)
            continue
        counters = ctx.shapes.written_back(ctx.effects.constant_writes(fn.__globals__))
        if not counters:
            return ctx, frames, result
        torch_compat.set_grad_enabled(grad_mode)
        policy = policy.with_ints(counters)


def _handler(code: types.CodeType, tracer: Any) -> Handler | None:
    """The handler an exception raised by the frame's current instruction goes to, if any."""
    entry = handler_at(code, tracer.current.offset)
    if entry is None:
        return None
    target = next(i.index for i in tracer.insts if i.offset == entry.target)
    return Handler(target, entry.depth, entry.lasti)


@dataclasses.dataclass
class _FrameAtBreak:
    """One frame of the chain a break is taken in (capture/nested.py; only the root frame,
    usually): the function it runs and what travels to its resume function."""

    fn: types.FunctionType
    tracer: Any
    kept: dict[str, Any]
    """The locals read after its current instruction."""
    untouched: list[str]
    """Arguments of the root frame never read during capture (still the caller's)."""
    cells: dict[str, Any]

    @classmethod
    def of(cls, fn: types.FunctionType, tracer: Any, is_host: bool) -> _FrameAtBreak:
        inst = tracer.current
        targets = [inst.index + 1]
        handler = _handler(fn.__code__, tracer)  # where an exception from below goes
        targets += [handler.target] if handler is not None else []
        if is_host:  # where else the instruction may continue: a jump
            targets += [inst.target] if inst.target is not None else []
        names = _live_at(fn.__code__, tracer.insts, targets)
        kept = {k: v for k, v in tracer.locals.items() if k in names}
        untouched = [k for k in tracer._lazy_args if k in names]
        return cls(fn, tracer, kept, untouched, _live_cells(fn.__code__, tracer, is_host))

    def values(self) -> list[Any]:
        contents = [getattr(cell, "contents", None) for cell in self.cells.values()]
        return [*self.tracer.stack, *self.kept.values(), *filter(None, contents)]

    def caller(self, wrap: Callable[..., Any], grad_mode_at_call: bool) -> CallerSite:
        """This frame as the caller of the frame below, continuing after its call."""
        return CallerSite(
            self.tracer.current.index + 1,
            self.tracer.stack,
            self.kept,
            self.untouched,
            self.cells,
            functools.partial(_install_resume, self.fn, self.tracer, wrap, tuple(self.cells), []),
            _handler(self.fn.__code__, self.tracer),
            grad_mode_at_call,
        )


def _live_at(code: types.CodeType, insts: list, targets: list[int]) -> frozenset[str]:
    """The locals read from any of the instructions `targets` on (both sides of a branch,
    and the handler an exception goes to). A resume function's own stack parameters are
    dead once its prologue has run."""
    names: frozenset[str] = frozenset()
    for target in targets:
        if target < len(insts):
            names |= live_locals(code, insts[target].offset)
    receiver = super_receiver(code)  # read by zero-argument super() without a LOAD_FAST
    if receiver is not None:
        names |= {receiver}
    return frozenset(n for n in names if not n.startswith("___stack_"))


def _live_cells(code: types.CodeType, tracer: Any, is_host: bool = True) -> dict[str, Any]:
    """The frame's own cells at a break (CellValue, or RealCell in a resume function that
    received them). They travel to the resume function as the cell objects themselves,
    which its code takes as parameters instead of making new ones: a function made in the
    trace and alive after the break shares them with the rest of the frame. An inlined
    frame whose closure differs between calls passes its free variables the same way."""
    cells = {}
    for name in code.co_cellvars:
        cell = tracer.cells.get(name)
        if isinstance(cell, CellValue) or isinstance(cell, RealCell) and not cell.fixed:
            cells[name] = cell
    if passes_free_cells(tracer):
        cells.update((name, tracer.cells[name]) for name in code.co_freevars)
    return cells


def _runs_eagerly(reason: Unsupported, why: str) -> Unsupported:
    """The break's own reason and place, saying why the function runs eagerly instead."""
    exc = Unsupported(
        reason.reason,
        f"{reason.detail} ({why}; the function runs eagerly)",
        location=reason.location,
        source_line=reason.source_line,
        hint=reason.hint,
    )
    exc.user_stack = list(reason.user_stack)
    return exc


def _check_resumable(tracer: Any) -> None:
    """Inside try and `with` blocks a break resumes: the break code sends an exception of
    the instruction to a resume function at the block's handler, and the resume functions'
    copies of the code keep the blocks. A `with` block needs its `__exit__` on the stack:
    grad-mode blocks get one that restores the outer mode, context managers written in Python
    their own bound `__exit__`."""
    reason = tracer.graph_break.reason
    if not can_resume_after(tracer.graph_break.inst):
        raise _runs_eagerly(
            reason,
            f"at {tracer.graph_break.inst.opname}, which ember cannot run on its own and "
            "resume after",
        )
    inst = tracer.graph_break.inst
    manager = tracer.stack[-1] if inst.op is Op.BEFORE_WITH else None
    if manager is not None and not (enters_in_python(manager) or is_autocast(manager)):
        raise _runs_eagerly(
            reason,
            f"`with` on {manager.describe()}: ember captures the inside of context managers "
            "written in Python and of torch.autocast only",
        )


def _cycle_reason(cause: CycleNotRebuilt, host: Any) -> Unsupported:
    where = "" if host is None else f" and lives on past the graph break at {host.location()[0]}"
    return Unsupported(
        cause.reason,
        f"this makes {cause.value.describe()} refer to itself{where}; break code cannot make "
        "a cycle again: CPython makes it",
    )


def _settle_iterators(tracer: Any, live: list[Any], lazy: frozenset[int], root: Any) -> None:
    """Lazy iterators alive at the break hand their remaining items to CPython as a tuple:
    computed here, when that shows no side effect; otherwise the capture runs again and
    break code makes that one again, lazy (its index joins `lazy`), where it can; else (a
    generator) the capture runs again and breaks where that iterator is made; only where
    that place is unknown does the frame run eagerly."""
    try:
        settle_iterators(tracer, live, lazy)
    except SettleFailed as exc:
        if exc.lazily and exc.index not in lazy:
            raise _RebuildLazily(exc.index) from exc
        made_at = _made_at(exc.value, root)
        if made_at is not None:
            where = tracer.location()[0]
            raise _BreakAtCreation(
                (
                    made_at,
                    Unsupported(
                        exc.reason,
                        f"{exc.value.describe()} is made here and is still alive at the "
                        f"graph break at {where}, where it can be neither computed ahead "
                        f"({exc.inner}) nor made again: the graph ends where it is made, "
                        "and CPython runs it",
                        hint=exc.hint,
                    ),
                )
            ) from exc
        raise _runs_eagerly(
            exc.at(*tracer.location()) if not exc.location else exc, "at a graph break"
        ) from exc


def _made_at(value: Any, root: Any) -> int | None:
    """The step of the instruction that made `value` in this capture: its own record (a
    generator: the instruction of the frame that called the generator function), else the
    root frame's instruction during which it was made; None if made before the first."""
    made_at = getattr(value, "made_at", None)
    if made_at is not None:
        return made_at
    steps = [s for s, serial in root._step_serials if serial <= value.serial]
    return max(steps) if steps else None


def _install_resume(
    fn: types.FunctionType,
    tracer: Any,
    wrap: Callable[..., Any],
    cells: tuple[str, ...],
    made: list[types.FunctionType],
    target: int,
    slots: list[StackSlot],
    local_names: list[str],
    grad_mode: bool | None = None,
) -> Callable[..., Any]:
    """The compiled resume function that break code calls (a constant of that code, so it
    lives as long as the cache entry; resume functions of the same place share one cache).
    `cells` are the cell variables it takes as cell objects; `made` collects the plain
    resume functions (one resuming into the function captured: _ResumesIntoItself)."""
    resume = make_resume_function(fn, target, slots, local_names, tracer.insts, grad_mode, cells)
    made.append(resume)
    return _depth_limited(wrap(resume), resume)


MAX_RESUME_DEPTH = 64
"""Resume functions called from resume functions (a loop whose every iteration breaks) nest
Python frames; past this depth the rest runs as the plain resume function, in CPython,
instead of exhausting the recursion limit."""
_depth = threading.local()


def _depth_limited(compiled: Callable[..., Any], plain: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth >= MAX_RESUME_DEPTH:
            return plain(*args)
        _depth.n = depth + 1
        try:
            return compiled(*args)
        finally:
            _depth.n = depth

    call.__wrapped__ = compiled
    return call


def _compile_graph(
    backend: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]
) -> Callable[..., Any]:
    """The backend's compiled graph; inside DDP's forward, in parts at its gradient buckets
    (ember/distributed.py), each compiled by the backend. Run outside the caller's autocast,
    whose casts the graph holds (capture/autocast.py)."""
    ddp = active_ddp()
    if ddp is None:
        return without_callers_autocast(_call_backend(backend, gm, example_inputs))
    compile_part = functools.partial(_call_backend, backend)
    return without_callers_autocast(split_at_buckets(gm, example_inputs, ddp, compile_part))


def _call_backend(
    backend: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]
) -> Callable[..., Any]:
    try:
        compiled = backend(gm, example_inputs)
    except Exception as exc:
        raise BackendCompilerFailed(backend_name(backend), "compile", graph_code(gm), exc) from exc
    if not callable(compiled):
        raise BackendCompilerFailed(
            backend_name(backend),
            "compile",
            graph_code(gm),
            TypeError(f"backend returned {type(compiled).__name__}, not a callable"),
        )
    return compiled
