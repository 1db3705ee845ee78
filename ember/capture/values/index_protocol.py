"""`operator.index(obj)`, `bin`, `oct` and `hex` of an object whose class writes `__index__`
in Python: CPython calls it, so the trace inlines it and applies the builtin to the int it
gives (`capture/operators.py` `index_key` does the same where such an object indexes a
sequence or a tensor)."""

from __future__ import annotations

import operator
from typing import Any

from ember.capture.operators import index_of
from ember.capture.values.base import ConstantValue
from ember.capture.values.builtins import handles
from ember.capture.values.functions import BuiltinValue


def _through_index(fn: Any) -> Any:
    def handler(tx, args, kwargs):
        if len(args) == 1 and not kwargs:
            number = index_of(tx, args[0])
            if number is not None:
                return ConstantValue(fn(number.as_constant()))
        return BuiltinValue(fn).call_unlisted(tx, args, kwargs)

    return handler


for _fn in (operator.index, bin, oct, hex):
    handles(_fn)(_through_index(_fn))
