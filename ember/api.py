"""`ember.compile` and the wrappers it returns.

There is no frame-evaluation hook in pure Python, so the entry is the wrapper: on each call it
tries the cache entries of the function's code object (guard, then replacement), and captures
anew on a miss. Modules get a wrapper module whose forward goes through the same machinery.
"""

from __future__ import annotations

import functools
import inspect
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ember import config, logs, torch_compat
from ember.backends import lookup
from ember.capture import cache as frame_cache
from ember.capture import stats as capture_stats
from ember.capture.frame import capture_call
from ember.capture.shapes import DynamicPolicy
from ember.capture.values.compiler import is_disabled
from ember.capture.values.meta import clear_cache as clear_meta_cache
from ember.capture.values.modules import has_hooks
from ember.distributed import call_with_compiled_forward, wrapped_module
from ember.errors import BreakReason, Unsupported

functorch_active = torch_compat.functorch_transforms_active


KNOWN_OPTIONS: dict[str, str] = {}
"""`options` keys ember.compile acts on (name -> what it does): none yet, so every key is
refused rather than accepted and ignored."""


class CompileOptions:
    """What `ember.compile` was asked for, checked once up front."""

    def __init__(
        self,
        fullgraph: bool,
        dynamic: bool | None,
        backend: Any,
        mode: str | None,
        options: dict | None,
    ) -> None:
        if mode not in config.MODES:
            raise ValueError(f"unknown mode {mode!r}")
        if mode is not None and options:
            raise RuntimeError("either mode or options can be given, not both")
        unknown = sorted(set(options or {}) - set(KNOWN_OPTIONS))
        if unknown:
            known = ", ".join(sorted(KNOWN_OPTIONS)) or "none"
            raise ValueError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
                f" for ember.compile; known options: {known} (ember's settings are ember.config"
                " fields, set with EMBER_* environment variables)"
            )
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        """True: argument sizes are symbols from the first call; None: automatic (sizes seen
        changing become symbols at the recompile); False: never (marks still count)."""
        self.backend = _with_mode(lookup(backend), mode)
        self.mode = mode
        self.options = dict(options or {})
        self._asked_backend = lookup(backend)  # held, so that its id in the key stays its own
        self._key = (fullgraph, dynamic, mode, id(self._asked_backend))

    def __eq__(self, other: object) -> bool:
        """Options asked for alike compare equal, so that separate `ember.compile` calls of
        one code (a block class's forward, compiled per instance in the FSDP recipe) share
        its cache, as torch.compile's calls share a code's cache entries."""
        return isinstance(other, CompileOptions) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


def _with_mode(backend: Any, mode: str | None) -> Any:
    """The backend, told the mode: ember's own takes it (as torch.compile passes `mode=` to a
    backend other than Inductor); other backends (eager, aot_eager, callables) compile as
    they do in every mode, which is logged."""
    if mode in (None, "default"):
        return backend
    from ember.backends import lookup as resolve

    if backend is resolve("ember") or getattr(backend, "__name__", "") == "ember.backend":
        from ember.backend import compile_graph

        def ember_in_mode(gm: Any, example_inputs: list) -> Any:
            return compile_graph(gm, example_inputs, mode=mode)

        ember_in_mode.__name__ = "ember"
        return ember_in_mode
    name = getattr(backend, "__name__", backend)
    logs.log("kernels", "mode=%r: the backend %r has no modes; compiling as it does", mode, name)
    return backend


