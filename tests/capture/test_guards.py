"""Guards, counted with a counting backend: new tensor data never recompiles; each kind of
assumption recompiles exactly once when it changes and not at all when it holds; the guard
function's source is readable and names what it checks."""

from __future__ import annotations

import torch
from torch import nn

import ember
from ember.capture import cache as frame_cache
from ember.testing import CompileCounter, assert_same

INT_K = 2
FLOAT_K = 0.5
STR_K = "relu"
BOOL_K = True
TENSOR_G = torch.ones(4)


def activation(x):
    return x.relu()


def compiled_with_counter(fn, **options):
    counter = CompileCounter()
    return ember.compile(fn, backend=counter, fullgraph=True, **options), counter


def run_both(fn, compiled, *args):
    assert_same(compiled(*args), fn(*args))


def test_new_tensor_data_never_recompiles():
    def f(x, y):
        return (x @ y).relu() + 1

    compiled, counter = compiled_with_counter(f)
    for _ in range(5):
        run_both(f, compiled, torch.randn(3, 4), torch.randn(4, 2))
    assert counter.frame_count == 1


def _recompiles_once(fn, same_calls, changed_calls):
    """Calls in `same_calls` share one entry; the first of `changed_calls` adds exactly one
    more, after which the changed assumption is cached too."""
    compiled, counter = compiled_with_counter(fn)
    for args in same_calls:
        run_both(fn, compiled, *args)
    assert counter.frame_count == 1, "an unchanged assumption recompiled"
    for args in changed_calls:
        run_both(fn, compiled, *args)
    assert counter.frame_count == 2, f"expected one recompile, saw {counter.frame_count - 1}"
    for args in same_calls[:1] + changed_calls[:1]:
        run_both(fn, compiled, *args)  # both entries stay valid
    assert counter.frame_count == 2


def test_recompile_on_dtype():
    def f(x):
        return x * 2

    _recompiles_once(
        f,
        [(torch.randn(4),), (torch.randn(4),)],
        [(torch.randn(4, dtype=torch.float64),), (torch.randn(4, dtype=torch.float64),)],
    )


def test_recompile_on_shape():
    def f(x):
        return x.sum(0) * x.shape[0]

    _recompiles_once(f, [(torch.randn(3, 4),)] * 2, [(torch.randn(5, 4),), (torch.randn(5, 4),)])


def test_recompile_on_stride_of_transposed_input():
    def f(x):
        return x.view(-1) if x.is_contiguous() else x.reshape(-1) * 2

    base = torch.randn(4, 4)
    _recompiles_once(
        f, [(torch.randn(4, 4),), (base.clone(),)], [(base.t(),), (torch.randn(4, 4).t(),)]
    )


def test_recompile_on_requires_grad():
    def f(x):
        return x * 3

    _recompiles_once(
        f,
        [(torch.randn(4),), (torch.randn(4),)],
        [(torch.randn(4, requires_grad=True),), (torch.randn(4, requires_grad=True),)],
    )


def test_recompile_on_conjugate_view_and_failure_names_the_condition():
    """A tensor's match is one C++ check (dispatch keys included, so a conjugate view is not
    taken for its base); a miss is still reported as the Python condition that failed."""

    def f(x):
        return x * 2 + 1

    x = torch.randn(4, dtype=torch.complex64)
    _recompiles_once(f, [(x,), (x.clone(),)], [(x.conj(),), (torch.randn(4).to(x.dtype).conj(),)])
    compiled, _ = compiled_with_counter(f)
    compiled(torch.randn(3))
    entry = frame_cache.cache_for(f.__code__, compiled._ember_options).entries[0]
    assert "x.shape == (3,)" in entry.guard.conditions
    assert entry.guard.first_failure(torch.randn(5)) == "x.shape == (3,)"
    assert entry.guard.first_failure(torch.randn(3)) == "(all guards hold)"


def _with_global(name, values, fn):
    """Set a module global to each value in turn, calling the compiled fn each time."""
    compiled, counter = compiled_with_counter(fn)
    saved = globals()[name]
    counts = []
    try:
        for value in values:
            globals()[name] = value
            x = torch.randn(4)
            run_both(fn, compiled, x)
            counts.append(counter.frame_count)
    finally:
        globals()[name] = saved
    return counts


def test_recompile_on_baked_global_int():
    def f(x):
        return x * INT_K

    assert _with_global("INT_K", [2, 2, 3, 3, 2], f) == [1, 1, 2, 2, 2]


def test_recompile_on_baked_global_float():
    def f(x):
        return x + FLOAT_K

    assert _with_global("FLOAT_K", [0.5, 0.5, 1.5, 1.5], f) == [1, 1, 2, 2]


