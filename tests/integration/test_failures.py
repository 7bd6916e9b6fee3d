"""Failures give one clear error and lose nothing (real brokers, real Spark)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmq_spark.cli import transfer_main
from rmq_spark.config import load_config
from rmq_spark.errors import DestinationIncompatibleError
from rmq_spark.ledger import tables
from rmq_spark.pipeline import run_transfer
from rmq_spark.transfer.executor import ExecutorSettings, move_queue
from tests.support.brokers import (
    PASSWORD_ENV,
    Brokers,
    depth,
    drain_fingerprints,
    fresh_vhost,
    seed,
    write_config,
)


def test_wrong_password_names_the_cluster_and_moves_nothing(
    brokers: Brokers,
    password_env: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    vhost = fresh_vhost(brokers, "fail-auth")
    seed(brokers.dr, vhost, "orders", 20)
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger"
    )
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")

    exit_code = transfer_main(["--config", str(config), "--run-id", "auth-1"])

    err = capsys.readouterr().err
    assert exit_code == 2
    assert "cluster dr" in err
    assert "username or password was refused" in err
    assert "not-the-password" not in err
    assert depth(brokers.dr, vhost, "orders") == 20


def test_missing_destination_is_refused_before_anything_moves(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "fail-missing")
    for queue in ("a", "b"):
        seed(brokers.dr, vhost, queue, 5)
    config = load_config(
        write_config(
            tmp_path / "job.yaml",
            brokers,
            vhosts=[vhost],
            ledger=tmp_path / "ledger",
            destination={"create_missing": False},
        )
    )

    with pytest.raises(DestinationIncompatibleError) as info:
        run_transfer(spark, config, run_id="missing-1")

    message = str(info.value)
    assert f"cluster main vhost '{vhost}' queue 'a'" in message
    assert f"cluster main vhost '{vhost}' queue 'b'" in message  # every problem, at once
    assert depth(brokers.dr, vhost, "a") == 5
    assert depth(brokers.dr, vhost, "b") == 5


def test_refused_messages_stay_in_the_source_and_the_rest_is_ledgered(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    """A destination that takes 10 messages and nacks the rest (reject-publish)."""
    vhost = fresh_vhost(brokers, "fail-nack")
    seed(brokers.dr, vhost, "orders", 50)
    connection = brokers.main.connect(vhost)
    connection.channel().queue_declare(
        "orders", durable=True, arguments={"x-max-length": 10, "x-overflow": "reject-publish"}
    )
    connection.close()
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    )
    tables.ensure_tables(config.ledger.path)
    settings = ExecutorSettings(
        run_id="nack-1",
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=5,
        window_bytes=1 << 20,
    )
    row = {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": "orders",
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": "orders",
        "messages": 50,
        "message_bytes": 50 * 1024,
    }

    outcome = move_queue(row, settings, "local")

    assert outcome.status == "failed"
    assert "nacked" in (outcome.error or "")
    assert "dr:fail-nack:orders" in (outcome.error or "")
    in_destination = depth(brokers.main, vhost, "orders")
    in_source = depth(brokers.dr, vhost, "orders")
    assert in_destination == 10
    assert in_source + in_destination == 50  # nothing lost, nothing doubled
    tables.commit_run(config.ledger.path, "nack-1")

    ledger = tables.read_arrow(config.ledger.path, "messages")
    assert ledger.num_rows == in_destination
    # The rows are exactly the messages that reached the destination.
    expected = drain_fingerprints(lambda: brokers.main.connect(vhost), "orders")
    assert (
        Counter(
            zip(
                ledger["body_sha256"].to_pylist(),
                ledger["properties_sha256"].to_pylist(),
                strict=True,
            )
        )
        == expected
    )
    assert sorted(ledger["position"].to_pylist()) == list(range(10))


def test_empty_source_queue_finishes_with_nothing_to_move(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "empty")
    connection = brokers.dr.connect(vhost)
    connection.channel().queue_declare("idle", durable=True)
    connection.close()
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    )
    tables.ensure_tables(config.ledger.path)
    settings = ExecutorSettings("empty-1", config.ledger.path, dict(config.clusters), 10, 1 << 20)
    row = {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": "idle",
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": "idle",
        "messages": 0,
        "message_bytes": 0,
    }
    connection = brokers.main.connect(vhost)
    connection.channel().queue_declare("idle", durable=True)
    connection.close()

    outcome = move_queue(row, settings, "local")

    assert (outcome.status, outcome.messages, outcome.error) == ("moved", 0, None)
    assert tables.commit_run(config.ledger.path, "empty-1") == 0
