"""Versions of libraries whose internals rmq-spark relies on, checked at start-up.

`wire.py` and `inbound.py` replace or call private parts of pika (property decoding,
the transport's write loop, the connection's inbound-bytes hook, channel consumer
maps). Those change without notice between pika releases, so only the releases they
were written and tested against are accepted; anything else fails at start-up with
one error instead of misbehaving mid-transfer. Standard library only: the executor
pre-flight reports an executor's pika version before anything else is imported.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

from rmq_spark.errors import UnsupportedDependencyError

# pika's private hooks, as wire.py and inbound.py use them, exist from 1.4.4 on;
# tests/unit/test_compat.py checks them against the installed pika.
SUPPORTED_PIKA = ((1, 4, 4), (1, 5))
SUPPORTED_PIKA_TEXT = ">=1.4.4,<1.5"


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '1.4.4' -> (1, 4, 4), '1.5.0b1' -> (1, 5, 0)."""
    match = re.match(r"\d+(\.\d+)*", version.strip())
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def pika_problem(version: str | None) -> str | None:
    """Why this pika version is unsupported, or None when it is supported."""
    if version is None:
        return "pika is not installed"
    low, high = SUPPORTED_PIKA
    try:
        ok = low <= release(version) < high
    except ValueError:
        ok = False
    if ok:
        return None
    return (
        f"pika {version} is installed, but rmq-spark patches pika internals tested only "
        f"with pika{SUPPORTED_PIKA_TEXT}: install pika==1.4.4 (requirements-runtime.lock)"
    )


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def check_pika() -> None:
    """Raise UnsupportedDependencyError unless the installed pika is supported."""
    problem = pika_problem(installed_version("pika"))
    if problem:
        raise UnsupportedDependencyError(problem)
