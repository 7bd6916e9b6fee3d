"""The run id a driver takes: --run-id, else its scheduler's, else a new one."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from rmq_spark.errors import ConfigError
from rmq_spark.run_id import resolve_run_id, yarn_application_id

NOW = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
# Attempts 1 and 2 of one YARN application (ApplicationMaster containers, with and
# without the epoch part Hadoop 2.6 added), and a container of another application.
FIRST_ATTEMPT = "container_e17_1700000000000_0042_01_000001"
SECOND_ATTEMPT = "container_e17_1700000000000_0042_02_000001"
NO_EPOCH = "container_1700000000000_0042_02_000001"


@pytest.mark.parametrize("container", [FIRST_ATTEMPT, SECOND_ATTEMPT, NO_EPOCH])
def test_every_attempt_of_a_yarn_application_has_its_application_id(container: str) -> None:
    assert yarn_application_id(container) == "application_1700000000000_0042"


def test_a_large_yarn_sequence_number_is_kept_whole() -> None:
    assert (
        yarn_application_id("container_1700000000000_123456_01_000001")
        == "application_1700000000000_123456"
    )


@pytest.mark.parametrize("value", ["", "container_x_1_01_1", "application_1700000000000_0042"])
def test_what_is_not_a_yarn_container_id_gives_none(value: str) -> None:
    assert yarn_application_id(value) is None


def test_the_command_lines_run_id_comes_first() -> None:
    environ = {"RMQ_SPARK_RUN_ID": "from-env", "CONTAINER_ID": FIRST_ATTEMPT}
    assert resolve_run_id("1029384756", environ) == ("1029384756", "--run-id")


def test_the_environment_variable_comes_before_yarn() -> None:
    environ = {"RMQ_SPARK_RUN_ID": "nightly-move", "CONTAINER_ID": FIRST_ATTEMPT}
    assert resolve_run_id(None, environ) == ("nightly-move", "RMQ_SPARK_RUN_ID")


def test_two_attempts_of_a_yarn_application_resume_one_run() -> None:
    first = resolve_run_id(None, {"CONTAINER_ID": FIRST_ATTEMPT})
    second = resolve_run_id(None, {"CONTAINER_ID": SECOND_ATTEMPT})
    assert first == second == ("application_1700000000000_0042", "YARN CONTAINER_ID")


def test_without_a_scheduler_id_each_driver_starts_a_new_run() -> None:
    run_id, source = resolve_run_id(None, {"RMQ_SPARK_RUN_ID": "  "}, now=NOW)
    assert source == "new"
    assert re.fullmatch(r"20261125T100000Z-[0-9a-f]{6}", run_id)
    assert resolve_run_id(None, {}, now=NOW)[0] != run_id  # the random suffix


@pytest.mark.parametrize(
    ("given", "environ"),
    [("../etc", {}), (None, {"RMQ_SPARK_RUN_ID": "run id with spaces"})],
)
def test_a_run_id_with_unsafe_characters_is_refused(
    given: str | None, environ: dict[str, str]
) -> None:
    with pytest.raises(ConfigError, match="run id"):
        resolve_run_id(given, environ)
