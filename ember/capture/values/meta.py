"""Running torch calls on meta tensors during capture.

Capture needs each op's result metadata (dtype, shape, strides, requires_grad) and PyTorch's
own errors, never data. Meta tensors give exactly that without FakeTensorMode, whose first use
imports all of torch._dynamo (seconds on this machine) and would make ember's first call as slow
as torch.compile's. The one thing a meta tensor forgets is its real device, so symbolic tensors
carry it separately and device arguments are redirected to meta while an op runs. The meta
tensors and the stand-in for torch._dynamo are shared with ember.aot (ember/meta.py).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.fx.experimental.symbolic_shapes  # noqa: F401  (see below)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ember import torch_compat
from ember.capture.shapes import SYM_TYPES
from ember.meta import META as _META
from ember.meta import hollow_tensor
from ember.torch_compat import python_dispatcher, without_dynamo

if TYPE_CHECKING:
    from ember.aot.symbolic_meta import SymbolicMeta

# Every `torch._check` in PyTorch's Python meta kernels imports symbolic_shapes on first use
# (60-100 ms here): imported with ember rather than inside a process's first capture, as
# torch.compile has it loaded by `import torch._dynamo` before its first call.

_DEVICE_MOVES = frozenset(["cpu", "cuda", "xpu", "mps"])


def _redirect(value: Any) -> Any:
    return _META if isinstance(value, torch.device) else value


def _device_arg(value: Any) -> torch.device | None:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str) and value.split(":")[0] in ("cpu", "cuda", "meta", "xpu", "mps"):
        return torch.device(value)
    return None


def run_on_meta(
    kind: str, target: Any, args: list, kwargs: dict, no_autograd: bool | None = None
) -> Any:
    """Call `target` (a function, or a method name for call_method) on meta examples; a call
    whose inputs match an earlier one in every piece of metadata is answered from the cache
    (see `_MetaCache`). Where the ops record no autograd whatever the grad mode (inference
    mode: `no_autograd`, by default the caller's, since the capture runs outside it), the
    examples are made under no_grad. A traced `inference_mode(False)` block under the
    caller's inference mode records autograd: tensor.py passes False there."""
    if no_autograd is None:
        no_autograd = torch_compat.callers_inference_mode()
    if no_autograd and torch.is_grad_enabled():
        with torch.no_grad():
            return run_on_meta(kind, target, args, kwargs, no_autograd=False)
    found = _Inputs()
    try:
        key = (kind, target, _key_of(args, found), _key_of(kwargs, found), _global_state())
        cache = _cache if found.env is None else _symbolic_cache(found.env)
        recipe = cache.get(key)
    except (_Uncacheable, TypeError):  # TypeError: an unhashable target or argument
        symbolic = _symbolic(args) or _symbolic(kwargs)
        return _run(kind, target, args, kwargs, symbolic, None)
    if recipe is not None:
        return _rebuild(recipe, found.tensors)
    versions = [t._version for t in found.tensors]
    result = _run(kind, target, args, kwargs, found.env is not None, found.env)
    cache.record(key, result, found.tensors, versions)
    return result


def _symbolic(tree: Any) -> bool:
    """Any SymInt (alone or in a tensor's sizes or strides) in an argument tree."""
    for leaf in tree_leaves(tree):
        if isinstance(leaf, SYM_TYPES):
            return True
        if isinstance(leaf, torch.Tensor) and any(isinstance(s, SYM_TYPES) for s in leaf.shape):
            return True
    return False


def _run(kind: str, target: Any, args: list, kwargs: dict, symbolic: bool, env: Any) -> Any:
    if symbolic:  # C++ meta kernels want concrete sizes; their Python decompositions take SymInts
        out = _function_shortcut(kind, target, args, kwargs) if env is not None else None
        if out is not None:
            return out
        mode = _Shortcuts(_symbolic_layouts(env)) if env is not None else None
        with python_dispatcher(), mode or contextlib.nullcontext():
            return without_dynamo(call_target, kind, target, args, kwargs)
    return without_dynamo(call_target, kind, target, args, kwargs)


def _function_shortcut(kind: str, target: Any, args: list, kwargs: dict) -> Any:
    """A composite torch function's symbolic result by a shape rule (symbolic_meta.py),
    where its ops would reach `_Shortcuts` only one by one: SDPA's, when the result needs
    no autograd history (else None: the meta kernel's result has that history)."""
    if kind != "call_function" or target is not torch_compat.scaled_dot_product_attention:
        return None
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (*args, *kwargs.values())
    ):
        return None
    from ember.aot import symbolic_meta

    return symbolic_meta.attention(tuple(args), kwargs)


