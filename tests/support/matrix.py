"""Which runs of the version matrix `make test` holds, and which wait for `make soak`.

The fault scenarios (connections closed, a node restarted, a worker or a whole Erlang VM
SIGKILLed, a scheduler's second driver) run in `make test` on the host's 3.10 and on the
newest 4.x, 4.3. Their 4.0 runs take the same code paths against the release between
them, and the scheduler variants differ only in how the second driver learns its run id
(`run_id.resolve_run_id`, unit-tested for each): those runs are marked `soak` and run in
`make soak`, so that `make test` stays within its time (docs/testing.md, the version
matrix).
"""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.devtools.rabbitmq_roots import VERSIONS

SOAK = pytest.mark.soak
# The release between the host's and the newest: its fault runs are in `make soak`.
SOAK_ONLY_VERSIONS = ("4.0",)


def fault_versions() -> list[Any]:
    """VERSIONS as parameters of `brokers_of_version`, the soak-only ones marked so."""
    return [
        pytest.param(version, marks=SOAK) if version in SOAK_ONLY_VERSIONS else version
        for version in VERSIONS
    ]
