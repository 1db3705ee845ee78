"""Continuation (resume) functions for graph breaks.

A resume function continues a user function at one instruction: its parameters are the values
that were on the stack (`___stack_i`, NULLs are pushed back by position) followed by the live
locals; its body pushes the stack back and jumps into a copy of the original bytecode. The
break's replacement code calls it, and it goes through ember's cache like any function, so the
code after a break is captured too.
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import inspect
import types

from bytecode import Bytecode, Instr, Label

from ember.bytecode import PY312, Inst
from ember.errors import BreakReason, Unsupported


class Slot(enum.Enum):
    """How a stack slot travels into a resume function."""

    VALUE = "passed as a parameter"
    NULL = "the NULL of the call convention, pushed back by the prologue"
    ITERATOR = "the remaining items of a loop's iterator, passed as a tuple and re-iterated"
    METHOD = "a method: its receiver is passed and the prologue looks the method up again"


@dataclasses.dataclass(frozen=True, slots=True)
class StackSlot:
    """One stack slot at a break: how it travels, and for METHOD the attribute name.

    A method travels as its receiver so that the resume function sees `receiver.name` with a
    source (a bound method passed as an object would be guarded by identity, and a fresh
    `lst.append` is a new object on every call)."""

    kind: Slot
    attr: str = ""


def covered_by_handler(code: types.CodeType, inst: Inst) -> bool:
    """Whether an instruction is inside a try/with block (an exception handler covers it)."""
    return any(e.start <= inst.offset < e.end for e in dis.Bytecode(code).exception_entries)


def stack_param(i: int) -> str:
    return f"___stack_{i}"


def make_resume_function(
    fn: types.FunctionType,
    target: int,
    slots: list[StackSlot],
    local_names: list[str],
    insts: list[Inst],
) -> types.FunctionType:
    """A function that continues `fn` at instruction index `target`."""
    code = fn.__code__
    if code.co_cellvars:
        raise Unsupported(
            BreakReason.UNSUPPORTED_OPCODE,
            "graph break in a function whose locals are captured by closures",
            hint="the whole function runs eagerly; move the unsupported call out of it",
        )
    ordinal = sum(1 for i in insts[:target] if i.opname != "EXTENDED_ARG")
    original = Bytecode.from_code(code)
    entries = list(original)
    body_start = next(
        n + 1 for n, e in enumerate(entries) if isinstance(e, Instr) and e.name == "RESUME"
    )
    label = Label()
    seen = 0
    for position, entry in enumerate(entries):
        if isinstance(entry, Instr):
            if seen == ordinal:
                entries.insert(position, label)
                break
            seen += 1
    stack_names = [stack_param(i) for i, slot in enumerate(slots) if slot.kind is not Slot.NULL]
    prologue = [e for e in entries[:body_start] if isinstance(e, Instr)]
    for i, slot in enumerate(slots):
        if slot.kind is Slot.NULL:
            prologue.append(Instr("PUSH_NULL"))
            continue
        prologue.append(Instr("LOAD_FAST", stack_param(i)))
        if slot.kind is Slot.ITERATOR:
            prologue.append(Instr("GET_ITER"))
        elif slot.kind is Slot.METHOD:
            prologue.append(Instr("LOAD_ATTR", (False, slot.attr) if PY312 else slot.attr))
    prologue.append(Instr("JUMP_FORWARD", label))
    resume = Bytecode(prologue + entries[body_start:])
    resume.name = f"__resume_{code.co_name}_at_{insts[target].offset}"
    resume.qualname = resume.name
    resume.filename = code.co_filename
    resume.first_lineno = code.co_firstlineno
    resume.freevars = list(code.co_freevars)
    resume.cellvars = []
    resume.flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    resume.argcount = len(stack_names) + len(local_names)
    resume.posonlyargcount = 0
    resume.kwonlyargcount = 0
    resume.argnames = stack_names + list(local_names)
    new_code = resume.to_code()
    return types.FunctionType(new_code, fn.__globals__, new_code.co_name, None, fn.__closure__)
