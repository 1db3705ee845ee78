"""The symbolic interpreter: steps a function's bytecode instruction by instruction.

`Translator` holds one frame's state (stack, locals, cells, instruction pointer) and
dispatches each instruction to the handler registered for its `Op` (capture/handlers/). The
graph, guards, ledger and value builder live in the `CaptureContext` shared by the root frame
and every inlined call.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import types
from typing import Any

import torch

from ember import config, torch_compat
from ember.bytecode import CodeBuilder, Inst, decode, handler_at
from ember.capture.autocast import AutocastMode, callers_modes
from ember.capture.cache import closures_share_entries
from ember.capture.guards import GuardKind, GuardSet
from ember.capture.output_graph import OutputGraph
from ember.capture.resume import cell_params
from ember.capture.shapes import DynamicPolicy, SymbolicShapes
from ember.capture.side_effects import SideEffects
from ember.capture.sources import (
    AttrSource,
    CellParamSource,
    CellSource,
    FreeCellSource,
    LocalSource,
    global_source,
)
from ember.capture.values.base import (
    ConstantValue,
    FoldingRaised,
    MissingAttribute,
    Value,
    next_serial,
)
from ember.capture.values.builder import ValueBuilder
from ember.capture.values.containers import DictValue, TupleValue
from ember.capture.values.exceptions import (
    ExceptionValue,
    TracedRaise,
    from_missing_attribute,
    leaving_generator,
    python_error,
)
from ember.capture.values.functions import RealCell
from ember.capture.values.iterators import GeneratorIterator
from ember.errors import BreakReason, Unsupported

MAX_STEPS = 200_000
_USER_ERRORS = (ArithmeticError, LookupError, ValueError)
"""Exceptions that user code raises on its own values; any other escaping a handler is
ember's bug and propagates."""


@dataclasses.dataclass(slots=True)
class Checkpoint:
    """The root frame's state before an instruction, to resume from at a graph break."""

    stack: list[Value]
    locals: dict[str, Value]
    lazy_args: dict[str, Any]
    kw_names: tuple[str, ...]
    last_node: torch.fx.Node | None
    """The graph's last node: what the instruction made comes after it (a placeholder it
    added for a tensor it read goes among the placeholders, before it)."""
    effects_version: int
    grad_enabled: bool
    autocast: tuple[AutocastMode, ...]


class RestartCapture(Exception):
    """The root frame cannot be put back as it was before a failed instruction (the ledger
    or containers changed part-way through it, or an inlined call broke): the capture runs
    again and stops before the instruction `steps` steps in (counted over all frames)."""

    def __init__(self, steps: int, reason: Unsupported) -> None:
        super().__init__(f"restart before step {steps}")
        self.steps = steps
        self.reason = reason


class NestedStop(Exception):
    """The capture stops inside an inlined call (capture/nested.py): the frame that breaks
    has `graph_break` set, and unwinding leaves each frame above it as it was at its call,
    the call's operands taken off its stack."""

    def __init__(self, frames: tuple[Translator, ...]) -> None:
        super().__init__("graph break in an inlined frame")
        self.frames = frames


@dataclasses.dataclass(slots=True)
class GraphBreak:
    inst: Inst
    reason: Unsupported


@dataclasses.dataclass
class CaptureContext:
    """Everything one capture builds, shared by all frames of the trace."""

    fn: types.FunctionType
    guards: GuardSet
    out: OutputGraph
    effects: SideEffects
    shapes: SymbolicShapes
    builder: ValueBuilder = dataclasses.field(init=False)
    handling: Value | None = None
    """The exception an `except`/`finally`/`with` handler of the trace is handling (what
    `sys.exc_info()` would give); None outside them."""
    steps: int = 0
    """Instructions stepped so far, in all frames: where a capture run again stops."""
    stop_before: tuple[int, Unsupported] | None = None
    """(steps, reason): break before the instruction after that many steps."""
    frames: list[Translator] = dataclasses.field(default_factory=list)
    """The frames running now, the root first: the frame that steps, and its callers (a
    generator's frame sits under the frame that pulls it)."""
    generators: list[GeneratorIterator] = dataclasses.field(default_factory=list)
    """The generators the trace made (values/generator_drop.py closes those it drops)."""
    broken: tuple[Unsupported, tuple[Translator, ...]] | None = None
    """The last break and the frames that were running when its instruction failed."""
    autocast: tuple[AutocastMode, ...] = dataclasses.field(default_factory=callers_modes)
    """The autocast modes in force: the caller's, then the traced `with torch.autocast`
    blocks entered (capture/autocast.py)."""

    def __post_init__(self) -> None:
        self.builder = ValueBuilder(self)

    @classmethod
    def new(cls, fn: types.FunctionType, policy: DynamicPolicy | None = None) -> CaptureContext:
        guards = GuardSet()
        shapes = SymbolicShapes(policy)
        return cls(fn, guards, OutputGraph(guards, shapes), SideEffects(), shapes)


