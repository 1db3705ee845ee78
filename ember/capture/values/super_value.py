"""`super()` and `super(cls, obj)` during capture: attribute lookup that starts after `cls`
in the MRO of the object (or of the class itself, for `super()` in a classmethod).

Split from objects.py, which holds the objects the lookup finds methods of."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import torch

from ember.capture.values.base import Value
from ember.capture.values.built_modules import BuiltModuleValue
from ember.capture.values.functions import BoundMethodValue, UserFunctionValue
from ember.capture.values.objects import BuiltinMethodValue
from ember.errors import BreakReason, Unsupported

if TYPE_CHECKING:
    from ember.capture.codegen import Emitter
    from ember.capture.translator import Translator


class SuperValue(Value):
    """`super()` / `super(cls, obj)`: attribute lookup starts after `cls` in obj's MRO."""

    def __init__(self, cls: type, obj: Value) -> None:
        self.cls = cls
        self.obj = obj

    def getattr(self, tx: Translator, name: str) -> Value:
        mro = self._start().__mro__
        if self.cls not in mro:
            raise Unsupported(
                BreakReason.UNSUPPORTED_ATTRIBUTE, f"super().{name}: the object is not a {self.cls}"
            )
        of_a_class = mro[0] is not self.obj.python_type()
        for klass in mro[mro.index(self.cls) + 1 :]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType) and of_a_class:
                    return UserFunctionValue(attr)  # looked up on a class: not bound
                if isinstance(attr, types.FunctionType):
                    if name == "_init_group" and issubclass(mro[0], torch.optim.Optimizer):
                        from ember.capture.values.optimizers import super_init_group

                        run_ahead = super_init_group(self.obj, klass, attr)
                        if run_ahead is not None:
                            return run_ahead
                    return BoundMethodValue(UserFunctionValue(attr), self.obj)
                if attr is torch.nn.Module.__init__ and isinstance(self.obj, BuiltModuleValue):
                    return BoundMethodValue(UserFunctionValue(attr), self.obj)  # modelled
                if attr is object.__init__ or attr is torch.nn.Module.__init__:
                    return BuiltinMethodValue(object.__init__, self.obj)
                if name == "__new__" and attr is object.__new__:  # in a Python `__new__`
                    return tx.ctx.builder.wrap_const(object.__new__)
                if isinstance(attr, property):
                    return UserFunctionValue(attr.fget).call(tx, [self.obj], {})
                if isinstance(attr, staticmethod) and isinstance(attr.__func__, types.FunctionType):
                    return UserFunctionValue(attr.__func__)
                if isinstance(attr, classmethod):
                    cls = tx.ctx.builder.wrap_const(mro[0])
                    return BoundMethodValue(UserFunctionValue(attr.__func__), cls)
                if isinstance(attr, (types.WrapperDescriptorType, types.MethodDescriptorType)):
                    # a builtin base's method (object.__setattr__, dict.__setitem__)
                    return BuiltinMethodValue(attr, self.obj)
                break
        raise Unsupported(BreakReason.UNSUPPORTED_ATTRIBUTE, f"super().{name}")

    def _start(self) -> type:
        """Whose MRO the lookup walks: the object's type, or the object itself where it is a
        subclass of `cls` (`super()` in a classmethod, torch.autograd.Function.apply)."""
        if self.obj.is_constant():
            obj = self.obj.as_constant()
            if isinstance(obj, type) and issubclass(obj, self.cls):
                return obj
        return self.obj.python_type()

    def reconstruct(self, em: Emitter) -> None:
        """`super(cls, obj)` again, for the attribute lookup CPython runs at a break."""
        em.cg.load_const(super, push_null=True)
        em.cg.load_const(self.cls)
        em.reconstruct(self.obj)
        em.cg.call(2)