def _run_cached(
    fn: types.FunctionType,
    opts: CompileOptions,
    cache: frame_cache.FrameCache,
    args: tuple,
    kwargs: dict,
) -> Any:
    """The slow path: no entry matched."""
    if cache.eager_reason is not None:
        return fn(*args, **kwargs)
    limit = config.current().recompile_limit
    if cache.entries:
        capture_stats.record_recompile()
        failure = cache.entries[-1].guard.first_failure(*args, **kwargs)
        cache.misses.append(failure)
        changed = _automatic_dynamic(opts, cache, args, kwargs)  # marks dims for the capture
        logs.log(
            "recompiles", "recompiling %s: guard failed: %s%s", fn.__qualname__, failure, changed
        )
        if len(cache.entries) >= limit:
            failing = f"Guards that kept failing: {sorted(set(cache.misses))}"
            if opts.fullgraph:  # never runs eagerly: say so instead, as torch.compile does
                raise Unsupported(
                    BreakReason.RECOMPILE_LIMIT,
                    f"{fn.__qualname__} hit the recompile limit ({limit}) under "
                    f"fullgraph=True. {failing}",
                    hint="raise EMBER_RECOMPILE_LIMIT, or keep the guarded values steady",
                )
            reason = (
                f"{fn.__qualname__} hit the recompile limit ({limit}); running it eagerly."
                f" {failing}"
            )
            warnings.warn(reason, stacklevel=3)
            cache.eager_reason = reason
            capture_stats.record_eager_frame()
            return fn(*args, **kwargs)
    try:
        wrap = None if opts.fullgraph else _Callees(opts)
        policy = DynamicPolicy(
            opts.dynamic is True, dict(cache.dynamic), counters=opts.dynamic is not False
        )
        with (
            torch_compat.capturing_outside_inference_mode(),
            torch_compat.capturing_outside_autocast(),
        ):
            entry = capture_call(fn, args, kwargs, opts.backend, wrap, policy)
    except Unsupported as exc:
        if opts.fullgraph:
            raise
        logs.log("graph_breaks", "running %s eagerly: %s", fn.__qualname__, exc)
        cache.eager_reason = exc
        capture_stats.record_break(exc)
        capture_stats.record_eager_frame()
        return fn(*args, **kwargs)
    installed = (fn.__globals__, entry.compiled_name) if entry.compiled_name else None
    cache.add(entry, installed)
    return entry.fn(*args, **kwargs)


def _automatic_dynamic(
    opts: CompileOptions, cache: frame_cache.FrameCache, args: tuple, kwargs: dict
) -> str:
    """Under dynamic=None, the argument sizes that differ from the last capture's become
    symbols in the next one; returns what changed, for the recompile message."""
    sizes = cache.entries[-1].sizes
    changes = sizes.changes(args, kwargs) if sizes is not None else []
    if not changes:
        return ""
    if opts.dynamic is not None:
        return f"; {', '.join(c.describe() for c in changes)} (dynamic={opts.dynamic})"
    said = []
    for change in changes:
        dims = cache.dynamic.get(change.source, frozenset())
        verdict = "already dynamic" if change.dim in dims else "the next graph makes it dynamic"
        cache.dynamic[change.source] = dims | {change.dim}
        said.append(f"{change.describe()}: {verdict}")
    return "; " + ", ".join(said)


_NOT_CAPTURED = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class _Callees:
    """How break code compiles the user functions it calls (`_compile_callee`), one per
    capture, held by its break code. It keeps the caches of the functions it wrapped
    alive as long as that code: a closure made anew on every call gets a new wrapper each
    time, and its code's cache (shared by all its closures) must outlive each wrapper, or
    every call would capture it again."""

    def __init__(self, opts: CompileOptions) -> None:
        self.opts = opts
        self.held: dict[types.CodeType, frame_cache.FrameCache] = {}

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        compiled = _compile_callee(fn, self.opts)
        cache = getattr(getattr(compiled, "__func__", compiled), "_ember_cache", None)
        if cache is not None and cache.code is not None:
            self.held[cache.code] = cache
        return compiled


