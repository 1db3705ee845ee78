"""Version-neutral operations: every CPython opcode of 3.11, 3.12 and 3.13 maps to one `Op`
or to a stated reason why ember does not interpret it.

The translator's handlers are keyed by `Op`, so they never see a version-specific opcode
(3.11's POP_JUMP_FORWARD_IF_TRUE and 3.12's POP_JUMP_IF_TRUE are both `Op.POP_JUMP_IF_TRUE`;
3.12's LOAD_ATTR with the method bit is `Op.LOAD_METHOD`). An `Op` that only some versions
have (KW_NAMES, CALL_KW, TO_BOOL) keeps its handler on all of them.
"""

from __future__ import annotations

import dis
import enum
import operator


class Op(enum.Enum):
    NOP = enum.auto()
    LOAD_FAST = enum.auto()
    LOAD_FAST_AND_CLEAR = enum.auto()
    LOAD_FAST_LOAD_FAST = enum.auto()
    STORE_FAST = enum.auto()
    STORE_FAST_STORE_FAST = enum.auto()
    STORE_FAST_LOAD_FAST = enum.auto()
    DELETE_FAST = enum.auto()
    LOAD_CONST = enum.auto()
    LOAD_GLOBAL = enum.auto()
    STORE_GLOBAL = enum.auto()
    LOAD_ATTR = enum.auto()
    LOAD_METHOD = enum.auto()
    LOAD_SUPER_ATTR = enum.auto()
    STORE_ATTR = enum.auto()
    DELETE_ATTR = enum.auto()
    LOAD_DEREF = enum.auto()
    STORE_DEREF = enum.auto()
    LOAD_CLOSURE = enum.auto()
    MAKE_CELL = enum.auto()
    COPY_FREE_VARS = enum.auto()
    POP_TOP = enum.auto()
    PUSH_NULL = enum.auto()
    COPY = enum.auto()
    SWAP = enum.auto()
    BINARY_OP = enum.auto()
    UNARY_NEGATIVE = enum.auto()
    UNARY_POSITIVE = enum.auto()
    UNARY_NOT = enum.auto()
    UNARY_INVERT = enum.auto()
    TO_BOOL = enum.auto()
    COMPARE_OP = enum.auto()
    IS_OP = enum.auto()
    CONTAINS_OP = enum.auto()
    BINARY_SUBSCR = enum.auto()
    STORE_SUBSCR = enum.auto()
    DELETE_SUBSCR = enum.auto()
    BINARY_SLICE = enum.auto()
    STORE_SLICE = enum.auto()
    BUILD_TUPLE = enum.auto()
    BUILD_LIST = enum.auto()
    BUILD_SET = enum.auto()
    BUILD_MAP = enum.auto()
    BUILD_CONST_KEY_MAP = enum.auto()
    BUILD_SLICE = enum.auto()
    BUILD_STRING = enum.auto()
    LIST_APPEND = enum.auto()
    LIST_EXTEND = enum.auto()
    LIST_TO_TUPLE = enum.auto()
    SET_ADD = enum.auto()
    SET_UPDATE = enum.auto()
    MAP_ADD = enum.auto()
    DICT_UPDATE = enum.auto()
    DICT_MERGE = enum.auto()
    UNPACK_SEQUENCE = enum.auto()
    UNPACK_EX = enum.auto()
    FORMAT_VALUE = enum.auto()
    CONVERT_VALUE = enum.auto()
    FORMAT_SIMPLE = enum.auto()
    FORMAT_WITH_SPEC = enum.auto()
    KW_NAMES = enum.auto()
    CALL = enum.auto()
    CALL_KW = enum.auto()
    CALL_FUNCTION_EX = enum.auto()
    MAKE_FUNCTION = enum.auto()
    SET_FUNCTION_ATTRIBUTE = enum.auto()
    JUMP = enum.auto()
    POP_JUMP_IF_TRUE = enum.auto()
    POP_JUMP_IF_FALSE = enum.auto()
    POP_JUMP_IF_NONE = enum.auto()
    POP_JUMP_IF_NOT_NONE = enum.auto()
    JUMP_IF_TRUE_OR_POP = enum.auto()
    JUMP_IF_FALSE_OR_POP = enum.auto()
    GET_ITER = enum.auto()
    FOR_ITER = enum.auto()
    END_FOR = enum.auto()
    RETURN_VALUE = enum.auto()
    RETURN_CONST = enum.auto()
    BEFORE_WITH = enum.auto()
    LOAD_ASSERTION_ERROR = enum.auto()
    LOAD_BUILD_CLASS = enum.auto()
    RETURN_GENERATOR = enum.auto()
    YIELD_VALUE = enum.auto()
    GET_YIELD_FROM_ITER = enum.auto()
    SEND = enum.auto()
    END_SEND = enum.auto()
    RAISE_VARARGS = enum.auto()
    PUSH_EXC_INFO = enum.auto()
    POP_EXCEPT = enum.auto()
    CHECK_EXC_MATCH = enum.auto()
    RERAISE = enum.auto()
    WITH_EXCEPT_START = enum.auto()
    CALL_INTRINSIC_1 = enum.auto()
    CALL_INTRINSIC_2 = enum.auto()
    CHECK_EG_MATCH = enum.auto()
    PREP_RERAISE_STAR = enum.auto()
    GET_LEN = enum.auto()
    MATCH_MAPPING = enum.auto()
    MATCH_SEQUENCE = enum.auto()
    MATCH_KEYS = enum.auto()
    MATCH_CLASS = enum.auto()
    IMPORT_NAME = enum.auto()
    IMPORT_FROM = enum.auto()