class _Shortcuts(TorchDispatchMode):
    """The aten ops a torch call on symbolic sizes decomposes into, answered by ember.aot's
    exact layout shortcuts where they apply (symbolic_meta.py: layouts recalled from an
    earlier op of the capture, views of contiguous tensors, pointwise ops, products, layer
    norm), instead of torch's Python meta kernels and their sympy arithmetic."""

    def __init__(self, layouts: SymbolicMeta) -> None:
        super().__init__()
        self.layouts = layouts

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out, key = self.layouts.result(func, args, kwargs)
        if out is not None:
            return out
        out = func(*args, **kwargs)
        if key is not None:
            self.layouts.remember(key, args, out)
        return out


def call_target(kind: str, target: Any, args: list, kwargs: dict) -> Any:
    """Call `target` (a function, or a method name for call_method) with device arguments
    redirected to meta."""
    args = tree_map(_redirect, list(args))
    kwargs = {
        k: _META if k == "device" and v is not None else _redirect(v) for k, v in kwargs.items()
    }
    with torch.device(_META):
        if kind != "call_method":
            return target(*args, **kwargs)
        if target in _DEVICE_MOVES:
            return args[0]
        if target == "to":
            args = [args[0], *(_META if _device_arg(a) else a for a in args[1:])]
        return getattr(args[0], target)(*args[1:], **kwargs)


class _Uncacheable(Exception):
    """An argument whose metadata the cache key cannot describe exactly."""


class _Inputs:
    """What building a key found in the arguments: their tensors, and the ShapeEnv of the
    size symbols among their sizes (None when every size is a number)."""

    __slots__ = ("tensors", "env")

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.env: Any = None


_HASHED_AS_IS = frozenset(
    [
        int,
        bool,
        str,
        type(None),
        type(Ellipsis),
        torch.dtype,
        torch.device,
        torch.memory_format,
        torch.layout,
    ]
)


def _key_of(value: Any, found: _Inputs) -> Any:
    """Everything about an argument that a meta kernel can see: for a tensor its dtype,
    shape, strides, offset and autograd/view flags (never its identity); for a constant its
    type and value; a size symbol by its expression. Tensors found are appended to
    `found.tensors`. Raises _Uncacheable for anything else (tensor subclasses, other
    objects)."""
    kind = type(value)
    if kind is torch.Tensor:
        found.tensors.append(value)
        if value.layout is not torch.strided:
            raise _Uncacheable
        return (
            kind,
            value.dtype,
            _sizes(value.shape, found),
            _sizes(value.stride(), found),
            _size(value.storage_offset(), found),
            value.requires_grad,
            value.is_leaf,
            value._is_view(),
            value.is_conj(),
            value.is_neg(),
            value.is_inference(),
        )
    if kind in _HASHED_AS_IS:
        return (kind, value)
    if kind in SYM_TYPES:
        return _size(value, found)
    if kind is float:  # 0.0 == -0.0 and they hash alike: keep the sign apart
        return (kind, value, math.copysign(1.0, value))
    if kind is tuple or kind is list or kind is torch.Size:
        return (kind, tuple([_key_of(v, found) for v in value]))
    if kind is dict:
        return (kind, tuple([(k, _key_of(v, found)) for k, v in value.items()]))
    if kind is slice:
        return (kind, *(_key_of(v, found) for v in (value.start, value.stop, value.step)))
    raise _Uncacheable


