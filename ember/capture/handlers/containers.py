"""Building, unpacking, indexing and formatting containers and strings."""

from __future__ import annotations

from ember.bytecode import Op
from ember.capture.handlers import handler
from ember.capture.operators import index_key
from ember.capture.values.base import ConstantValue, Value
from ember.capture.values.containers import DictValue, ListValue, SliceValue, TupleValue
from ember.capture.values.objects import ModuleValue, UserObjectValue
from ember.capture.values.sets import SetValue
from ember.errors import BreakReason, Unsupported


@handler(Op.BUILD_TUPLE)
def build_tuple(tx, inst):
    tx.push(TupleValue(tx.popn(inst.arg)))


@handler(Op.BUILD_LIST)
def build_list(tx, inst):
    tx.push(ListValue(tx.popn(inst.arg)))


@handler(Op.BUILD_SET)
def build_set(tx, inst):
    result = SetValue()
    for value in tx.popn(inst.arg):
        result.add(value, tx)
    tx.push(result)


@handler(Op.BUILD_MAP)
def build_map(tx, inst):
    flat = tx.popn(2 * inst.arg)
    result = DictValue({})
    for key, value in zip(flat[::2], flat[1::2]):
        result.items[result._key(key, tx)] = value
    tx.push(result)


@handler(Op.BUILD_CONST_KEY_MAP)
def build_const_key_map(tx, inst):
    keys = tx.pop().as_constant()
    values = tx.popn(inst.arg)
    tx.push(DictValue(dict(zip(keys, values))))


@handler(Op.BUILD_SLICE)
def build_slice(tx, inst):
    tx.push(SliceValue(tx.popn(inst.arg)))


@handler(Op.BUILD_STRING)
def build_string(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(ConstantValue("".join(p.as_constant() for p in parts)))


@handler(Op.LIST_APPEND)
def list_append(tx, inst):
    value = tx.pop()
    target = tx.peek(inst.arg)
    target.items.append(value)
    tx.ctx.effects.mutated(target)  # a resume function's list under construction has a source


@handler(Op.LIST_EXTEND)
def list_extend(tx, inst):
    value = tx.pop()
    target = tx.peek(inst.arg)
    target.items.extend(value.iterate(tx))
    tx.ctx.effects.mutated(target)


@handler(Op.LIST_TO_TUPLE)
def list_to_tuple(tx, inst):
    tx.push(TupleValue(tx.pop().items))


@handler(Op.SET_ADD)
def set_add(tx, inst):
    value = tx.pop()
    tx.peek(inst.arg).add(value, tx)


@handler(Op.SET_UPDATE)
def set_update(tx, inst):
    value = tx.pop()
    tx.peek(inst.arg).update(tx, value)


@handler(Op.MAP_ADD)
def map_add(tx, inst):
    value = tx.pop()
    key = tx.pop()
    target = tx.peek(inst.arg)
    target.items[target._key(key, tx)] = value
    tx.ctx.effects.mutated(target)


@handler(Op.DICT_UPDATE, Op.DICT_MERGE)
def dict_update(tx, inst):
    value = tx.pop()
    target = tx.peek(inst.arg)
    if not isinstance(value, DictValue):
        raise Unsupported(BreakReason.UNSUPPORTED_OBJECT, f"** of {value.describe()}")
    if inst.op is Op.DICT_MERGE and set(value.items) & set(target.items):
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "got multiple values for a keyword")
    target.items.update(value.items)


@handler(Op.UNPACK_SEQUENCE)
def unpack_sequence(tx, inst):
    items = tx.pop().iterate(tx)
    if len(items) != inst.arg:
        raise Unsupported(
            BreakReason.EXCEPTION_RAISED,
            f"cannot unpack {len(items)} values into {inst.arg}",
        )
    for item in reversed(items):
        tx.push(item)


