"""Probe round of session 17 (issue 12): modules made inside a compiled forward, cycles
alive at a break, then new probes. Each program is compared with eager (values, types,
identities, outside state, printed text) and, where Dynamo runs it, with Dynamo's graph and
break counts on the same function (fidelity_harness)."""

from __future__ import annotations

import torch
from fidelity_harness import check, dynamo_counts, leaf_tensors, tensors, train_check
from torch import nn

import ember

LOG: list = []


def _reset() -> None:
    LOG.clear()
    torch.manual_seed(0)


def _log() -> list:
    return list(LOG)


# --- modules with buffers, or of the user's classes, made in forward ------------------------


class Buffered(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        LOG.append(("init", n))
        self.register_buffer("b", torch.arange(float(n)))
        self.register_buffer("scratch", torch.zeros(n), persistent=False)
        self.scale = 2
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(x * self.scale + self.b)


def p_buffered_module_made_in_forward(x):
    y = x.sin()
    m = Buffered()
    return m(y) * 2


def p_buffered_module_escapes(x):
    m = Buffered(4)
    return m(x), m, m.act, m.b


def test_module_with_buffers_made_in_forward_is_captured():
    """Was a break at `Buffered()` (a module made with buffers was refused: 2 graphs, 1
    break); Dynamo captures it (1/0). Its constructor is traced: the buffers are tensors of
    the graph, made on each call, and `__init__`'s own side effects happen on each call."""
    counts = check(p_buffered_module_made_in_forward, tensors((3, 4)), state=_log, reset=_reset)
    assert (counts.graphs, counts.breaks) == (1, 0)


def test_module_made_in_forward_escapes_as_a_real_module():
    """Returned, the module is made again from its instance dict: the result compares equal
    to eager's attribute by attribute (`vars`, recursively: training, every table, the
    buffers, the non-persistent set, the hook tables), and its child and buffer are the
    very objects returned beside it."""
    counts = check(p_buffered_module_escapes, tensors((3, 4)), state=_log, reset=_reset)
    assert (counts.graphs, counts.breaks) == (1, 0)
    out = ember.compile(p_buffered_module_escapes)(torch.randn(3, 4))
    assert type(out[1]) is Buffered and out[1].act is out[2] and out[1].b is out[3]
    assert list(out[1].state_dict()) == ["b"] and out[1]._non_persistent_buffers_set == {"scratch"}


def p_class_statement_with_buffer(x):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.arange(4.0))

        def forward(self, x):
            return x + self.b

    return M()(x) * 2


def test_class_statement_module_with_buffer_breaks_once():
    """Was 1 graph / 2 breaks (the class statement, then `M()`); Dynamo 1/1."""
    counts = check(p_class_statement_with_buffer, tensors((3, 4)))
    assert (counts.graphs, counts.breaks) == (1, 1)


OUTSIDE = nn.Linear(4, 4)


class Wrap(nn.Module):
    def __init__(self, inner, scale):
        super().__init__()
        self.inner = inner
        self.scale = scale

    def forward(self, x):
        return self.inner(x) * self.scale