def test_recompile_on_baked_global_str():
    def f(x):
        return getattr(torch, STR_K)(x)

    assert _with_global("STR_K", ["relu", "relu", "tanh", "tanh"], f) == [1, 1, 2, 2]


def test_recompile_on_baked_global_bool():
    def f(x):
        return x + 1 if BOOL_K else x - 1

    assert _with_global("BOOL_K", [True, True, False, False], f) == [1, 1, 2, 2]


def test_int_global_does_not_match_equal_float_or_bool():
    def f(x):
        return x * INT_K

    # 1 == 1.0 == True, but each type is its own assumption (true division, dtype promotion)
    assert _with_global("INT_K", [1, 1.0, True, 1], f) == [1, 2, 3, 3]


def test_tensor_global_is_an_input_not_a_constant():
    def f(x):
        return x + TENSOR_G

    counts = _with_global("TENSOR_G", [torch.ones(4), torch.zeros(4), torch.randn(4)], f)
    assert counts == [1, 1, 1]


def test_recompile_on_swapped_global_function():
    def f(x):
        return activation(x) + 1

    assert _with_global("activation", [activation, activation, torch.sigmoid], f) == [1, 1, 2]


def test_recompile_on_closure_constant():
    def make(k):
        def f(x):
            return x * k

        return f

    f2, f3 = make(2), make(3)
    counter = CompileCounter()
    c2 = ember.compile(f2, backend=counter, fullgraph=True)
    c3 = ember.compile(f3, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4)
        run_both(f2, c2, x)
    assert counter.frame_count == 1
    for _ in range(2):
        x = torch.randn(4)
        run_both(f3, c3, x)  # same code object, another closure value
    assert counter.frame_count == 2


def test_recompile_on_closure_cell_rebinding():
    k = 2

    def f(x):
        return x * k

    compiled, counter = compiled_with_counter(f)
    run_both(f, compiled, torch.randn(4))
    run_both(f, compiled, torch.randn(4))
    k = 5
    run_both(f, compiled, torch.randn(4))
    run_both(f, compiled, torch.randn(4))
    assert counter.frame_count == 2
    assert k == 5


def test_recompile_on_module_training_flag():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * (2 if self.training else 3)

    mod = M()
    counter = CompileCounter()
    compiled = ember.compile(mod, backend=counter, fullgraph=True)
    x = torch.randn(2, 4)
    assert_same(compiled(x), mod(x))
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 1
    compiled.eval()
    assert not mod.training
    assert_same(compiled(x), mod(x))
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 2
    compiled.train()
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 2


def test_recompile_on_dropout_submodule_training_flag():
    mod = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    counter = CompileCounter()
    compiled = ember.compile(mod, backend=counter, fullgraph=True)
    mod.eval()
    x = torch.randn(2, 4)
    assert_same(compiled(x), mod(x))
    assert counter.frame_count == 1
    mod[1].train()  # only the child changes
    torch.manual_seed(1)
    got = compiled(x)
    torch.manual_seed(1)
    assert_same(got, mod(x))
    assert counter.frame_count == 2


def test_recompile_on_container_length():
    def f(xs):
        return sum(xs)

    _recompiles_once(
        f,
        [([torch.randn(2), torch.randn(2)],), ([torch.randn(2), torch.randn(2)],)],
        [([torch.randn(2), torch.randn(2), torch.randn(2)],)] * 2,
    )


def test_recompile_on_tuple_length_and_dict_keys():
    def f(t, d):
        return t[0] * len(t) + sum(d.values())

    def r():
        return torch.randn(2)

    _recompiles_once(
        f,
        [((r(), r()), {"a": r()}), ((r(), r()), {"a": r()})],
        [((r(), r(), r()), {"a": r()}), ((r(), r(), r()), {"a": r()})],
    )
    _recompiles_once(
        f,
        [((r(),), {"a": r()}), ((r(),), {"a": r()})],
        [((r(),), {"a": r(), "b": r()}), ((r(),), {"a": r(), "b": r()})],
    )


def test_recompile_on_grad_mode():
    def f(x):
        return x * 2

    compiled, counter = compiled_with_counter(f)
    w = torch.randn(4, requires_grad=True)
    for _ in range(2):
        assert compiled(w).requires_grad
    with torch.no_grad():
        for _ in range(2):
            assert not compiled(w).requires_grad
    assert compiled(w).requires_grad
    assert counter.frame_count == 2


