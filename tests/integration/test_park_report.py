"""The run report of a park and of its replay: messages by source, destination, and the
origin queue and reason of each message's newest death (`report/parked.py`).

A DLQ the broker filled itself (tests/support/dead_letters.py: rejected in two origin
queues, expired in a third, and one stray that never died) is parked and replayed to
another queue, on real nodes, Spark and Delta; each run's report counts what was
published into the DLQ, by origin and reason, with the bodies' bytes.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from pyspark.sql import SparkSession

from rmq_spark.park.replay.run import run_replay
from rmq_spark.park.replay.targets import parse_template
from rmq_spark.park.run import run_park
from rmq_spark.report.figures import load_run
from rmq_spark.report.html import build_report
from rmq_spark.report.parked import PARKED, parked_counts
from tests.support.brokers import Brokers, declare, fresh_vhost
from tests.support.dead_letters import Published, make_dead_letters
from tests.support.notebooks import NOTEBOOK, run_notebook
from tests.support.parking import QUEUE, park_config


def test_the_reports_of_a_park_and_its_replay_count_by_source_origin_and_death(
    brokers: Brokers,
    password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = brokers.dr
    vhost = fresh_vhost(brokers, "park-report")
    published = make_dead_letters(node, vhost, QUEUE, per_queue=5)
    config = park_config(tmp_path, brokers, vhost)
    assert run_park(spark, config, run_id="park-r").verified
    declare(node, vhost, "replayed")
    replay = run_replay(
        config,
        parked_run_id="park-r",
        target=parse_template(f"dr:{vhost}:replayed"),
        run_id="replay-r",
    )
    assert replay.verified

    expected = Counter((m.origin, m.reason) for m in published)
    assert len(expected) == 4  # two rejecting origins, one expiring, the stray
    ledger = str(tmp_path / "ledger")
    for run_id, destination, title in (
        ("park-r", PARKED, "Parked by source and death reason"),
        ("replay-r", f"dr/{vhost}/replayed", "Replayed by source and death reason"),
    ):
        counts = parked_counts(ledger, run_id, load_run(ledger, run_id).messages)
        assert {c.source for c in counts} == {f"dr/{vhost}/{QUEUE}"}, run_id
        assert {c.destination for c in counts} == {destination}, run_id
        assert Counter({(c.origin, c.reason): c.messages for c in counts}) == expected, run_id
        assert sum(c.bytes for c in counts) == sum(len(m.body) for m in published), run_id
        page = build_report(ledger, run_id).read_text(encoding="utf-8")
        assert title in page, run_id
        for (origin, reason), count in expected.items():
            cells = f"<td>{origin or ''}</td><td>{reason or 'never died'}</td>"
            assert f'{cells}<td class="num">{count:,}</td>' in page, (run_id, origin)

    notebook_groups_the_parked_dlq(ledger, published, tmp_path, spark, capsys)


def notebook_groups_the_parked_dlq(
    ledger: str,
    published: list[Published],
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The analysts' notebook, headless on the park's ledger: its DuckDB cell groups the
    parked DLQ by origin, reason and tenant; its Spark cell (run here, in the suite's
    session, as test_run_report runs the other) does the same with Spark SQL."""
    expected = Counter((m.origin, m.reason, m.tenant) for m in published)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    environment = {**os.environ, "RMQ_SPARK_LEDGER": ledger, "RMQ_SPARK_RUN_ID": "park-r"}
    text = run_notebook(notebook, tmp_path, Path(sys.executable), environment)
    assert f"parked run park-r: {len(published):,} messages" in text
    for (origin, reason, tenant), count in expected.items():
        # source_queue  origin  reason  tenant  messages  bytes (pandas prints None)
        row = rf"{QUEUE}\s+{origin}\s+{reason}\s+{tenant}\s+{count}\s"
        assert re.search(row, text), (row, text)

    (cell,) = [c for c in notebook.cells if "spark-parked" in c.metadata.get("tags", [])]
    namespace = {
        "USE_SPARK": True,
        "spark": spark,
        "parked": True,
        "LEDGER_PATH": ledger,
        "PARKED_RUN_ID": "park-r",
        "PARKED_HEADER": "tenant",
    }
    capsys.readouterr()
    exec(compile(cell.source, f"{NOTEBOOK.name}:spark-parked", "exec"), namespace)
    shown = capsys.readouterr().out
    for (origin, reason, tenant), count in expected.items():
        # origin | reason | tenant | messages (Spark shows NULL)
        cells = [origin or "NULL", reason or "NULL", tenant, str(count)]
        row = r"\|" + r"\s*\|".join(re.escape(c) for c in cells) + r"\s*\|"
        assert re.search(row, shown), (row, shown)
