"""Zero-argument `super()` across graph breaks and in classmethods (issue 12).

On 3.11, `super()` finds its object as the frame's first local, without naming it in the
bytecode: a resume function of a method whose first parameters were the stack values at
the break (and which did not even receive `self`, dead to the liveness analysis) raised
"super(type, obj): obj must be an instance or subtype of type". A custom
torch.autograd.Function hit it inside `Function.apply` (`super().apply(...)` in a
classmethod, whose lookup also walked the metaclass's MRO)."""

from __future__ import annotations

import pytest
import torch
from fidelity_harness import check, tensors

import ember


class _Base:
    def scale(self, x):
        return x + 1

    @classmethod
    def make(cls, x):
        return x * cls.K

    @staticmethod
    def shift(x):
        return x - 1

    K = 2


class _Derived(_Base):
    K = 3

    def scale(self, x):
        y = x * 2
        print("break")
        return super().scale(y) * self.K

    @classmethod
    def make(cls, x):
        return super().make(x) + super().shift(x)


def super_after_a_break(x):
    return _Derived().scale(x)


def super_in_classmethods(x):
    return _Derived.make(x), _Derived().make(x)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def custom_autograd_function(x):
    return _Square.apply(x.sin()).sum()


@pytest.mark.parametrize("fn", [super_after_a_break, super_in_classmethods])
def test_zero_argument_super(fn):
    check(fn, tensors((3,)))


def test_custom_autograd_function_values_and_gradients():
    x = torch.randn(4, requires_grad=True)
    x_ours = x.detach().clone().requires_grad_()
    expected = custom_autograd_function(x)
    expected.backward()
    ember.reset()
    got = ember.compile(custom_autograd_function)(x_ours)
    got.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x_ours.grad, x.grad)
    assert ember.stats()["eager_frames"] == 0, ember.stats()["break_reasons"]
