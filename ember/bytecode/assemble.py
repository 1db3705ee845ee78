"""Build code objects from version-neutral emit calls, on top of the `bytecode` package.

`CodeBuilder` starts from a template code object (the user's function: its signature, cells and
free variables stay the same) and its methods emit what a replacement body needs: loads of
locals, globals, cells, attributes and items, calls, comparisons, container builds, jumps,
stores and the return. Each method writes the sequence the running Python needs (`dialect.py`):
PRECALL, KW_NAMES or CALL_KW, the NULL below or above a callable, the method bit of
LOAD_ATTR, the bool bit of COMPARE_OP, TO_BOOL before a test.
"""

from __future__ import annotations

import contextlib
import dis
import types
from collections.abc import Iterator
from typing import Any

from bytecode import (
    Bytecode,
    CellVar,
    Compare,
    FreeVar,
    Instr,
    Intrinsic2Op,
    Label,
    SetLineno,
    TryBegin,
    TryEnd,
)

from ember.bytecode.decode import Inst
from ember.bytecode.dialect import THIS
from ember.bytecode.ops import Op


class CodeBuilder:
    """Emits instructions into a copy of `template`'s signature and closure layout."""

    def __init__(self, template: types.CodeType, name_suffix: str = "") -> None:
        self.template = template
        self.bc = Bytecode.from_code(template)
        body = next(
            n + 1 for n, e in enumerate(self.bc) if isinstance(e, Instr) and e.name == "RESUME"
        )
        self.template_body = self.bc[body:]
        """The template's instructions after its prologue (MAKE_CELL, COPY_FREE_VARS,
        RESUME), which the builder keeps."""
        del self.bc[body:]
        if name_suffix:
            self.bc.name = template.co_name + name_suffix
            self.bc.qualname = template.co_qualname + name_suffix
        self._cells = set(template.co_cellvars)
        self._frees = set(template.co_freevars)
        self._open_blocks: list[TryBegin] = []
        """Try blocks open now, the innermost last: an exception table maps each range to
        one handler, so a block opened inside another ends the outer's range and the
        outer's begins again when it closes."""

    def emit(self, name: str, *arg: Any) -> None:
        """Append one instruction; `arg` is omitted for instructions that take none. Only for
        instructions that every supported version spells the same (BUILD_SET, SET_UPDATE)."""
        self.bc.append(Instr(name, *arg))

    def label(self) -> Label:
        return Label()

    def place(self, label: Label) -> None:
        self.bc.append(label)

    # loads and stores
    def load_const(self, value: Any, push_null: bool = False) -> None:
        """Push a constant; with `push_null`, also the NULL that makes it a call's callable."""
        with self.callee() if push_null else contextlib.nullcontext():
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

    def load_cell_object(self, name: str) -> None:
        """Push the cell object of a cell variable that is a parameter (a resume function's
        cell parameter): its slot holds the cell, and LOAD_FAST reads the slot as it is."""
        self.emit("LOAD_FAST", name)

    def load_free_cell(self, name: str) -> None:
        """Push the cell object of a free variable of the running code (its closure's)."""
        self.emit(THIS.cell_object_load, FreeVar(name))

    def _cell(self, name: str) -> CellVar | FreeVar:
        return CellVar(name) if name in self._cells else FreeVar(name)

    def load_global(self, name: str, push_null: bool = False) -> None:
        """Push a global; with `push_null`, also the NULL that makes it a call's callable."""
        self.emit("LOAD_GLOBAL", (push_null, name))

    def store_global(self, name: str) -> None:
        self.emit("STORE_GLOBAL", name)

    def load_attr(self, name: str) -> None:
        self.emit("LOAD_ATTR", (False, name) if THIS.attr_method_bit else name)

    def load_method(self, name: str) -> None:
        """Replace the object on top by the callable pair of a call of its method `name`."""
        if THIS.attr_method_bit:
            self.emit("LOAD_ATTR", (True, name))
        else:
            self.emit("LOAD_METHOD", name)

    def store_attr(self, name: str) -> None:
        self.emit("STORE_ATTR", name)

    def subscr(self) -> None:
        self.emit("BINARY_SUBSCR")

    def store_subscr(self) -> None:
        self.emit("STORE_SUBSCR")

    # calls: [callable and its NULL (load_global / load_const with push_null, load_method,
    # or any code inside `with callee()`), then the arguments], then call()
    @contextlib.contextmanager
    def callee(self) -> Iterator[None]:
        """The code emitted inside pushes a callable: the NULL of the call convention goes
        below it (3.11/3.12) or above it (3.13)."""
        if not THIS.null_above_callable:
            self.push_null()
        yield
        if THIS.null_above_callable:
            self.push_null()

    def push_null(self) -> None:
        """A NULL at this very position of the stack (rebuilding a recorded stack); a call's
        NULL is pushed by `callee` and the `push_null` arguments, which place it."""
        self.emit("PUSH_NULL")

    def call(self, nargs: int, kw_names: tuple[str, ...] = ()) -> None:
        """Call with `nargs` arguments on the stack above the callable and its NULL; the last
        `len(kw_names)` of them are passed by keyword."""
        if kw_names and not THIS.kw_names_instruction:
            self.emit("LOAD_CONST", kw_names)
            self.emit("CALL_KW", nargs)
            return
        if kw_names:
            self.emit("KW_NAMES", kw_names)
        if THIS.precall:
            self.emit("PRECALL", nargs)
        self.emit("CALL", nargs)

    def call_ex(self, has_kwargs: bool) -> None:
        """Call [callable and its NULL, args-tuple, (kwargs-dict)]."""
        self.emit("CALL_FUNCTION_EX", int(has_kwargs))

    # operators
    def compare(self, op: str, to_bool: bool = False) -> None:
        """COMPARE_OP with one of dis.cmp_op; `to_bool` (3.13) converts the result to bool."""
        self.emit("COMPARE_OP", Compare(dis.cmp_op.index(op) | (16 if to_bool else 0)))

    def unary_not(self) -> None:
        if THIS.exact_bool_tests:
            self.emit("TO_BOOL")
        self.emit("UNARY_NOT")

    def replay(self, inst: Inst) -> None:
        """Emit a decoded operator, attribute or subscript instruction again (break code runs
        the instruction ember could not trace in CPython)."""
        if inst.op is Op.COMPARE_OP:
            self.compare(inst.argval, inst.to_bool)
        elif inst.op is Op.UNARY_NOT:
            self.unary_not()
        elif inst.op is Op.LOAD_ATTR:
            self.load_attr(inst.argval)
        elif inst.op in (Op.STORE_ATTR, Op.DELETE_ATTR):
            self.emit(inst.opname, inst.argval)
        elif inst.op is Op.CALL_INTRINSIC_2:  # 3.12+: the `bytecode` package names its argument
            self.emit(inst.opname, Intrinsic2Op(inst.arg))
        elif inst.arg is not None:  # BINARY_OP, IS_OP, CONTAINS_OP: a plain number
            self.emit(inst.opname, inst.arg)
        else:
            self.emit(inst.opname)

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

    def get_iter(self) -> None:
        self.emit("GET_ITER")

    # control flow
    def pop_jump_if(self, condition: str, label: Label) -> None:
        """condition: TRUE, FALSE (on any value's truth), NONE or NOT_NONE (a forward jump)."""
        if THIS.exact_bool_tests and condition in ("TRUE", "FALSE"):
            self.emit("TO_BOOL")
        self.emit(f"{THIS.conditional_jump_prefix}{condition}", label)

    def catch_raised(self, depth: int) -> None:
        """Raise the exception on top and catch it at once, with `depth` slots below it:
        PUSH_EXC_INFO leaves [the exception handled before, the exception] and makes it the
        one being handled (`sys.exc_info()`), as when CPython enters an `except` block."""
        caught = Label()
        self._begin(TryBegin(caught, push_lasti=False, stack_depth=depth))
        self.emit("RAISE_VARARGS", 1)
        self._end()
        self.place(caught)
        self.emit("PUSH_EXC_INFO")

    def pop_except(self) -> None:
        """Pop the exception handled before and make it the one being handled again."""
        self.emit("POP_EXCEPT")

    @contextlib.contextmanager
    def try_block(self, handler: Label) -> Iterator[None]:
        """An exception raised by the instructions emitted inside goes to `handler`, with
        the stack cut to its depth at the start of the block and the exception on top."""
        self._begin(TryBegin(handler, push_lasti=False))
        yield
        self._end()

    def _begin(self, begin: TryBegin) -> None:
        if self._open_blocks:
            self.bc.append(TryEnd(self._open_blocks[-1]))
        self._open_blocks.append(begin)
        self.bc.append(begin)

    def _end(self) -> None:
        self.bc.append(TryEnd(self._open_blocks.pop()))
        if self._open_blocks:
            outer = self._open_blocks[-1].copy()
            self._open_blocks[-1] = outer
            self.bc.append(outer)

    def jump_forward(self, label: Label) -> None:
        self.emit("JUMP_FORWARD", label)

    def return_value(self) -> None:
        self.emit("RETURN_VALUE")

    def raise_exception(self) -> None:
        """Raise the exception on top of the stack."""
        self.emit("RAISE_VARARGS", 1)

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