def _sizes(values: Any, found: _Inputs) -> Any:
    """Sizes or strides for a key: as they are when all are numbers."""
    if all(type(v) is int for v in values):
        return values
    return tuple([_size(v, found) for v in values])


def _size(value: Any, found: _Inputs) -> Any:
    """A size for a key; a symbolic one by its expression, whose symbols are the capture's
    (`s0` of another capture is another symbol): such a key goes to the cache of its
    ShapeEnv."""
    if type(value) is int:
        return value
    if isinstance(value, SYM_TYPES):
        found.env = value.node.shape_env
        return (type(value), value.node.expr)
    raise _Uncacheable


def _global_state() -> tuple:
    """Process state a meta kernel reads besides its arguments (result requires_grad, the
    dtype of Python floats and factory results, inference tensors)."""
    return (
        torch.is_grad_enabled(),
        torch.get_default_dtype(),
        torch.is_inference_mode_enabled(),
        torch.are_deterministic_algorithms_enabled(),
    )


_CONSTANT_RESULTS = frozenset([int, bool, float, str, torch.Size, torch.dtype, torch.device])
_NEVER = ("never",)


def _tensor_facts(t: torch.Tensor) -> tuple:
    """The metadata a rebuilt result must share with the kernel's own result (symbolic
    sizes as expressions: comparing SymInts themselves would record guards)."""
    return (
        type(t),
        t.layout,
        t.dtype,
        _expressions(t.shape),
        _expressions(t.stride()),
        _expressions([t.storage_offset(), t.untyped_storage().nbytes()]),
        t.requires_grad,
        t.is_leaf,
        t._is_view(),
        t.is_conj(),
        t.is_neg(),
        t.is_inference(),
        t._is_zerotensor(),
    )


def _expressions(sizes: Any) -> tuple:
    return tuple([s.node.expr if isinstance(s, SYM_TYPES) else s for s in sizes])


def _rebuild(recipe: tuple, inputs: list[torch.Tensor]) -> Any:
    if recipe[0] == "constant":
        return recipe[1]
    _, symbolic, dtype, shape, stride, base = recipe
    with python_dispatcher() if symbolic else contextlib.nullcontext():
        if base is None:
            return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
        if base[0] == "input":
            return inputs[base[1]].as_strided(shape, stride, base[2])
        if base[0] == "hollow":
            return hollow_tensor(shape, stride, dtype, base[1])
        if base[4]:
            fresh = hollow_tensor(base[1], base[2], dtype)
        else:
            fresh = torch.empty_strided(base[1], base[2], dtype=dtype, device=_META)
        return fresh.as_strided(shape, stride, base[3])


def _hollow(t: torch.Tensor) -> bool:
    """A tensor made by a layout shortcut (ember.meta.hollow_tensor): its layout on a
    storage of no bytes."""
    return t.untyped_storage().nbytes() == 0 and t.numel() != 0