def test_recompile_on_none_vs_tensor_argument():
    def f(x, mask=None):
        return x * 2 if mask is None else x * mask

    _recompiles_once(
        f,
        [(torch.randn(4), None), (torch.randn(4),)],
        [(torch.randn(4), torch.randn(4)), (torch.randn(4), torch.randn(4))],
    )


def test_recompile_on_argument_type():
    def f(x, k):
        return x * k

    _recompiles_once(f, [(torch.randn(4), 2), (torch.randn(4), 2)], [(torch.randn(4), 2.0)] * 2)


def test_recompile_on_object_attribute():
    class Cfg:
        def __init__(self, scale):
            self.scale = scale

    def f(x, cfg):
        return x * cfg.scale

    _recompiles_once(
        f,
        [(torch.randn(4), Cfg(2)), (torch.randn(4), Cfg(2))],
        [(torch.randn(4), Cfg(3)), (torch.randn(4), Cfg(3))],
    )


def test_aliased_inputs_recompile_when_aliasing_changes():
    def f(x, y):
        x.add_(1)
        return x + y

    for backend in ("eager", "aot_eager"):
        ember.reset()
        counter = CompileCounter()
        compiled = ember.compile(f, backend=_counting(backend, counter), fullgraph=True)
        for _ in range(2):  # distinct tensors
            a, b = torch.randn(4), torch.randn(4)
            assert_same(compiled(a.clone(), b.clone()), f(a.clone(), b.clone()))
        assert counter.frame_count == 1
        for _ in range(2):  # one tensor passed twice: another entry, eager's result
            same = torch.randn(4)
            same_ref = same.clone()
            assert_same(compiled(same, same), f(same_ref, same_ref))
            assert_same(same, same_ref)
        assert counter.frame_count == 2


def _counting(backend, counter):
    from ember.backends import lookup

    def compile_graph(gm, example_inputs):
        counter(gm, example_inputs)
        return lookup(backend)(gm, example_inputs)

    return compile_graph


def test_guard_source_is_readable():
    def f(x, k=3):
        return x * k + INT_K

    compiled, _ = compiled_with_counter(f)
    compiled(torch.randn(2, 3))
    (entry,) = frame_cache.cache_for(f.__code__).entries
    text = entry.guard.source_text
    assert text.startswith("def ___guard(x, k)")
    assert "x.dtype is" in text
    assert "x.shape == (2, 3)" in text
    assert "x.stride() == (3, 1)" in text
    assert "x.requires_grad is False" in text
    assert "k == 3" in text
    assert "___G['INT_K']" in text and "== 2" in text
    assert "is_grad_enabled" in text
    compile(text, "<guard>", "exec")  # it is plain Python


def test_first_failure_names_the_failing_guard():
    def f(x):
        return x * INT_K

    compiled, _ = compiled_with_counter(f)
    compiled(torch.randn(2))
    (entry,) = frame_cache.cache_for(f.__code__).entries
    assert entry.guard.first_failure(torch.randn(2)) == "(all guards hold)"
    assert "x.shape == (2,)" in entry.guard.first_failure(torch.randn(3))
    assert "dtype" in entry.guard.first_failure(torch.randn(2).double())


INF_K = float("inf")
NAN_K = float("nan")
SIZE_K = torch.Size([2, 2])
COMPLEX_K = 1 + 2j


def test_constants_whose_repr_is_not_python_still_hit_the_cache():
    def f(x):
        return (
            x.clamp(max=INF_K)
            + torch.nan_to_num(x * NAN_K)
            + x.view(SIZE_K).sum() * (COMPLEX_K.real)
        )

    compiled, counter = compiled_with_counter(f)
    for _ in range(3):
        x = torch.randn(4)
        run_both(f, compiled, x)
    assert counter.frame_count == 1
    (entry,) = frame_cache.cache_for(f.__code__).entries
    assert entry.guard.check(torch.randn(4))


def test_class_getattr_fallback_is_inlined():
    class Config:
        def __init__(self):
            self.known = 2

        def __getattr__(self, name):
            return 10 if name.startswith("dyn_") else 0

    def f(x, cfg):
        return x * cfg.known + cfg.dyn_scale + hasattr(cfg, "anything")

    compiled, counter = compiled_with_counter(f)
    for _ in range(2):
        x = torch.randn(4)
        run_both(f, compiled, x, Config())
    assert counter.frame_count == 1


def test_recompile_on_default_dtype():
    def f(x):
        scale = 2 if torch.get_default_dtype() is torch.float64 else 3
        return x * scale + torch.zeros(4)

    compiled, counter = compiled_with_counter(f)
    x = torch.randn(4, dtype=torch.float32)
    run_both(f, compiled, x)
    saved = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        run_both(f, compiled, x)
    finally:
        torch.set_default_dtype(saved)
    run_both(f, compiled, x)
    assert counter.frame_count == 2


