"""Constructs capture cannot handle: with fullgraph=True, `ember.Unsupported` carries the
right `BreakReason` and the user's file:line; without it, the function still returns what
eager returns (captured around the break, or run eagerly)."""

from __future__ import annotations

import copy
import inspect
import os
import re

import pytest
import torch

import ember
from ember import BreakReason
from ember.testing import assert_same


class Plain:
    pass


class WithAttr:
    def __init__(self):
        self.a = 1

    def __delattr__(self, name):  # refused (a plain `del obj.a` is modelled)
        object.__delattr__(self, name)


PATTERN = re.compile("a+")


def u_print(x):
    print("value", x.shape)  # BREAK
    return x + 1


def u_data_dependent_branch(x):
    if x.sum() > 0:  # BREAK
        return x + 1
    return x - 1


def u_item(x):
    return x * x.max().item()  # BREAK


def u_float_of_tensor(x):
    return x * float(x.sum())  # BREAK


def u_grad_attribute(x):
    return x + (x * 2).grad  # BREAK  (an input's .grad is read in the trace; this one's is not)


def u_opaque_object(x):
    return x * len(PATTERN.pattern)  # BREAK


class ValueHashed:
    """Hashes by value. As a key itself it is filed by its own `__hash__`/`__eq__`; inside a
    tuple key it is not (equal objects are merged only at a table's top level)."""

    def __hash__(self):
        return 1

    def __eq__(self, other):
        return isinstance(other, ValueHashed)


def u_value_hashed_dict_key(x):
    d = {(ValueHashed(), 1): 1}  # BREAK
    return x + len(d)


def u_raise(x):
    if x.dim() == 2:
        raise ValueError("two dimensions")  # BREAK
    return x


def u_iterate_plain_object(x):
    for _ in Plain():  # BREAK
        x = x + 1
    return x


def u_delete_attribute(x, obj):
    del obj.a  # BREAK
    return x + 1


def u_delete_global(x):
    global U_GLOBAL
    U_GLOBAL = 1
    del U_GLOBAL  # BREAK
    return x + 1


def u_nonzero(x):
    return torch.nonzero(x)  # BREAK


def _deep(x, n):
    if n == 0:
        return x
    return _deep(x + 1, n - 1)  # BREAK


def u_inline_depth(x):
    return _deep(x, 8)


def u_inner_function_breaks(x):
    return _helper_that_prints(x) * 2


def _helper_that_prints(x):
    print(x.shape)  # BREAK
    return x + 1


def u_range_of_tensor(x):
    n = x.sum().int()
    return [x * i for i in range(n)]  # BREAK


def u_tensor_format(x):
    return f"{x}"  # BREAK


def u_graph_break(x):
    y = x + 1
    ember.graph_break()  # BREAK
    return y * 2


def _prints_inside(x):
    print("inside the checkpoint")
    return x.sin()


def u_checkpoint_body_breaks(x):
    y = x + 1
    y = torch.utils.checkpoint.checkpoint(_prints_inside, y, use_reentrant=False)  # BREAK
    return y * 2