class _MetaCache:
    """Results of meta kernels by the metadata of their inputs.

    A capture runs the same ops on the same shapes many times (each transformer layer
    repeats the previous one), and PyTorch's Python meta kernels cost 0.2-5 ms a call
    (layer_norm, addmm and SDPA most; with size symbols ten times that). A kernel's result
    metadata is a function of its inputs' metadata, its constant arguments and a little
    global state, all of which are in the key. With size symbols, the sizes are their
    expressions and the cache is the capture's own: what the kernel's first run added to the
    ShapeEnv (a guard `s0 == s1`) is still there for a call with the same expressions, and a
    result valid under the fewer facts known then stays valid.

    Kept are results without autograd history that a recipe rebuilds exactly (checked on
    the kernel's own result before it is kept): a fresh tensor (`empty_strided`), a view of
    one (and `as_strided`), a view of an input (`as_strided` of the calling input: the same
    base, so in-place writes reach it as they would), or an immutable constant. An input
    itself (in-place results), an alias that is no view (detach), tuples and calls that
    bumped an input's version always run the kernel.
    """

    LIMIT = 20_000

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple] = {}

    def get(self, key: tuple) -> tuple | None:
        recipe = self._entries.get(key)
        return None if recipe is _NEVER else recipe

    def record(
        self, key: tuple, result: Any, tensors: list[torch.Tensor], versions: list[int]
    ) -> None:
        if len(self._entries) >= self.LIMIT:
            self._entries.clear()
        self._entries[key] = self._recipe(result, tensors, versions)

    @staticmethod
    def _recipe(result: Any, tensors: list[torch.Tensor], versions: list[int]) -> tuple:
        if any(t._version != v for t, v in zip(tensors, versions, strict=True)):
            return _NEVER  # the call wrote to an input
        if type(result) in _CONSTANT_RESULTS:
            return ("constant", result)
        if type(result) is not torch.Tensor or result.requires_grad:
            return _NEVER
        storage = result.untyped_storage()._cdata
        shared = [i for i, t in enumerate(tensors) if t.untyped_storage()._cdata == storage]
        if shared and (not result._is_view() or any(result is t for t in tensors)):
            return _NEVER  # an input itself, or an alias that is no view (detach)
        base = None
        if shared:  # a view of an input: rebuilt on the input of the call that hits
            base = ("input", shared[0], result.storage_offset())
        elif result._is_view():  # of a fresh tensor the kernel made (a transposed result)
            fresh = result._base
            base = ("fresh", fresh.shape, fresh.stride(), result.storage_offset(), _hollow(fresh))
        elif _hollow(result):
            base = ("hollow", result.storage_offset())
        layout = [*result.shape, *result.stride(), result.storage_offset()]
        if base is not None and base[0] == "fresh":
            layout += [*base[1], *base[2]]
        symbolic = not all(type(s) is int for s in layout)
        recipe = ("tensor", symbolic, result.dtype, result.shape, result.stride(), base)
        rebuilt = _rebuild(recipe, tensors)
        if _tensor_facts(rebuilt) != _tensor_facts(result):
            return _NEVER
        if shared and rebuilt._base is not result._base:
            return _NEVER
        return recipe


_cache = _MetaCache()
_symbolic_caches: weakref.WeakKeyDictionary[Any, _MetaCache] = weakref.WeakKeyDictionary()
"""Results of calls with size symbols, by the ShapeEnv of the capture that made them: the
symbols' names mean something only there."""


def _symbolic_cache(env: Any) -> _MetaCache:
    cache = _symbolic_caches.get(env)
    if cache is None:
        cache = _symbolic_caches[env] = _MetaCache()
    return cache


_layouts: weakref.WeakKeyDictionary[Any, SymbolicMeta] = weakref.WeakKeyDictionary()


def _symbolic_layouts(env: Any) -> SymbolicMeta:
    from ember.aot.symbolic_meta import SymbolicMeta  # ember.aot loads on first use

    table = _layouts.get(env)
    if table is None:
        table = _layouts[env] = SymbolicMeta()
    return table


def clear_cache() -> None:
    """Forget every recorded result (`ember.reset()`): the keys hold the functions called."""
    _cache._entries.clear()
    _symbolic_caches.clear()
    _layouts.clear()


def result_device(
    kind: str, target: Any, args: list, kwargs: dict, tensor_devices: list[torch.device]
) -> torch.device:
    """The real device an op's result lives on (what eager would report)."""
    if kind == "call_method" and target in _DEVICE_MOVES:
        index = args[1] if len(args) > 1 and isinstance(args[1], int) else None
        return torch.device(target, index) if target != "cpu" else torch.device("cpu")
    candidates = [kwargs.get("device")]
    if kind == "call_method" and target == "to":
        candidates += list(args[1:])
    for candidate in candidates:
        device = _device_arg(candidate)
        if device is not None:
            return device
    if tensor_devices:
        return tensor_devices[0]
    return torch.get_default_device()


def is_data_dependent_error(exc: BaseException) -> bool:
    """Meta kernels refuse ops whose output shape depends on values (nonzero, unique, ...)."""
    text = str(exc)
    return (
        isinstance(exc, NotImplementedError)
        and ("meta" in text.lower())
        or ("cannot be called on meta tensors" in text or "without output_size" in text)
    )