class Knobs:
    SCALE = 2

    @classmethod
    def scaled(cls, x):
        return x * cls.SCALE


def test_recompile_on_class_attribute():
    def f(x):
        return x + Knobs.SCALE + Knobs.scaled(x)

    compiled, counter = compiled_with_counter(f)
    try:
        for value in (2, 2, 5, 5):
            Knobs.SCALE = value
            run_both(f, compiled, torch.randn(4))
    finally:
        Knobs.SCALE = 2
    assert counter.frame_count == 2


def test_recompile_on_class_attribute_read_through_new_object():
    def f(x):
        knobs = Knobs()
        return x * knobs.SCALE

    compiled, counter = compiled_with_counter(f)
    try:
        for value in (2, 2, 7):
            Knobs.SCALE = value
            run_both(f, compiled, torch.randn(4))
    finally:
        Knobs.SCALE = 2
    assert counter.frame_count == 2


def test_device_and_dtype_arguments_hit_the_cache():
    def f(x, device, dtype):
        return x.to(device=device, dtype=dtype) * 2

    compiled, counter = compiled_with_counter(f)
    for _ in range(3):  # torch.device objects are not singletons: equal ones must match
        run_both(f, compiled, torch.randn(4), torch.device("cpu"), torch.float64)
    assert counter.frame_count == 1
    run_both(f, compiled, torch.randn(4), torch.device("cpu"), torch.float32)
    assert counter.frame_count == 2


class Ops:
    def __init__(self):
        self.k = 2.0

    def double(self, x):
        return x * self.k

    def negate(self, x):
        return -x


def test_recompile_on_another_method_of_the_same_object():
    def f(fn, x):
        return fn(x) + 1

    ops = Ops()
    compiled, counter = compiled_with_counter(f)
    for method in (ops.double, ops.double, ops.negate, ops.negate):
        x = torch.randn(4)
        assert_same(compiled(method, x), f(method, x))
    assert counter.frame_count == 2


def test_recompile_on_partial_with_other_arguments():
    import functools

    def add(*ts, scale=1.0):
        return sum(ts) * scale

    def f(fn, x):
        return fn(x)

    compiled, counter = compiled_with_counter(f)
    y = torch.randn(4)
    for p in (
        functools.partial(add, y),
        functools.partial(add, y),
        functools.partial(add, y, y),
        functools.partial(add, y, scale=3.0),
    ):
        x = torch.randn(4)
        assert_same(compiled(p, x), f(p, x))
    assert counter.frame_count == 3


def test_recompile_when_a_missing_attribute_appears():
    class Cfg:
        pass

    def f(x, cfg):
        if hasattr(cfg, "scale"):
            x = x * cfg.scale
        return x + getattr(cfg, "shift", 0.0)

    compiled, counter = compiled_with_counter(f)
    cfg = Cfg()
    for _ in range(2):
        run_both(f, compiled, torch.randn(4), cfg)
    assert counter.frame_count == 1
    cfg.scale = 3.0
    run_both(f, compiled, torch.randn(4), cfg)
    cfg.shift = 1.0
    run_both(f, compiled, torch.randn(4), cfg)
    assert counter.frame_count == 3


SUPPORTED = {"relu", "tanh"}


def test_global_set_membership_is_guarded():
    def f(x, name):
        if name in SUPPORTED:
            return getattr(torch, name)(x)
        return x * 2

    compiled, counter = compiled_with_counter(f)
    for _ in range(2):
        run_both(f, compiled, torch.randn(4), "tanh")
    assert counter.frame_count == 1
    SUPPORTED.discard("tanh")
    try:
        run_both(f, compiled, torch.randn(4), "tanh")  # the set changed: not the old branch
    finally:
        SUPPORTED.add("tanh")
    assert counter.frame_count == 2


def _activations(x):
    return torch.nn.functional.gelu(x) + torch.sigmoid(x)


def test_a_torch_function_patched_after_the_capture_is_seen(monkeypatch):
    """Libraries swap torch functions (F.scaled_dot_product_attention for another kernel):
    the functions the trace called are guarded by identity, as Dynamo's are."""
    compiled = ember.compile(_activations, backend="eager")
    x = torch.randn(3)
    assert_same(compiled(x), _activations(x))
    monkeypatch.setattr(torch.nn.functional, "gelu", lambda x, approximate="none": x * 100)
    assert_same(compiled(x), _activations(x))
    monkeypatch.setattr(torch, "sigmoid", lambda x: x * 0)
    assert_same(compiled(x), _activations(x))