@handler(Op.UNPACK_EX)
def unpack_ex(tx, inst):
    items = tx.pop().iterate(tx)
    before, after = inst.arg & 0xFF, inst.arg >> 8
    if len(items) < before + after:
        raise Unsupported(BreakReason.EXCEPTION_RAISED, "not enough values to unpack")
    middle = ListValue(items[before : len(items) - after])
    parts = items[:before] + [middle] + items[len(items) - after :]
    for item in reversed(parts):
        tx.push(item)


@handler(Op.BINARY_SUBSCR)
def binary_subscr(tx, inst):
    key = tx.pop()
    container = tx.pop()
    tx.push(container.getitem(tx, index_key(tx, container, key)))


@handler(Op.STORE_SUBSCR)
def store_subscr(tx, inst):
    key = tx.pop()
    container = tx.pop()
    value = tx.pop()
    container.setitem(tx, index_key(tx, container, key), value)


@handler(Op.DELETE_SUBSCR)
def delete_subscr(tx, inst):
    key = tx.pop()
    container = tx.pop()
    container.delitem(tx, index_key(tx, container, key))


@handler(Op.BINARY_SLICE)
def binary_slice(tx, inst):
    end = tx.pop()
    start = tx.pop()
    container = tx.pop()
    tx.push(container.getitem(tx, SliceValue([start, end])))


@handler(Op.STORE_SLICE)
def store_slice(tx, inst):
    end = tx.pop()
    start = tx.pop()
    container = tx.pop()
    value = tx.pop()
    container.setitem(tx, SliceValue([start, end]), value)


def _known(value: Value, doing: str) -> object:
    """The Python value of a constant that is converted or formatted into a string."""
    if not value.is_constant():
        raise Unsupported(
            BreakReason.TENSOR_TO_PYTHON
            if value.python_type().__module__.startswith("torch")
            else BreakReason.UNSUPPORTED_OBJECT,
            f"{doing} {value.describe()} into a string",
        )
    return value.as_constant()


def _convert(tx, value: Value, converter) -> Value:
    """`!s`, `!r`, `!a` of an f-string (converter None: none)."""
    if converter is None:
        return value
    return _text(tx, value, converter) or ConstantValue(converter(_known(value, "converting")))


def _format(tx, value: Value, spec: str) -> Value:
    return _text(tx, value, format, spec) or ConstantValue(
        format(_known(value, "formatting"), spec)
    )


def _text(tx, value: Value, kind, spec: str = "") -> Value | None:
    """An object's own `__str__`/`__repr__`/`__format__`, written in Python, inlined; a
    plain list or tuple holding such objects: its items' reprs, as list.__repr__ joins them."""
    if isinstance(value, UserObjectValue | ModuleValue) and kind in (str, repr, format):
        return value.text(tx, kind, spec)
    if kind in (str, repr, format) and not spec and not value.is_constant():
        kind_of = value.python_type() if isinstance(value, ListValue | TupleValue) else None
        if kind_of in (list, tuple):
            items = value.iterate(tx)
            parts = [_repr_text(tx, item) for item in items]
            if kind_of is list:
                return ConstantValue("[" + ", ".join(parts) + "]")
            return ConstantValue("(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")")
    return None


def _repr_text(tx, item: Value) -> str:
    text = _text(tx, item, repr)
    return repr(_known(item, "formatting")) if text is None else _known(text, "formatting")


@handler(Op.FORMAT_VALUE)
def format_value(tx, inst):
    converter, has_spec = inst.argval
    spec = tx.pop().as_constant() if has_spec else ""
    tx.push(_format(tx, _convert(tx, tx.pop(), converter), spec))


@handler(Op.CONVERT_VALUE)
def convert_value(tx, inst):
    tx.push(_convert(tx, tx.pop(), inst.argval))


@handler(Op.FORMAT_SIMPLE)
def format_simple(tx, inst):
    tx.push(_format(tx, tx.pop(), ""))


@handler(Op.FORMAT_WITH_SPEC)
def format_with_spec(tx, inst):
    spec = tx.pop().as_constant()
    tx.push(_format(tx, tx.pop(), spec))


@handler(Op.GET_LEN)
def get_len(tx, inst):
    tx.push(ConstantValue(tx.peek().length(tx)))
