"""Build code objects from version-neutral emit calls, on top of the `bytecode` package.

`CodeBuilder` starts from a template code object (the user's function: its signature, cells and
free variables stay the same) and its methods emit what a replacement body needs: loads of
locals, globals, cells, attributes and items, calls, container builds, stores and the return.
Each method hides the 3.11/3.12 difference (PRECALL, the NULL bit of LOAD_GLOBAL/LOAD_ATTR).
"""

from __future__ import annotations

import types
from typing import Any

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label, SetLineno

from ember.bytecode.ops import PY312


class CodeBuilder:
    """Emits instructions into a copy of `template`'s signature and closure layout."""

    def __init__(self, template: types.CodeType, name_suffix: str = "") -> None:
        self.template = template
        self.bc = Bytecode.from_code(template)
        prologue = []
        for ins in self.bc:
            prologue.append(ins)
            if isinstance(ins, Instr) and ins.name == "RESUME":
                break
        self.bc.clear()
        self.bc.extend(prologue)
        if name_suffix:
            self.bc.name = template.co_name + name_suffix
            self.bc.qualname = template.co_qualname + name_suffix
        self._cells = set(template.co_cellvars)
        self._frees = set(template.co_freevars)

    def emit(self, name: str, *arg: Any) -> None:
        """Append one instruction; `arg` is omitted for instructions that take none."""
        self.bc.append(Instr(name, *arg))

    def label(self) -> Label:
        return Label()

    def place(self, label: Label) -> None:
        self.bc.append(label)

    # loads and stores
    def load_const(self, value: Any) -> None:
        self.emit("LOAD_CONST", value)

    def load_fast(self, name: str) -> None:
        if name in self._cells or name in self._frees:
            self.load_deref(name)
        else:
            self.emit("LOAD_FAST", name)

    def store_fast(self, name: str) -> None:
        if name in self._cells or name in self._frees:
            self.emit("STORE_DEREF", self._cell(name))
        else:
            self.emit("STORE_FAST", name)

    def load_deref(self, name: str) -> None:
        self.emit("LOAD_DEREF", self._cell(name))

    def store_deref(self, name: str) -> None:
        self.emit("STORE_DEREF", self._cell(name))

    def _cell(self, name: str) -> CellVar | FreeVar:
        return CellVar(name) if name in self._cells else FreeVar(name)

    def load_global(self, name: str, push_null: bool = False) -> None:
        self.emit("LOAD_GLOBAL", (push_null, name))

    def store_global(self, name: str) -> None:
        self.emit("STORE_GLOBAL", name)

    def load_attr(self, name: str) -> None:
        self.emit("LOAD_ATTR", (False, name) if PY312 else name)

    def store_attr(self, name: str) -> None:
        self.emit("STORE_ATTR", name)

    def subscr(self) -> None:
        self.emit("BINARY_SUBSCR")

    def store_subscr(self) -> None:
        self.emit("STORE_SUBSCR")

    # calls: the caller pushes NULL (push_null) and the callable, then the arguments
    def push_null(self) -> None:
        self.emit("PUSH_NULL")

    def call(self, nargs: int, kw_names: tuple[str, ...] = ()) -> None:
        """Call with `nargs` arguments on the stack above [NULL, callable]; the last
        `len(kw_names)` of them are passed by keyword."""
        if kw_names:
            self.emit("KW_NAMES", kw_names)
        if not PY312:
            self.emit("PRECALL", nargs)
        self.emit("CALL", nargs)

    def call_ex(self, has_kwargs: bool) -> None:
        """Call [NULL, callable, args-tuple, (kwargs-dict)]."""
        self.emit("CALL_FUNCTION_EX", int(has_kwargs))

    # stack and containers
    def pop_top(self) -> None:
        self.emit("POP_TOP")

    def copy(self, depth: int = 1) -> None:
        self.emit("COPY", depth)

    def swap(self, depth: int) -> None:
        self.emit("SWAP", depth)

    def build(self, kind: str, count: int) -> None:
        """kind: TUPLE, LIST, SET, MAP (count = number of key/value pairs), SLICE."""
        self.emit(f"BUILD_{kind}", count)

    def unpack(self, count: int) -> None:
        self.emit("UNPACK_SEQUENCE", count)

    def pop_jump_if(self, condition: str, label: Label) -> None:
        """condition: TRUE, FALSE, NONE or NOT_NONE (a forward jump)."""
        self.emit(
            f"POP_JUMP_IF_{condition}" if PY312 else f"POP_JUMP_FORWARD_IF_{condition}", label
        )

    def return_value(self) -> None:
        self.emit("RETURN_VALUE")

    def to_code(self) -> types.CodeType:
        """The code object. Straight-line code with forward jumps only (every replacement
        body) gets its stack size from one pass here: the `bytecode` package would build a
        control-flow graph for it and rebuild the instruction list from that graph, two
        thirds of its assembly time."""
        depth = forward_stacksize(self.bc)
        if depth is None:
            return self.bc.to_code()
        return self.bc.to_code(stacksize=depth, compute_exception_stack_depths=False)


def forward_stacksize(instructions: Bytecode) -> int | None:
    """The maximum stack depth of code whose jumps all go forward and which has no exception
    table entries, or None for other code (and for code that would underflow its stack, so
    that the `bytecode` package reports that). Each label's depth is the larger of the
    fall-through depth and the depths of the jumps to it; after a return or an unconditional
    jump the next instructions are reached only through a label."""
    pending: dict[int, int] = {}  # label id -> depth of the jumps to it seen so far
    placed: set[int] = set()
    depth: int | None = 0
    highest = 0
    for item in instructions:
        if isinstance(item, Label):
            placed.add(id(item))
            incoming = pending.pop(id(item), None)
            if incoming is not None:
                depth = incoming if depth is None else max(depth, incoming)
            continue
        if isinstance(item, SetLineno):
            continue
        if not isinstance(item, Instr):
            return None  # TryBegin / TryEnd: leave exception tables to the package
        if depth is None:
            continue  # unreachable
        if item.has_jump():
            if id(item.arg) in placed:
                return None  # a backward jump
            pre, post = item.pre_and_post_stack_effect(jump=True)
            if depth + pre < 0:
                return None
            taken = depth + pre + post
            pending[id(item.arg)] = max(pending.get(id(item.arg), taken), taken)
            highest = max(highest, taken)
        pre, post = item.pre_and_post_stack_effect(jump=False)
        if depth + pre < 0:
            return None
        depth += pre + post
        highest = max(highest, depth)
        if item.is_final() or item.is_uncond_jump():
            depth = None
    return None if pending else highest