def test_a_property_staticmethod_or_classmethod_replaced_on_the_class_is_seen():
    class A:
        def __init__(self):
            self._v = 2.0

        @property
        def v(self):
            return self._v

        @staticmethod
        def s(x):
            return x + 1

        @classmethod
        def c(cls):
            return 3.0

    def f(x, a):
        return x * a.v + a.s(x) + a.c()

    compiled = ember.compile(f, backend="eager")
    a, x = A(), torch.randn(2)
    assert_same(compiled(x, a), f(x, a))
    A.v = property(lambda self: -self._v)
    assert_same(compiled(x, a), f(x, a))
    A.s = staticmethod(lambda x: x - 10)
    assert_same(compiled(x, a), f(x, a))
    A.c = classmethod(lambda cls: 100.0)
    assert_same(compiled(x, a), f(x, a))


def test_a_forward_replaced_on_the_class_or_set_on_the_module_is_seen():
    class M(nn.Module):
        def forward(self, x):
            return x + 1

    m, x = M(), torch.randn(2)
    compiled = ember.compile(m, backend="eager")
    assert_same(compiled(x), m(x))
    M.forward = lambda self, x: x * 100
    assert_same(compiled(x), m(x))
    m.forward = lambda x: x * 7
    assert_same(compiled(x), m(x))


def _scaled(x, k=2, *, j=3):
    return x * k + j


def _shifted(x, k=2, *, j=3):
    return x - k - j


def test_a_function_given_new_defaults_or_code_is_compiled_again(monkeypatch):
    compiled = ember.compile(_scaled, backend="eager")
    x = torch.randn(2)
    assert_same(compiled(x), _scaled(x))
    monkeypatch.setattr(_scaled, "__defaults__", (5,))
    assert_same(compiled(x), _scaled(x))
    monkeypatch.setattr(_scaled, "__kwdefaults__", {"j": 7})
    assert_same(compiled(x), _scaled(x))
    monkeypatch.setattr(_scaled, "__code__", _shifted.__code__)
    assert_same(compiled(x), _scaled(x))


def test_a_method_replaced_on_the_class_or_shadowed_in_a_subclass_is_seen():
    """Dynamo reuses its graph for both (a wrong answer there too): the method a trace ran
    is pinned as its class has it (`cls.name`, so a replacement anywhere in the MRO shows)."""

    class Base:
        def m(self, x):
            return x + 1

    class Derived(Base):
        pass

    def f(x, obj):
        return obj.m(x) * 2

    compiled = ember.compile(f, backend="eager")
    obj, x = Derived(), torch.randn(2)
    assert_same(compiled(x, obj), f(x, obj))
    Base.m = lambda self, x: x - 5
    assert_same(compiled(x, obj), f(x, obj))
    Derived.m = lambda self, x: x * 10
    assert_same(compiled(x, obj), f(x, obj))


def _relu_and_sigmoid(x):
    return x.relu() + x.sigmoid()


def test_a_tensor_method_patched_after_the_capture_is_seen(monkeypatch):
    compiled = ember.compile(_relu_and_sigmoid, backend="aot_eager")  # aten ops: no method
    x = torch.randn(3)
    assert_same(compiled(x), _relu_and_sigmoid(x))
    monkeypatch.setattr(torch.Tensor, "relu", lambda self: self * 100)
    assert_same(compiled(x), _relu_and_sigmoid(x))


def test_module_tuple_of_constants_is_one_check():
    """A conv's stride/padding/kernel size: one CONSTANT_TUPLE condition each (the same
    tuple object, else an equal tuple with items of the same types). An equal new tuple
    reuses the entry; another value recompiles once; float items (which conv2d refuses)
    are not taken for the ints they equal."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, stride=(2, 2), padding=(1, 1))
    compiled, counter = compiled_with_counter(conv)
    x = torch.randn(1, 3, 9, 9)
    run_both(conv, compiled, x)
    (entry,) = frame_cache.cache_for(type(conv).forward.__code__).entries
    text = entry.guard.source_text
    assert text.count(" is ___tup") >= 3, text  # stride, padding, dilation
    conv.stride = (2, 2)  # a new tuple object, equal
    run_both(conv, compiled, x)
    assert counter.frame_count == 1
    conv.stride = (1, 2)
    run_both(conv, compiled, x)
    assert counter.frame_count == 2
    conv.stride = (1.0, 2.0)  # conv2d refuses float strides: the capture must see them
    for run in (conv, compiled):  # (fullgraph=True: the failed op is an Unsupported)
        try:
            run(x)
        except (TypeError, ember.Unsupported):
            continue
        raise AssertionError(f"{run} took float strides")
