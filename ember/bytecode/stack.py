"""Stack layouts and stack effects of instructions, for the running Python.

`with_null` says where a call's NULL goes next to its callable; `operands` says how many
slots an instruction that break code runs again consumes and produces; `stack_effect` is the
net depth change the compiler uses (the stack-size analysis in `analysis.py`).
"""

from __future__ import annotations

import dis
from collections.abc import Callable
from typing import TypeVar

from ember.bytecode.decode import Inst
from ember.bytecode.dialect import THIS
from ember.bytecode.ops import Op

T = TypeVar("T")


def with_null(callable_: T, null: T) -> tuple[T, T]:
    """The callable of a call and its NULL in the order they are pushed (3.11/3.12: NULL
    first; 3.13: the callable first). A method call's [function, self] pair has the same
    order everywhere, so a pair with no NULL is always [callable, self]."""
    return (callable_, null) if THIS.null_above_callable else (null, callable_)


_OPERANDS: dict[Op, Callable[[int], tuple[int, int]]] = {
    Op.CALL: lambda arg: (arg + 2, 1),  # [NULL/self and callable, args]
    Op.CALL_KW: lambda arg: (arg + 3, 1),  # ... and the tuple of keyword names
    Op.CALL_FUNCTION_EX: lambda arg: (3 + (arg & 1), 1),  # NULL, callable, args, (kwargs)
    Op.POP_JUMP_IF_TRUE: lambda arg: (1, 0),
    Op.POP_JUMP_IF_FALSE: lambda arg: (1, 0),
    Op.POP_JUMP_IF_NONE: lambda arg: (1, 0),
    Op.POP_JUMP_IF_NOT_NONE: lambda arg: (1, 0),
    Op.BINARY_SUBSCR: lambda arg: (2, 1),
    Op.BINARY_OP: lambda arg: (2, 1),
    Op.COMPARE_OP: lambda arg: (2, 1),
    Op.IS_OP: lambda arg: (2, 1),
    Op.CONTAINS_OP: lambda arg: (2, 1),
    Op.UNARY_NEGATIVE: lambda arg: (1, 1),
    Op.UNARY_INVERT: lambda arg: (1, 1),
    Op.UNARY_NOT: lambda arg: (1, 1),
    Op.TO_BOOL: lambda arg: (1, 1),
    Op.LOAD_ATTR: lambda arg: (1, 1),
    Op.LOAD_METHOD: lambda arg: (1, 2),  # the object; a callable and its NULL (or self)
    Op.LOAD_SUPER_ATTR: lambda arg: (3, 1 + (arg & 1)),  # super, class, object; as LOAD_ATTR
    Op.BEFORE_WITH: lambda arg: (1, 2),  # the manager; its __exit__ and __enter__'s result
    Op.CHECK_EG_MATCH: lambda arg: (2, 2),  # exception, type; the rest and the match
    Op.PREP_RERAISE_STAR: lambda arg: (2, 1),  # exception, raised list; what to re-raise
    Op.CALL_INTRINSIC_2: lambda arg: (2, 1),
    Op.STORE_ATTR: lambda arg: (2, 0),
    Op.DELETE_ATTR: lambda arg: (1, 0),
    Op.STORE_SUBSCR: lambda arg: (3, 0),
    Op.DELETE_SUBSCR: lambda arg: (2, 0),
    Op.FORMAT_VALUE: lambda arg: (2 if arg & 0x04 else 1, 1),  # the value (and its spec)
    Op.FORMAT_SIMPLE: lambda arg: (1, 1),
    Op.FORMAT_WITH_SPEC: lambda arg: (2, 1),
    Op.CONVERT_VALUE: lambda arg: (1, 1),
}


def operands(inst: Inst) -> tuple[int, int]:
    """(slots popped, slots pushed) by a call, a conditional jump or one of the simple
    instructions that break code can run again in CPython; KeyError for others."""
    return _OPERANDS[inst.op](inst.arg or 0)


_EFFECTS: dict[tuple[str, int | None, bool], int] = {}


def stack_effect(inst: Inst, jump: bool = False) -> int:
    """The net change of stack depth, along the jump or not (the interpreter's own table,
    which its compiler sizes frames with)."""
    key = (inst.opname, inst.arg, jump)
    effect = _EFFECTS.get(key)
    if effect is None:
        effect = _EFFECTS[key] = dis.stack_effect(dis.opmap[inst.opname], inst.arg, jump=jump)
    return effect