class FromInput(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.register_buffer("t", t * 2)

    def forward(self, x):
        return x + self.t


def p_wrapper_of_an_outside_module(x):
    w = Wrap(OUTSIDE, x.shape[0])
    return w(x), w.inner is OUTSIDE


def p_buffer_from_an_input(x):
    m = FromInput(x[0])
    return m(x), m.t


def test_module_made_from_run_time_values():
    """A wrapper around a module of the model, sized by the input, and a buffer computed
    from the input: each was a break ("creating module ... from values known only at run
    time"); Dynamo 1/0. The constructor is traced over those values."""
    for program in (p_wrapper_of_an_outside_module, p_buffer_from_an_input):
        counts = check(program, tensors((3, 4)))
        assert (counts.graphs, counts.breaks) == (1, 0), program.__name__


class Counted(nn.Module):
    def __init__(self, k):
        super().__init__()
        print("init", k)
        LOG.append(k)
        self.k = k

    def forward(self, x):
        return x * self.k


def p_user_module_init_side_effects(x):
    return Counted(3)(x) + Counted(4)(x)


def test_user_module_init_runs_on_every_call():
    """Wrong answer before: a module class of the user's without parameters was built for
    real while capturing, so its `__init__` appended (and printed) once, at capture, and
    never on later calls. Now its constructor is traced: the appends are replayed on each
    call and the prints are breaks (as under Dynamo)."""
    check(p_user_module_init_side_effects, tensors((3, 4)), state=_log, reset=_reset)


def p_module_list_of_built_modules(x):
    ms = nn.ModuleList([Buffered(), Buffered(2 + 2)])
    for m in ms:
        x = m(x)
    return x, len(ms), list(ms._modules)


def test_module_list_of_modules_made_in_forward():
    """Wrong answer before (once such modules were traced): ModuleList's `self += modules`
    ran `__add__` (a new list) instead of `__iadd__`, so the container stayed empty and the
    loop ran no block. An augmented assignment on an object now tries its `__iadd__` first,
    as CPython does."""
    counts = check(p_module_list_of_built_modules, tensors((3, 4)), state=_log, reset=_reset)
    assert (counts.graphs, counts.breaks) == (1, 0)


class Accumulator:
    def __init__(self):
        self.items = []

    def __iadd__(self, other):
        self.items.append(other)
        return self

    def __add__(self, other):
        fresh = Accumulator()
        fresh.items = [*self.items, other]
        return fresh


def p_user_iadd(x):
    acc = Accumulator()
    alias = acc
    acc += 1
    acc += x * 2
    return alias is acc, len(alias.items), acc.items[1] + 1


def test_augmented_assignment_calls_iadd():
    """`acc += v` with `__iadd__` and `__add__` both defined: Python calls `__iadd__` (the
    same object, changed); the trace called `__add__` (a new object: `alias is acc` was
    False, `alias.items` one short), and with a tensor operand it broke (Dynamo 1/0)."""
    counts = check(p_user_iadd, tensors((3, 4)))
    assert (counts.graphs, counts.breaks) == (1, 0)


def p_batchnorm_made_in_forward(x):
    bn = nn.BatchNorm1d(4, affine=False)
    return bn(x), bn.running_mean, bn.num_batches_tracked


def test_torch_module_with_buffers_made_in_forward():
    """Was 2 graphs / 1 break; Dynamo 1/0. The running statistics are buffers the graph
    makes and updates in place."""
    counts = check(p_batchnorm_made_in_forward, tensors((8, 4)))
    assert (counts.graphs, counts.breaks) == (1, 0)


class WithParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.w


MADE: list = []


def p_parameter_module_made_in_forward(x):
    m = WithParameter()
    MADE.append(m)
    return m(x).sin()


def test_module_with_parameters_made_in_forward_breaks_and_trains():
    """A parameter made in the trace breaks, as under Dynamo (a new leaf tensor that
    requires grad); the reason names it (it said "TypeError: Parameter() takes no
    arguments"). The module CPython makes is a real one: its parameter is an nn.Parameter
    and gets its gradient from the user's backward through the graph after the break."""
    ember.reset()
    compiled = ember.compile(p_parameter_module_made_in_forward)
    for _ in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        compiled(x).sum().backward()
        m = MADE[-1]
        assert type(m.w) is nn.Parameter and m.w.is_leaf
        torch.testing.assert_close(m.w.grad, (x * m.w).cos().mul(x).sum(0).detach())
    assert any("Parameter(...) made in the trace" in r for r in ember.stats()["break_reasons"])
    MADE.clear()


def p_module_trained(x):
    return Buffered()(x) * 2


def test_module_with_buffers_made_in_forward_trains():
    train_check(p_module_trained, leaf_tensors((3, 4)))


def p_made_module_called(x):
    return nn.ReLU()(x) + Buffered()(x)


def test_global_hook_registered_after_compiling_runs():
    """Wrong answer before: calling a module made in the trace added no guard on the global
    forward hooks (a module made there has no source for NO_HOOKS), so a hook registered
    after the first call was skipped by the cached code."""
    ember.reset()
    compiled = ember.compile(p_made_module_called)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), p_made_module_called(x))
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: o + 100)
    try:
        torch.testing.assert_close(compiled(x), p_made_module_called(x))
    finally:
        handle.remove()
    torch.testing.assert_close(compiled(x), p_made_module_called(x))


# --- cycles made in the trace and alive at a later break ------------------------------------


class Node:
    def __init__(self, v):
        self.v = v
        self.next = None


def p_object_refers_to_itself(x):
    n = Node(x * 2)
    n.me = n
    y = x + 1
    print("break")
    return n.me.v + y, n.me is n


def p_two_objects_refer_to_each_other(x):
    a = Node(x * 2)
    b = Node(x * 3)
    a.next = b
    b.next = a
    print("break")
    return a.next.next.v + b.v, a.next.next is a


def p_list_holds_itself(x):
    lst = [x * 2]
    lst.append(lst)
    print("break")
    return lst[1][0] + 1, len(lst), lst[1] is lst


def p_dict_holds_itself(x):
    d = {"t": x * 2}
    d["self"] = d
    print("break")
    return d["self"]["t"] + 1, d["self"] is d


def p_object_list_dict_cycle(x):
    n = Node(x)
    n.kids = [n, {"parent": n}]
    print("break")
    return n.kids[1]["parent"].v * 2, n.kids[0] is n


class Items(list):
    pass


def p_list_subclass_holds_itself(x):
    lst = Items([x * 2])
    lst.append(lst)
    print("break")
    return lst[1][0] + 1, type(lst[1]).__name__


