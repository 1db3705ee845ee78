"""EMBER_LOGS channels on Python's logging: `EMBER_LOGS=graph_code,guards` or `set_logs(...)`.

Each channel is a logger `ember.<channel>`; enabling one sets it to DEBUG with a stderr handler.
Code asks `enabled(channel)` before building an expensive message.
"""

from __future__ import annotations

import logging
import os
import sys

CHANNELS = (
    "graph_code",
    "guards",
    "bytecode",
    "recompiles",
    "graph_breaks",
    "side_effects",
    "aot",
    "kernels",
    "schedule",
    "dynamic",
    "autotune",
    "cudagraphs",
)

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[ember.%(channel)s] %(message)s"))


class _ChannelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.channel = record.name.removeprefix("ember.")
        return True


_handler.addFilter(_ChannelFilter())
_enabled: set[str] = set()


def get(channel: str) -> logging.Logger:
    """The logger of one channel."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown log channel {channel!r}; known: {', '.join(CHANNELS)}")
    return logging.getLogger(f"ember.{channel}")


def set_logs(*channels: str) -> None:
    """Enable exactly these channels (names as in EMBER_LOGS); no arguments disables all."""
    _enabled.clear()
    for name in CHANNELS:
        logger = get(name)
        on = name in channels
        logger.setLevel(logging.DEBUG if on else logging.WARNING)
        if on and _handler not in logger.handlers:
            logger.addHandler(_handler)
        if not on and _handler in logger.handlers:
            logger.removeHandler(_handler)
        if on:
            _enabled.add(name)
    unknown = set(channels) - set(CHANNELS)
    if unknown:
        raise ValueError(f"unknown log channels {sorted(unknown)}; known: {', '.join(CHANNELS)}")


def enabled(channel: str) -> bool:
    """Whether a channel is on (via EMBER_LOGS, set_logs, or a logger configured by the user)."""
    return channel in _enabled or get(channel).isEnabledFor(logging.DEBUG)


def log(channel: str, message: str, *args: object) -> None:
    get(channel).debug(message, *args)


_env = [c.strip() for c in os.environ.get("EMBER_LOGS", "").split(",") if c.strip()]
if _env:
    set_logs(*_env)