def _compile_callee(fn: Callable[..., Any], opts: CompileOptions) -> Callable[..., Any]:
    """What break code calls for a user function it runs: the function compiled, but for a
    generator (or coroutine) function, which makes its generator without running a line: the
    generator then runs in CPython (a break ends the graph where one is made, see
    capture/frame.py `_BreakAtCreation`), as Dynamo runs generator frames."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None and code.co_flags & _NOT_CAPTURED:
        return fn
    return compile_function(fn, opts)


def compile_function(fn: Callable[..., Any], opts: CompileOptions) -> Callable[..., Any]:
    """Wrap a function (or bound method) so that its calls go through the guarded cache."""
    if isinstance(fn, types.MethodType):
        inner = compile_function(fn.__func__, opts)
        return types.MethodType(inner, fn.__self__)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"ember.compile expects a function or nn.Module, got {type(fn).__name__}")
    if is_disabled(fn):
        return fn
    original = getattr(fn, "_ember_original", fn)
    cache, find = _lookup(original, opts)
    defined = _definition(original)

    @functools.wraps(original)
    def compiled(*args: Any, **kwargs: Any) -> Any:
        nonlocal cache, find, defined
        if functorch_active():
            # inside an eager torch.func transform the tensors are its wrappers, which
            # neither the guards nor compiled code know: the function runs as written
            return original(*args, **kwargs)
        if _redefined(original, defined):
            # a new `__code__`, `__defaults__` or `__kwdefaults__` since the entries were
            # made (their guards and code hold the old ones): compile for the new definition
            if original.__code__ is defined[0]:
                cache.clear()
            cache, find = _lookup(original, opts)
            defined = _definition(original)
        grad_mode = torch.is_grad_enabled()
        try:
            run = find(args, kwargs)
            if run is not None:
                return run(*args, **kwargs)
            return _run_cached(original, opts, cache, args, kwargs)
        except BaseException:
            # An exception leaving a `with no_grad()` block restores the grad mode in eager;
            # break code that ran the raising call inside such a block has no handler to.
            torch_compat.set_grad_enabled(grad_mode)
            raise

    compiled._ember_original = original
    compiled._ember_options = opts
    compiled._ember_cache = cache
    return compiled


def _lookup(
    original: types.FunctionType, opts: CompileOptions
) -> tuple[frame_cache.FrameCache, Callable[[tuple, dict], Callable[..., Any] | None]]:
    """The cache of a function's code and the lookup of a call in it."""
    # owned here, shared weakly (by all closures of the code: see cache_for)
    cache = frame_cache.cache_for(original.__code__, opts, original.__closure__)
    if original.__closure__ and frame_cache.closures_share_entries(original.__code__):
        return cache, _closure_lookup(original, cache)

    def find(args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        entry = cache.lookup(args, kwargs)
        return None if entry is None else entry.fn

    return cache, find


def _definition(fn: types.FunctionType) -> tuple:
    return fn.__code__, fn.__defaults__, fn.__kwdefaults__


def _redefined(fn: types.FunctionType, defined: tuple) -> bool:
    return (
        fn.__code__ is not defined[0]
        or fn.__defaults__ is not defined[1]
        or fn.__kwdefaults__ is not defined[2]
    )


def _closure_lookup(
    original: types.FunctionType, cache: frame_cache.FrameCache
) -> Callable[[tuple, dict], Callable[..., Any] | None]:
    """The lookup of a closure's wrapper: its code's entries, captured for any closure of
    it, run bound to this one's cells and defaults (bound once per entry and wrapper)."""
    bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def bound_pair(entry: frame_cache.CacheEntry) -> tuple[Callable, Callable]:
        pair = bound.get(entry)
        if pair is None:
            pair = bound[entry] = frame_cache.bind_to_closure(entry, original)
        return pair

    def find(args: tuple, kwargs: dict) -> Callable[..., Any] | None:
        entry = cache.find(lambda entry: bound_pair(entry)[0](*args, **kwargs))
        return None if entry is None else bound_pair(entry)[1]

    return find


def _call_module(module: torch.nn.Module, /, *args: Any, **kwargs: Any) -> Any:
    """What a compiled module with forward hooks (or a `__call__` of its own) captures: the
    whole call."""
    return module(*args, **kwargs)


_WRAPPER_ATTRIBUTES = (
    "_orig_mod",
    "_compiled_forward",
    "_forward_function",
    "_compiled_call",
    "_runs_in_python",
    "_options",
    "_forwards",
)


class CompiledModule(torch.nn.Module):
    """The module `ember.compile(module)` returns: forward is compiled, everything else
    (attributes, parameters, state_dict, train()/eval()) is the original's."""

    def __init__(self, mod: torch.nn.Module, opts: CompileOptions) -> None:
        super().__init__()
        self._orig_mod = mod
        inner = wrapped_module(mod)  # DDP's or FSDP1's module, or an FSDP2 module itself
        self._forward_function = type(inner or mod).forward
        self._compiled_forward = compile_function(self._forward_function, opts)
        self._compiled_call = compile_function(_call_module, opts)
        self._runs_in_python = inner is not None
        self._options = opts
        self._forwards = {type(inner or mod): self._compiled_forward}

    def _compiled_forward_of(self, cls: type) -> Callable[..., Any]:
        """The compiled `cls.forward` (modules nested in FSDP1 wrappers have their own)."""
        if cls not in self._forwards:
            self._forwards[cls] = compile_function(cls.forward, self._options)
        return self._forwards[cls]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The original module's call: its hooks, and global ones, run once, inside. Hooks
        put on this wrapper itself run around it (global hooks then fire twice, as they do
        around torch.compile's wrapper)."""
        if (
            self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
        ):
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        if self._runs_in_python:  # DDP's forward, FSDP's hooks: in Python, around ours
            return call_with_compiled_forward(mod, self._compiled_forward_of, args, kwargs)
        if (
            has_hooks(mod)
            or type(mod).__call__ is not torch.nn.Module.__call__
            or "forward" in mod.__dict__
        ):
            # the hooks (the class's own __call__, a forward set on the object) are traced
            # with the call, as Dynamo does
            return self._compiled_call(mod, *args, **kwargs)
        if type(mod).forward is not self._forward_function:  # the class got another forward
            self._forward_function = type(mod).forward
            self._compiled_forward = compile_function(self._forward_function, self._options)
        return self._compiled_forward(mod, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WRAPPER_ATTRIBUTES or name.startswith("_") and name in self.__dict__:
            super().__setattr__(name, value)
        else:
            setattr(
                self._orig_mod, name, value
            ) if "_orig_mod" in self._modules else super().__setattr__(name, value)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> CompiledModule:
        self._orig_mod.train(mode)
        return self

    def __repr__(self) -> str:
        return f"CompiledModule({self._orig_mod!r})"


def compile(
    model: Any = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: Any = "ember",
    mode: str | None = None,
    options: dict | None = None,
    disable: bool = False,
) -> Any:
    """Compile a function or nn.Module; usable as a call, a bare decorator or a decorator
    with arguments, like `torch.compile`."""
    if model is None:
        return functools.partial(
            compile,
            fullgraph=fullgraph,
            dynamic=dynamic,
            backend=backend,
            mode=mode,
            options=options,
            disable=disable,
        )
    if disable:
        return model
    if not callable(model):
        raise TypeError(f"ember.compile expects a callable, got {type(model).__name__}")
    return _compile_callable(model, CompileOptions(fullgraph, dynamic, backend, mode, options))


def _compile_callable(fn: Callable[..., Any], opts: CompileOptions) -> Callable[..., Any]:
    """Any callable torch.compile takes: a module, a function or method, a
    `functools.partial` (its function compiled, its arguments kept), an object with a
    Python `__call__` (that method compiled for it), or a builtin such as `torch.sin`
    (a Python function calling it is compiled)."""
    if isinstance(fn, torch.nn.Module):
        return CompiledModule(fn, opts)
    if isinstance(fn, functools.partial):
        return functools.partial(_compile_callable(fn.func, opts), *fn.args, **fn.keywords)
    if isinstance(fn, (types.FunctionType, types.MethodType)):
        return compile_function(fn, opts)
    call = type(fn).__call__  # callable(fn) holds
    if isinstance(call, types.FunctionType):
        return compile_function(types.MethodType(call, fn), opts)

    def call_builtin(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call_builtin.__name__ = call_builtin.__qualname__ = getattr(fn, "__name__", "call_builtin")
    return compile_function(call_builtin, opts)


def reset() -> None:
    """Forget every cache entry (compiled functions recapture on their next call) and the
    counts of `stats()`."""
    frame_cache.reset()
    capture_stats.reset()
    clear_meta_cache()


def stats() -> dict[str, Any]:
    """What capture did since the last `reset()`: {"graphs", "graph_breaks",
    "break_reasons", "recompiles", "eager_frames"} (see `ember.capture.stats`)."""
    return capture_stats.current().as_dict()