def test_cycles_alive_at_a_break_do_not_run_the_frame_eagerly():
    """Each ran the whole frame eagerly (break code made values one step each, and a cycle
    never ends). Now the members of a cycle (marked where it is closed: values/
    reachability.py `note_cycle`) are made in two steps, empty first and kept, then filled,
    as Dynamo does; a cycle that dies in the graph costs nothing."""
    for program in (
        p_object_refers_to_itself,
        p_two_objects_refer_to_each_other,
        p_list_holds_itself,
        p_dict_holds_itself,
        p_object_list_dict_cycle,
    ):
        counts = check(program, tensors((3, 4)), dynamo=False)
        assert counts.eager_frames == 0 and counts.breaks == 1, program.__name__
        theirs = dynamo_counts(program, tensors((3, 4)))
        assert counts.breaks <= theirs.breaks and counts.ops >= theirs.ops
    counts = check(p_cycle_dies_in_the_graph, tensors((3, 4)))
    assert (counts.graphs, counts.breaks) == (1, 0)
    # a member not made in two steps (a list subclass): the capture breaks where the cycle
    # is closed, and CPython closes it (reading items of an outside list subclass is a
    # break of its own, open)
    counts = check(p_list_subclass_holds_itself, tensors((3,)), dynamo=False)
    assert counts.eager_frames == 0
    assert any("refer to itself" in r for r in ember.stats()["break_reasons"])


def p_cycle_dies_in_the_graph(x):
    a = Node(x * 2)
    a.next = a
    return a.next.next.v + 1


def p_takes_a_list_holding_itself(lst):
    return lst[0] * 2, len(lst[1]), lst[1] is lst


def p_takes_a_dict_holding_itself(d):
    return d["t"] + len(d["d"]), d["d"] is d


def test_argument_holding_itself():
    """RecursionError before: wrapping a list or dict from outside wrapped its items first,
    and one that holds itself (what a resume function receives after such a break) never
    ended. The container's value is known before its items; the item's guard is that it is
    the container itself (a list holding another list of the same shape is a new entry)."""
    ember.reset()
    for fn, key in ((p_takes_a_list_holding_itself, 1), (p_takes_a_dict_holding_itself, "d")):
        compiled = ember.compile(fn)
        for _ in range(2):
            box = [torch.ones(3)] if key == 1 else {"t": torch.ones(3)}
            if key == 1:
                box.append(box)
            else:
                box[key] = box
            got, want = compiled(box), fn(box)
            torch.testing.assert_close(got[0], want[0])
            assert got[1:] == want[1:]
        other = [torch.ones(3)] if key == 1 else {"t": torch.ones(3)}
        other_box = [torch.ones(3)] if key == 1 else {"t": torch.ones(3)}
        if key == 1:
            other.append(other_box)
            other_box.append(other_box)
        else:
            other[key] = other_box
            other_box[key] = other_box
        assert compiled(other)[1:] == fn(other)[1:]
    assert ember.stats()["eager_frames"] == 0


# --- the new probes that needed fixes -------------------------------------------------------


class Single:
    """A singleton through a `__new__` written in Python."""

    instance = None

    def __new__(cls, v):
        LOG.append("new")
        if cls.instance is None:
            cls.instance = super().__new__(cls)
        return cls.instance

    def __init__(self, v):
        LOG.append(("init", v))
        self.v = v


def _reset_single() -> None:
    LOG.clear()
    Single.instance = None


def p_singleton_new(x):
    a = Single(2)
    b = Single(3)
    return x * a.v, a is b


class Doubled:
    def __new__(cls, v):  # not an instance: `__init__` does not run
        return v * 2

    def __init__(self, v):
        raise RuntimeError("never called")


class Required:
    def __new__(cls, v):
        made = super().__new__(cls)
        made.v = v
        return made


def p_new_not_an_instance_and_alive_at_a_break(x):
    r = Required(4)
    print("break")
    return x + Doubled(3) + r.v, r


def test_class_with_a_python_new_is_traced():
    """Was a break at each construction (1/1; Dynamo 1/0): `__new__` is traced, then
    `__init__` only if it made an instance of the class (type.__call__'s rule). Break code
    makes such an object again with object.__new__ and its attributes (its Python `__new__`
    ran in the trace; `Required.__new__` takes an argument break code does not have)."""
    counts = check(
        p_singleton_new,
        tensors((3,)),
        state=lambda: (list(LOG), Single.instance.v),
        reset=_reset_single,
    )
    assert (counts.graphs, counts.breaks) == (1, 0)
    check(p_new_not_an_instance_and_alive_at_a_break, tensors((3,)), dynamo=False)
    out = ember.compile(p_new_not_an_instance_and_alive_at_a_break)(torch.ones(3))
    assert type(out[1]) is Required and out[1].v == 4


def p_zip_strict_mismatch_caught(x):
    try:
        list(zip([1, 2], [3], strict=True))
        message = ""
    except ValueError as exc:
        message = str(exc)
    try:
        list(zip([1], [2], [3, 4], strict=True))
    except ValueError as exc:
        message += "; " + str(exc)
    return x + 1, message


def test_zip_strict_mismatch_is_a_value_error_of_the_trace():
    """Was a break (the mismatch ended the capture; Dynamo 1/0); now CPython's ValueError,
    with its message, is raised in the trace and caught there."""
    counts = check(p_zip_strict_mismatch_caught, tensors((3,)))
    assert (counts.graphs, counts.breaks) == (1, 0)