class Translator:
    def __init__(
        self,
        ctx: CaptureContext,
        code: types.CodeType,
        f_globals: dict,
        f_locals: dict[str, Value],
        cells: dict[str, Any],
        parent: Translator | None = None,
        lazy_args: dict[str, Any] | None = None,
    ) -> None:
        self.ctx = ctx
        self.code = code
        self.f_globals = f_globals
        self.locals = f_locals
        self.cells = cells
        self.parent = parent
        self.arguments: list[Value] = list(f_locals.values()) if parent is not None else []
        """An inlined frame's arguments as it was called: its caller may still hold them
        (popped off its stack, in flight), so what they reach outlives this frame."""
        self.depth = 0 if parent is None else parent.depth + 1
        self.insts: list[Inst] = decode(code)
        self.stack: list[Value] = []
        self.ip = 0
        self.kw_names: tuple[str, ...] = ()
        self.returned: Value | None = None
        self.raised: ExceptionValue | None = None
        """The exception that left the root frame (frame.py), instead of a return value."""
        self.current: Inst | None = None
        self._lazy_args = lazy_args or {}
        self._steps = 0
        self.before = 0
        """The instructions stepped (in all frames) before the current one."""
        self.calling: Value | None = None
        """The callable of the call instruction this frame is running (read while the
        callee's frame runs, capture/nested.py)."""
        self.entry_grad_mode = torch.is_grad_enabled()
        """The grad mode this frame was entered in (an inlined frame: its caller's at the
        call)."""
        self.allow_break = False
        self.graph_break: GraphBreak | None = None
        self.yielded: list[Value] | None = None
        """What a generator frame has yielded so far (None: not a generator frame)."""
        self._step_serials: list[tuple[int, int]] = []
        """(steps before, first serial of the values made by) each root instruction."""

    # stack
    def push(self, value: Value) -> None:
        self.stack.append(value)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        values = self.stack[-n:]
        del self.stack[-n:]
        return values

    def peek(self, depth: int = 1) -> Value:
        return self.stack[-depth]

    # frame state
    def load_local(self, name: str) -> Value:
        if name in self.cells:
            return self.load_cell(name)
        if name not in self.locals and name in self._lazy_args:
            real = self._lazy_args.pop(name)
            self.locals[name] = self.ctx.builder.wrap(real, LocalSource(name))
        if name not in self.locals:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, f"local variable {name!r} read before assignment"
            )
        return self.locals[name]

    def load_cell(self, name: str) -> Value:
        cell = self.cells[name]
        if isinstance(cell, RealCell):
            pending = self.ctx.effects.load_cell(cell.cell)
            if pending is not None:
                return pending
            try:
                contents = cell.cell.cell_contents
            except ValueError as exc:
                raise Unsupported(
                    BreakReason.EXCEPTION_RAISED, f"free variable {name!r} is empty"
                ) from exc
            return self.ctx.builder.wrap(contents, cell.source)
        return cell.load(self)

    def store_cell(self, name: str, value: Value) -> None:
        cell = self.cells[name]
        if isinstance(cell, RealCell):
            self.ctx.effects.store_cell(cell, value)
        else:
            cell.store(self, value)

    def load_global(self, name: str) -> Value:
        pending = self.ctx.effects.load_global(self.f_globals, name)
        if pending is not None:
            return pending
        if name in self.f_globals:
            source = global_source(self.f_globals, self.ctx.fn.__globals__, name)
            return self.ctx.builder.wrap(self.f_globals[name], source)
        builtins = self.f_globals.get("__builtins__", __builtins__)
        table = builtins if isinstance(builtins, dict) else builtins.__dict__
        if name in table:
            return self.ctx.builder.wrap_const(table[name])
        raise Unsupported(BreakReason.EXCEPTION_RAISED, f"name {name!r} is not defined")

    def grad_enabled(self) -> bool:
        return torch.is_grad_enabled()

    def set_grad_enabled(self, mode: bool) -> None:
        """Change grad mode here (so fake results carry the right requires_grad) and in the
        graph (so the compiled code does the same). Inside a traced `torch.inference_mode()`
        block ops record no autograd whatever the grad mode: their examples are made under
        no_grad there (tensor.py's `tensor_op`)."""
        if mode != torch.is_grad_enabled():
            torch_compat.set_grad_enabled(mode)
            self.ctx.out.create_node("call_function", torch_compat.set_grad_enabled, (mode,), {})

    # locations for error messages
    def location(self) -> tuple[str, str]:
        line = self.current.line if self.current is not None else self.code.co_firstlineno
        text = linecache.getline(self.code.co_filename, line or 0).strip()
        return f"{self.code.co_filename}:{line}", text

    # the loop
    def run(self) -> Value | None:
        """Interpret until RETURN. The root frame of a capture that allows graph breaks
        stops at the first unsupported instruction instead, leaving `self.graph_break` set
        and the frame as it was just before that instruction; it then returns None. A
        capture run again may stop in an inlined frame instead (NestedStop)."""
        self.ctx.frames.append(self)
        try:
            return self._run()
        finally:
            self.ctx.frames.pop()

    def _run(self) -> Value | None:
        from ember.capture.handlers import HANDLERS

        while self.returned is None:
            stop = self.ctx.stop_before
            if stop is not None and self.ctx.steps == stop[0]:
                self.ctx.stop_before = None
                self.current = self.insts[self.ip]
                reason = stop[1].at(*self.location())
                if len(self.ctx.frames) > 1:
                    self._stop_nested(reason)
                self._end_before_lost_blocks(reason)
                self.graph_break = GraphBreak(self.current, reason)
                return None
            checkpoint = self._checkpoint() if self.allow_break else None
            self.before = self.ctx.steps
            if self.allow_break:
                self._step_serials.append((self.before, next_serial()))
            if self.ip >= len(self.insts):
                raise Unsupported(BreakReason.DYNAMIC_CONTROL_FLOW, "fell off the end of code")
            inst = self.insts[self.ip]
            self.current = inst
            self.calling = None
            self.ip += 1
            self._steps += 1
            self.ctx.steps += 1
            if self._steps > MAX_STEPS:
                raise Unsupported(
                    BreakReason.DYNAMIC_CONTROL_FLOW,
                    f"more than {MAX_STEPS} instructions (a loop that does not end?)",
                )
            try:
                if inst.op is None:
                    raise Unsupported(
                        BreakReason.UNSUPPORTED_OPCODE,
                        f"{inst.opname}: {inst.unsupported_reason}",
                    )
                try:
                    HANDLERS[inst.op](self, inst)
                    if self.ctx.shapes.env is not None:  # size guards the step added
                        self.ctx.shapes.label_guards(self)
                except _USER_ERRORS as exc:
                    # Python raised while folding the user's code on known values (int("x"),
                    # {}["k"], 1 / 0): a handler of the trace catches it, or CPython raises it
                    if self.handled_in_trace():
                        raise TracedRaise(python_error(self, exc, exact=False)) from exc
                    raise Unsupported(
                        BreakReason.EXCEPTION_RAISED, f"{type(exc).__name__}: {exc}"
                    ) from exc
                except MissingAttribute as exc:
                    if self.handled_in_trace():
                        self._guard_caught(exc)
                        raise TracedRaise(from_missing_attribute(self, exc)) from exc
                    raise
                except FoldingRaised as exc:
                    if self.handled_in_trace():
                        raise TracedRaise(python_error(self, exc.error)) from exc
                    raise
            except TracedRaise as raised:
                if not self.unwind(inst, raised.value):
                    self._escape(raised)
            except Unsupported as exc:
                where, text = self.location()
                exc.at(where, text)
                exc.user_stack.append(f"{where} in {self.code.co_name}: {text}")
                if len(exc.user_stack) == 1:  # the frame whose instruction failed
                    self.ctx.broken = (exc, tuple(self.ctx.frames))
                if checkpoint is None:
                    raise
                if len(exc.user_stack) > 1 or not self._restore(checkpoint):
                    # an inlined call broke part-way (it may have advanced iterators or
                    # filled containers it shares with this frame), or the instruction
                    # recorded mutations: capture again from the start and stop before it,
                    # or before the instruction of the inlined frame that the break can be
                    # taken in
                    raise RestartCapture(self._break_step(exc), exc) from exc
                self._end_before_lost_blocks(exc)
                self.graph_break = GraphBreak(inst, exc)
                return None
        return self.returned

    def steps_before_current(self) -> int:
        """The steps taken before the current instruction (what `stop_before` counts)."""
        return self.before

    def _break_step(self, exc: Unsupported) -> int:
        """Where the capture run again stops for a break that reached this root frame: the
        current instruction of the deepest frame of the failure that can take it
        (capture/nested.py), this frame's own at worst."""
        from ember.capture.nested import host_depth

        broken = self.ctx.broken
        if broken is None or broken[0] is not exc or broken[1][0] is not self:
            return self.before
        chain = broken[1]
        return chain[host_depth(chain)].before

    def _stop_nested(self, reason: Unsupported) -> None:
        """The capture run again reached the inlined instruction to break at: end it here
        (NestedStop), or, should the frames now show that this frame cannot take the break,
        run it again to stop in a caller."""
        from ember.capture.nested import host_depth

        chain = tuple(self.ctx.frames)
        host = chain[host_depth(chain)]
        if host is not self:
            raise RestartCapture(host.before, reason)
        self.graph_break = GraphBreak(self.current, reason)
        raise NestedStop(chain)

    def _guard_caught(self, exc: MissingAttribute) -> None:
        """A handler of the traced code catches this missing attribute: the trace now relies
        on its absence, which must be guarded like `hasattr`'s."""
        from ember.capture.values.attribute_builtins import guard_missing

        if not exc.guarded and exc.lookup is not None:
            guard_missing(self, *exc.lookup, exc)
            exc.guarded = True

    def handled_in_trace(self) -> bool:
        """Whether an exception raised now would reach a handler of a traced frame (this
        one's or a caller's): only then is a modelled builtin's exception traced, otherwise
        CPython raises it at a graph break, with its own message."""
        tx: Translator | None = self
        while tx is not None:
            if tx.current is not None and handler_at(tx.code, tx.current.offset) is not None:
                return True
            tx = tx.parent
        return False

    def unwind(self, inst: Inst, exc: ExceptionValue) -> bool:
        """Jump to the handler of `inst` for the exception, as CPython does: the stack cut
        to the handler's depth, then the raising instruction's offset (for handlers that
        re-raise with it) and the exception. False when `inst` has no handler here."""
        entry = handler_at(self.code, inst.offset)
        if entry is None:
            return False
        self._drop_stack(entry.depth)
        if entry.lasti:
            self.push(ConstantValue(inst.offset // 2))
        self.push(exc)
        self.kw_names = ()
        self.ip = next(i.index for i in self.insts if i.offset == entry.target)
        return True

    def _drop_stack(self, depth: int) -> None:
        """Cut the stack to `depth` as an exception unwinds: CPython releases the values
        from the top down, so a loop's generator that nothing else holds is closed there,
        before the handler runs (its `finally` first)."""
        from ember.capture.values.generator_drop import close_if_dropped

        dropped = self.stack[depth:]
        del self.stack[depth:]
        for value in reversed(dropped):
            close_if_dropped(self, value)

    def _escape(self, raised: TracedRaise) -> None:
        """The exception leaves this frame. Leaving the compiled function, an exception whose
        message is ember's wording of a builtin's is raised by CPython instead: the capture
        runs again and breaks at the instruction that raised it."""
        exc = raised.value
        if self.yielded is not None:  # a generator's frame (PEP 479)
            converted = leaving_generator(exc)
            if converted is not exc:
                raise TracedRaise(converted) from raised
        else:
            self._drop_stack(0)  # the locals live on in the traceback, the stack does not
        if self.parent is not None:
            raise raised
        message = exc.args[0].as_constant() if exc.args and exc.args[0].is_constant() else ""
        detail = f"{exc.cls.__name__}: {message}"
        if not self.allow_break:  # fullgraph: as under Dynamo, nothing may leave the graph
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, f"{detail} (leaves the compiled function)"
            ).at(*self.location()) from raised
        reason = Unsupported(BreakReason.EXCEPTION_RAISED, detail)
        if exc.synthesized_at is not None:
            raise RestartCapture(exc.synthesized_at, reason) from raised
        raise raised

    def _end_before_lost_blocks(self, reason: Unsupported) -> None:
        """A break inside a `with` block whose context manager break code cannot rebuild (the
        generator of a @contextmanager, a torch.autocast made from values break code cannot
        make): capture again and break at the instruction that made the manager instead.
        CPython makes it, and the resume function enters it (at a break at BEFORE_WITH, if
        its `__enter__` steps that generator)."""
        from ember.capture.codegen import can_rebuild
        from ember.capture.handlers.control import AutocastExit, ExitValue

        for value in self.stack:
            if (
                isinstance(value, ExitValue)
                # grad-mode blocks always resume
                and (value.user_exit is not None or isinstance(value, AutocastExit))
                and not can_rebuild(self.code, value)
            ):
                made = value.manager.serial
                made_at = max(s for s, serial in self._step_serials if serial <= made)
                raise RestartCapture(
                    made_at,
                    Unsupported(
                        reason.reason,
                        f"{reason.detail} at {reason.location}, inside a `with` block on "
                        f"{value.manager.describe()}, which cannot be rebuilt at a graph "
                        "break: the graph ends where the context manager is made",
                    ),
                )

    def _checkpoint(self) -> Checkpoint:
        nodes = self.ctx.out.graph.nodes
        return Checkpoint(
            list(self.stack),
            dict(self.locals),
            dict(self._lazy_args),
            self.kw_names,
            next(iter(reversed(nodes)), None),
            self.ctx.effects.version,
            torch.is_grad_enabled(),
            self.ctx.autocast,
        )

    def _restore(self, cp: Checkpoint) -> bool:
        """Put the frame back as it was before the failed instruction (False when Python
        objects were already mutated by it, which cannot be undone)."""
        if self.ctx.effects.version != cp.effects_version:
            return False
        nodes = list(self.ctx.out.graph.nodes)
        if cp.last_node is not None and cp.last_node not in nodes:
            return False  # the instruction took out a node it found: start again
        made = nodes[nodes.index(cp.last_node) + 1 :] if cp.last_node is not None else nodes
        graph = self.ctx.out.graph
        for node in reversed(made):
            if node.op == "placeholder":
                continue
            graph.erase_node(node)
        torch_compat.set_grad_enabled(cp.grad_enabled)
        self.ctx.autocast = cp.autocast
        self.stack, self.locals, self._lazy_args = cp.stack, cp.locals, cp.lazy_args
        self.kw_names = cp.kw_names
        return True

    def inline_call(
        self,
        code: types.CodeType,
        f_globals: dict,
        args: list[Value],
        kwargs: dict[str, Value],
        defaults: tuple[Value, ...],
        kwdefaults: dict[str, Value],
        closure: list[Any],
        description: str,
    ) -> Value:
        """Interpret a user function's body in a child frame and return its result.

        A generator function (most often a generator expression passed to `sum`, `any`,
        `tuple`, ...) returns a generator whose frame runs up to each yield when its consumer
        pulls, as in Python (values/iterators.py)."""
        if code.co_flags & (
            inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
        ):
            raise Unsupported(BreakReason.UNSUPPORTED_CALL, f"{description} is a coroutine")
        if self.depth >= config.current().inline_depth:
            raise Unsupported(BreakReason.INLINE_DEPTH, f"inlining {description}")
        f_locals = bind_arguments(code, args, kwargs, defaults, kwdefaults)
        cells = dict(zip(code.co_freevars, closure))
        child = Translator(self.ctx, code, f_globals, f_locals, cells, parent=self)
        if not code.co_flags & inspect.CO_GENERATOR:
            return child.run()
        made = GeneratorIterator(child, self.ctx.frames[-1].before if self.ctx.frames else None)
        self.ctx.generators.append(made)
        return made


def bind_arguments(
    code: types.CodeType,
    args: list[Value],
    kwargs: dict[str, Value],
    defaults: tuple[Value, ...],
    kwdefaults: dict[str, Value],
) -> dict[str, Value]:
    """Map call arguments to a code object's parameters as CPython does."""
    names = code.co_varnames
    npos, nkw, posonly = code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount
    bound: dict[str, Value] = dict(zip(names[:npos], args))
    extra = args[npos:]
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    if extra and not has_varargs:
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED,
            f"{code.co_name}() takes {npos} positional arguments but {len(args)} were given",
        )
    rest: dict[str, Value] = {}
    keyword_names = names[posonly : npos + nkw]
    for key, value in kwargs.items():
        if key in keyword_names:
            if key in bound:
                raise Unsupported(
                    BreakReason.EXCEPTION_RAISED,
                    f"{code.co_name}() got multiple values for {key!r}",
                )
            bound[key] = value
        elif has_varkw:
            rest[key] = value
        else:
            raise Unsupported(
                BreakReason.EXCEPTION_RAISED, f"{code.co_name}() got an unexpected keyword {key!r}"
            )
    first_default = npos - len(defaults)
    for i, name in enumerate(names[:npos]):
        if name not in bound:
            if i < first_default:
                raise Unsupported(
                    BreakReason.EXCEPTION_RAISED, f"{code.co_name}() missing argument {name!r}"
                )
            bound[name] = defaults[i - first_default]
    for name in names[npos : npos + nkw]:
        if name not in bound:
            if name not in kwdefaults:
                raise Unsupported(
                    BreakReason.EXCEPTION_RAISED, f"{code.co_name}() missing argument {name!r}"
                )
            bound[name] = kwdefaults[name]
    index = npos + nkw
    if has_varargs:
        bound[names[index]] = TupleValue(list(extra))
        index += 1
    if has_varkw:
        bound[names[index]] = DictValue(rest)
    return bound


