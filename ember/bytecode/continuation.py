"""Code that runs a prologue and then continues another code object at one instruction.

A graph break's resume function is such code: its prologue (emitted with `CodeBuilder`'s
methods) pushes the interrupted stack back and jumps into a copy of the user's code. The copy
keeps the original's exception table, with the stack depths the original handlers had: the
prologue rebuilds that stack, and the `bytecode` package, which would compute the depths from
the new entry point in the middle of the code, is told not to.
"""

from __future__ import annotations

import inspect
import types

from bytecode import CellVar, FreeVar, Instr, Label, TryBegin

from ember.bytecode.analysis import exception_table, stack_depth
from ember.bytecode.assemble import CodeBuilder


class CannotContinue(Exception):
    """The code's exception table does not survive the copy."""


class Continuation(CodeBuilder):
    """Builds `code` entered at its instruction number `ordinal` (EXTENDED_ARG not counted),
    after whatever the caller emits. The parameters are `argnames`, all positional."""

    def __init__(self, code: types.CodeType, ordinal: int, name: str, argnames: list[str]) -> None:
        super().__init__(code)
        self.copied_head = sum(isinstance(e, Instr) for e in self.bc)
        """Instructions of the original before its body (MAKE_CELL, COPY_FREE_VARS, RESUME)."""
        self._body = list(self.template_body)
        _keep_handler_depths(code, self._body)
        self._entry = Label()
        seen = self.copied_head
        for position, entry in enumerate(self._body):
            if isinstance(entry, Instr):
                if seen == ordinal:
                    self._body.insert(position, self._entry)
                    break
                seen += 1
        bc = self.bc
        bc.name = bc.qualname = name
        bc.flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        bc.argcount = len(argnames)
        bc.posonlyargcount = 0
        bc.kwonlyargcount = 0
        bc.argnames = list(argnames)

    def take_cells(self, names: tuple[str, ...]) -> None:
        """The cell variables `names` (parameters) arrive as cell objects: their MAKE_CELL
        is dropped from the copied head, so the slot keeps the passed cell. (`copied_head`
        still counts the original's head: it maps ordinals back to the original code.)"""
        self.bc[:] = [
            e
            for e in self.bc
            if not (isinstance(e, Instr) and e.name == "MAKE_CELL" and e.arg.name in names)
        ]
        if not self.bc.freevars or not set(self.bc.freevars) <= set(names):
            return
        # the free variables too: they become cell variables taken as parameters, and the
        # code no longer has a closure
        free = list(self.bc.freevars)
        self.bc[:] = [
            e for e in self.bc if not (isinstance(e, Instr) and e.name == "COPY_FREE_VARS")
        ]
        for entry in [*self.bc, *self._body]:
            if isinstance(entry, Instr) and isinstance(entry.arg, FreeVar):
                entry.arg = CellVar(entry.arg.name)
        self.bc.freevars = []
        self.bc.cellvars = [*self.bc.cellvars, *free]
        self._frees = set()
        self._cells |= set(free)

    def prologue_length(self) -> int:
        """Instructions before the copied body, the jump into it included."""
        return sum(isinstance(e, Instr) for e in self.bc) + 1

    def to_code(self) -> types.CodeType:
        """The code object, sized by ember's own stack analysis: the `bytecode` package
        carries the smallest depth of the prologue into the handlers of a try block entered
        in the middle, and finds a negative depth there when the block is in a loop."""
        self.jump_forward(self._entry)
        self.bc.extend(self._body)
        code = self.bc.to_code(stacksize=0, compute_exception_stack_depths=False)
        return code.replace(co_stacksize=stack_depth(code).highest)


def _keep_handler_depths(code: types.CodeType, entries: list) -> None:
    """Give the copied try blocks the stack depths of the original exception table."""
    table = exception_table(code)
    blocks = [e for e in entries if isinstance(e, TryBegin)]
    if len(blocks) != len(table):
        raise CannotContinue(
            "the exception table of this function cannot be copied into a resume function"
        )
    for block, entry in zip(blocks, table):
        block.stack_depth = entry.depth
        block.push_lasti = entry.lasti
