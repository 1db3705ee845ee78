"""The bytecode layer (no torch import): decoding, the version tables and code assembly.

Every difference between CPython 3.11 and 3.12 that ember cares about lives in this package.
"""

from ember.bytecode.assemble import CodeBuilder
from ember.bytecode.decode import Inst, decode
from ember.bytecode.ops import PY312, UNSUPPORTED, Op

__all__ = ["PY312", "UNSUPPORTED", "CodeBuilder", "Inst", "Op", "decode"]