# Real opcode names that map to an Op of another name.
_ALIASES = {
    "PRECALL": Op.NOP,
    "RESUME": Op.NOP,
    "EXTENDED_ARG": Op.NOP,
    "CACHE": Op.NOP,
    "LOAD_FAST_CHECK": Op.LOAD_FAST,
    "STORE_FAST_MAYBE_NULL": Op.STORE_FAST,
    "JUMP_FORWARD": Op.JUMP,
    "JUMP_BACKWARD": Op.JUMP,
    "JUMP_BACKWARD_NO_INTERRUPT": Op.JUMP,
    "POP_JUMP_FORWARD_IF_TRUE": Op.POP_JUMP_IF_TRUE,
    "POP_JUMP_BACKWARD_IF_TRUE": Op.POP_JUMP_IF_TRUE,
    "POP_JUMP_FORWARD_IF_FALSE": Op.POP_JUMP_IF_FALSE,
    "POP_JUMP_BACKWARD_IF_FALSE": Op.POP_JUMP_IF_FALSE,
    "POP_JUMP_FORWARD_IF_NONE": Op.POP_JUMP_IF_NONE,
    "POP_JUMP_BACKWARD_IF_NONE": Op.POP_JUMP_IF_NONE,
    "POP_JUMP_FORWARD_IF_NOT_NONE": Op.POP_JUMP_IF_NOT_NONE,
    "POP_JUMP_BACKWARD_IF_NOT_NONE": Op.POP_JUMP_IF_NOT_NONE,
}

# Opcodes ember does not interpret, each with the reason. Reaching one ends the capture.
UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(
        [
            "ASYNC_GEN_WRAP",
            "BEFORE_ASYNC_WITH",
            "END_ASYNC_FOR",
            "GET_AITER",
            "GET_ANEXT",
            "GET_AWAITABLE",
            "CLEANUP_THROW",
        ],
        "coroutines and async code are not captured",
    ),
    **dict.fromkeys(
        [
            "LOAD_NAME",
            "STORE_NAME",
            "DELETE_NAME",
            "LOAD_LOCALS",
            "LOAD_CLASSDEREF",
            "LOAD_FROM_DICT_OR_DEREF",
            "LOAD_FROM_DICT_OR_GLOBALS",
            "SETUP_ANNOTATIONS",
            "IMPORT_STAR",
            "PRINT_EXPR",
        ],
        "module and class bodies are not captured, only functions",
    ),
    "DELETE_GLOBAL": "deleting a global is not captured",
    "DELETE_DEREF": "deleting a closure variable is not captured",
    **dict.fromkeys(
        [name for name in dis.opmap if name.startswith("INSTRUMENTED_")],
        "instrumented opcodes only appear under sys.monitoring, which ember does not trace",
    ),
    **dict.fromkeys(
        [name for name, code in dis.opmap.items() if code >= 256],
        "pseudo-instruction of the compiler, never present in a code object",
    ),
    **dict.fromkeys(
        ["INTERPRETER_EXIT", "RESERVED", "EXIT_INIT_CHECK"],
        "only in the interpreter's own code (its exit and `__init__` shims), never in a function's",
    ),
    "ENTER_EXECUTOR": "JIT executors replace instructions in the adaptive copy of the code, "
    "never in co_code",
}


def op_for(opname: str) -> Op | None:
    """The Op of a real opcode name, or None if it is in UNSUPPORTED."""
    if opname in UNSUPPORTED:
        return None
    if opname in _ALIASES:
        return _ALIASES[opname]
    return Op[opname]


# BINARY_OP's argument (the same numbering in 3.11, 3.12 and 3.13) to the operator function.
BINARY_OPS = [
    operator.add,
    operator.and_,
    operator.floordiv,
    operator.lshift,
    operator.matmul,
    operator.mul,
    operator.mod,
    operator.or_,
    operator.pow,
    operator.rshift,
    operator.sub,
    operator.truediv,
    operator.xor,
    operator.iadd,
    operator.iand,
    operator.ifloordiv,
    operator.ilshift,
    operator.imatmul,
    operator.imul,
    operator.imod,
    operator.ior,
    operator.ipow,
    operator.irshift,
    operator.isub,
    operator.itruediv,
    operator.ixor,
]

COMPARE_OPS = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
}