CASES = [
    (u_print, BreakReason.UNSUPPORTED_CALL, lambda: (torch.randn(2, 3),)),
    (u_data_dependent_branch, BreakReason.DATA_DEPENDENT_BRANCH, lambda: (torch.randn(2, 3),)),
    (u_item, BreakReason.TENSOR_TO_PYTHON, lambda: (torch.randn(2, 3),)),
    (u_float_of_tensor, BreakReason.TENSOR_TO_PYTHON, lambda: (torch.randn(2, 3),)),
    (u_grad_attribute, BreakReason.UNSUPPORTED_ATTRIBUTE, lambda: (torch.randn(2, 3),)),
    (u_opaque_object, BreakReason.UNSUPPORTED_OBJECT, lambda: (torch.randn(2, 3),)),
    (u_value_hashed_dict_key, BreakReason.UNSUPPORTED_OPERATOR, lambda: (torch.randn(2, 3),)),
    (u_raise, BreakReason.EXCEPTION_RAISED, lambda: (torch.randn(2, 2),)),
    (u_iterate_plain_object, BreakReason.DYNAMIC_CONTROL_FLOW, lambda: (torch.randn(2, 3),)),
    (u_delete_attribute, BreakReason.SIDE_EFFECT, lambda: (torch.randn(2, 3), WithAttr())),
    (u_delete_global, BreakReason.UNSUPPORTED_OPCODE, lambda: (torch.randn(2, 3),)),
    (u_nonzero, BreakReason.DATA_DEPENDENT_OP, lambda: (torch.randn(2, 3),)),
    (u_inner_function_breaks, BreakReason.UNSUPPORTED_CALL, lambda: (torch.randn(2, 3),)),
    (u_tensor_format, BreakReason.TENSOR_TO_PYTHON, lambda: (torch.randn(2, 3),)),
    (u_range_of_tensor, BreakReason.TENSOR_TO_PYTHON, lambda: (torch.ones(3),)),
    (u_graph_break, BreakReason.FORCED, lambda: (torch.ones(3),)),
    (u_checkpoint_body_breaks, BreakReason.HIGHER_ORDER_OP, lambda: (torch.ones(3),)),
]


def _break_line(fn) -> int:
    """The line marked `# BREAK` in fn or in a function it calls from this file."""
    for candidate in (fn, _helper_that_prints, _deep):
        lines, start = inspect.getsourcelines(candidate)
        for offset, text in enumerate(lines):
            if "# BREAK" in text and (
                candidate is fn or candidate.__name__ in inspect.getsource(fn)
            ):
                return start + offset
    raise AssertionError(f"no # BREAK line for {fn.__name__}")


def _ids(cases):
    return [c[0].__name__.removeprefix("u_") for c in cases]


@pytest.mark.parametrize(("fn", "reason", "make_args"), CASES, ids=_ids(CASES))
def test_fullgraph_raises_with_reason_and_location(fn, reason, make_args):
    compiled = ember.compile(fn, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported) as info:
        compiled(*make_args())
    exc = info.value
    assert exc.reason is reason, f"{exc.reason} ({exc})"
    assert os.path.basename(__file__) in exc.location
    assert exc.location.endswith(f":{_break_line(fn)}"), exc.location


@pytest.mark.parametrize(("fn", "reason", "make_args"), CASES, ids=_ids(CASES))
def test_without_fullgraph_the_result_is_eagers(fn, reason, make_args, capsys):
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        args = make_args()
        eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
        try:
            expected = fn(*eager_args)
        except Exception as exc:  # eager raises: so must the compiled function
            with pytest.raises(type(exc)):
                compiled(*compiled_args)
            continue
        assert_same(compiled(*compiled_args), expected)
        assert_same(compiled_args, eager_args)


def test_inline_depth_limit():
    with ember.config.patch(inline_depth=4):
        compiled = ember.compile(u_inline_depth, backend="eager", fullgraph=True)
        with pytest.raises(ember.Unsupported) as info:
            compiled(torch.randn(2))
        assert info.value.reason is BreakReason.INLINE_DEPTH
        assert os.path.basename(__file__) in info.value.location
        relaxed = ember.compile(u_inline_depth, backend="eager")
        x = torch.randn(2)
        assert_same(relaxed(x), u_inline_depth(x))


def test_shape_error_is_a_tensor_op_failure():
    def f(x, y):
        return x @ y  # BREAK

    compiled = ember.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(ember.Unsupported) as info:
        compiled(torch.randn(2, 3), torch.randn(2, 3))
    assert info.value.reason is BreakReason.TENSOR_OP_FAILED
    assert os.path.basename(__file__) in info.value.location
    with pytest.raises(RuntimeError):
        ember.compile(f, backend="eager")(torch.randn(2, 3), torch.randn(2, 3))


def test_every_break_reason_has_a_test():
    tested = {c[1] for c in CASES} | {BreakReason.INLINE_DEPTH, BreakReason.TENSOR_OP_FAILED}
    tested.add(BreakReason.RECOMPILE_LIMIT)  # not a construct: test_fidelity_crashes
    assert tested == set(BreakReason)