def _raise_binding_error(fn: types.FunctionType, args: tuple, kwargs: dict) -> None:
    """CPython's own TypeError for arguments that do not fit `fn` ("forward() takes 2
    positional arguments but 3 were given", not inspect's wording): a stand-in with `fn`'s
    signature and an empty body is called with them. Nothing of `fn` runs."""
    builder = CodeBuilder(fn.__code__)
    builder.load_const(None)
    builder.return_value()
    stand_in = types.FunctionType(
        builder.to_code(), {}, fn.__name__, fn.__defaults__, fn.__closure__
    )
    stand_in.__kwdefaults__ = fn.__kwdefaults__
    stand_in(*args, **kwargs)


def root_translator(
    ctx: CaptureContext,
    fn: types.FunctionType,
    args: tuple,
    kwargs: dict,
    allow_break: bool,
    stop_before: tuple[int, Unsupported] | None = None,
) -> Translator:
    """The translator of the function being compiled, its arguments wrapped on first use."""
    code = fn.__code__
    if (
        not kwargs
        and len(args) == code.co_argcount
        and not code.co_kwonlyargcount
        and not (code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS))
    ):  # plain positional call (also of `.0`, a comprehension's parameter)
        lazy = dict(zip(code.co_varnames, args))
    else:
        try:
            real = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
        except TypeError:
            _raise_binding_error(fn, args, kwargs)
            raise
        real.apply_defaults()
        lazy = dict(real.arguments)
    cells: dict[str, Any] = {}
    shared = closures_share_entries(code)
    for index, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        if not shared:
            cells[name] = RealCell(cell, CellSource(name, index))
            continue
        # read and written through the running closure: entries serve every closure
        holder = FreeCellSource(name, index)
        cells[name] = RealCell(cell, CellSource(name, index), holder, False)
    for name in cell_params(code):  # a resume function's cells, passed as cell objects
        holder = CellParamSource(name)
        cells[name] = RealCell(lazy.pop(name), AttrSource(holder, "cell_contents"), holder, False)
    ctx.guards.add(GuardKind.GRAD_MODE, None, torch.is_grad_enabled())
    ctx.stop_before = stop_before
    tracer = Translator(ctx, fn.__code__, fn.__globals__, {}, cells, lazy_args=lazy)
    tracer.allow_break = allow_break
    return tracer
