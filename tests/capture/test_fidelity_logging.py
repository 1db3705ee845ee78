"""Logging and lru_cache wrappers at graph breaks (found on GPT-2, whose attention calls
transformers' `logger.warning_once`, an lru_cache'd function set on logging.Logger): logging's
functions run in plain Python as under torch.compile, never captured frame by frame, and a
call through an lru_cache wrapper that breaks calls the wrapper, so the cache still decides
(a `warning_once` warns once, as eagerly)."""

from __future__ import annotations

import functools
import logging

import torch
from fidelity_harness import check, tensors

LOGGER = logging.getLogger("ember.tests.fidelity_logging")


@functools.lru_cache(None)
def _warn_once(logger, message):
    print("warned:", message)
    logger.warning(message)


class _Logger(logging.Logger):
    """transformers' pattern: a cached function set as a Logger method."""

    warning_once = _warn_once


ONCE = _Logger("ember.tests.warning_once")


def _reset():
    _warn_once.cache_clear()


def inner(x):
    ONCE.warning_once("careful")
    return x * 2


def outer(x):
    return inner(x + 1) - 1


def repeated(x):
    for _ in range(3):
        x = inner(x)
    return x


def plain_logging(x):
    y = x.sin()
    LOGGER.warning("halfway: %s", "y")
    return y.cos()


def test_warning_once_through_a_method_warns_once_and_breaks_like_dynamo():
    check(outer, tensors((3,)), reset=_reset)


def test_a_cached_call_at_each_break_is_looked_up_in_the_cache():
    counts = check(repeated, tensors((3,)), reset=_reset)
    assert counts.eager_frames == 0


def test_logging_calls_break_once_and_logging_itself_is_not_captured():
    counts = check(plain_logging, tensors((4,)))
    assert (counts.graphs, counts.breaks) == (2, 1)


def test_compiled_warning_once_is_silent_after_the_first_call():
    import ember

    _reset()
    compiled = ember.compile(inner, backend="eager")
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.ones(2))
    assert _warn_once.cache_info().currsize == 1 and _warn_once.cache_info().hits == 2
