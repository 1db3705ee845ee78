"""Every opcode of the running Python is either interpreted (mapped to an `Op` that has a
handler) or listed as unsupported with a reason; the decoder agrees with `dis` on real code."""

from __future__ import annotations

import dis
import importlib
import inspect
import types

import pytest

from ember.bytecode import UNSUPPORTED, Op, decode
from ember.bytecode.ops import op_for
from ember.capture.handlers import HANDLERS


@pytest.mark.parametrize("opname", sorted(dis.opmap))
def test_every_opcode_is_handled_or_unsupported_with_reason(opname):
    if opname in UNSUPPORTED:
        assert op_for(opname) is None
        assert UNSUPPORTED[opname].strip(), f"{opname} is unsupported without a reason"
        return
    op = op_for(opname)  # raises KeyError for an opcode nobody thought about
    assert isinstance(op, Op)
    assert op in HANDLERS, f"{opname} maps to {op} which has no handler"


def test_every_op_has_a_handler():
    assert set(Op) == set(HANDLERS), set(Op) ^ set(HANDLERS)


def _functions(module: types.ModuleType):
    for value in vars(module).values():
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            yield value
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for attr in vars(value).values():
                if isinstance(attr, types.FunctionType):
                    yield attr


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


@pytest.mark.parametrize(
    "module_name", ["json.decoder", "dataclasses", "collections", "functools", "argparse", "ast"]
)
def test_decode_agrees_with_dis_on_stdlib(module_name):
    module = importlib.import_module(module_name)
    count = 0
    for fn in _functions(module):
        for code in _codes(fn.__code__):
            insts = decode(code)
            raw = list(dis.get_instructions(code))
            assert len(insts) == len(raw)
            for inst, ref in zip(insts, raw):
                assert inst.opname == ref.opname
                assert inst.offset == ref.offset
                assert inst.op is not None or inst.unsupported_reason, ref.opname
                if inst.target is not None:
                    assert 0 <= inst.target <= len(insts)
            count += 1
    assert count >= 5


def test_jump_targets_point_at_the_dis_target():
    def f(xs):
        total = 0
        for x in xs:
            if x is None:
                continue
            total += x if x > 0 else -x
        while total > 100:
            total //= 2
        return total

    insts = decode(f.__code__)
    by_offset = {i.offset: i.index for i in insts}
    for inst, ref in zip(insts, dis.get_instructions(f.__code__)):
        if inst.target is not None and ref.opname != "FOR_ITER":
            assert inst.target == by_offset[ref.argval]
    assert inspect.isfunction(f)
