"""CodeBuilder.to_code computes the stack size of forward-only code itself; the code objects
are the same as the `bytecode` package's own assembly (which builds a control-flow graph)."""

from __future__ import annotations

from bytecode import Instr, Label

from ember.bytecode import CodeBuilder
from ember.bytecode.assemble import forward_stacksize

_FIELDS = ("co_code", "co_consts", "co_names", "co_stacksize", "co_linetable",
           "co_exceptiontable")  # fmt: skip


def _template(x, y=2):
    return x


def _program() -> CodeBuilder:
    cg = CodeBuilder(_template.__code__)
    skip, done = cg.label(), cg.label()
    cg.load_fast("x")
    cg.pop_jump_if("NONE", skip)
    cg.push_null()
    cg.load_global("len")
    cg.load_fast("x")
    cg.load_fast("y")
    cg.load_const(1)
    cg.build("TUPLE", 3)
    cg.call(1)
    cg.return_value()
    cg.place(skip)
    cg.load_const(None)
    cg.load_const(1)
    cg.load_const(2)
    cg.build("LIST", 2)
    cg.build("TUPLE", 2)
    cg.pop_jump_if("FALSE", done)
    cg.load_const(3)
    cg.return_value()
    cg.place(done)
    cg.load_const(4)
    cg.return_value()
    return cg


def test_forward_code_matches_the_package():
    got = _program().to_code()
    want = _program().bc.to_code()
    for field in _FIELDS:
        assert getattr(got, field) == getattr(want, field), field
    assert got.co_stacksize == 5  # NULL, len, x, y, 1


def test_backward_jumps_and_underflow_go_to_the_package():
    cg = CodeBuilder(_template.__code__)
    top = cg.label()
    cg.place(top)
    cg.load_const(1)
    cg.pop_top()
    cg.emit("JUMP_BACKWARD", top)
    assert forward_stacksize(cg.bc) is None
    cg = CodeBuilder(_template.__code__)
    cg.bc.append(Instr("POP_TOP"))
    assert forward_stacksize(cg.bc) is None
    assert isinstance(cg.label(), Label)
