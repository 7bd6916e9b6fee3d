"""The run report, the ledger notebook and LEDGER.md's examples, read from a real ledger.

Two small transfers between the test nodes build the ledger (one queue x 100 messages,
then the run under test, 2 queues x 500 messages); then the report is written (as a
function and as `rmq-spark report`), the analysts' notebook is executed headless
against it, failing on any cell error, and so are docs/LEDGER.md's Python examples.
The command and the notebook also run from the installed wheel alone (no pyspark, no
checkout: tests/support/wheel_env.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest
from pyspark.sql import SparkSession

from rmq_spark.cli import main
from rmq_spark.config import load_config
from rmq_spark.pipeline import run_transfer
from rmq_spark.report.html import build_report
from tests.support.brokers import PASSWORD_ENV, Brokers, fresh_vhost, seed, write_config
from tests.support.notebooks import NOTEBOOK, run_notebook
from tests.support.wheel_env import WheelEnv

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "report-1"
EARLIER_RUN_ID = "report-0"
EARLIER_MESSAGES = 100
QUEUES = ("invoices", "payments")
MESSAGES_PER_QUEUE = 500
# A src or href to another host: absolute (scheme://) or protocol-relative (//host).
EXTERNAL_LINK = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//""", re.I)


@pytest.fixture(scope="module")
def ledger(brokers: Brokers, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ledger of two verified runs (the one under test is the latest), shared by the
    tests of this module."""
    base = tmp_path_factory.mktemp("run-report")
    vhost = fresh_vhost(brokers, "run-report")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PASSWORD_ENV, brokers.dr.password)
        config = load_config(
            write_config(base / "job.yaml", brokers, vhosts=[vhost], ledger=base / "ledger")
        )
        seed(brokers.dr, vhost, QUEUES[0], EARLIER_MESSAGES)
        assert run_transfer(spark, config, run_id=EARLIER_RUN_ID).verification.verified
        for queue in QUEUES:
            seed(brokers.dr, vhost, queue, MESSAGES_PER_QUEUE)
        result = run_transfer(spark, config, run_id=RUN_ID)
    assert result.verification.verified
    return base / "ledger"


def test_report_is_one_self_contained_page_naming_every_queue(ledger: Path) -> None:
    path = build_report(str(ledger), RUN_ID)

    assert path == (ledger / "reports" / f"run_id={RUN_ID}" / "report.html").resolve()
    page = path.read_text(encoding="utf-8")
    assert not EXTERNAL_LINK.search(page), EXTERNAL_LINK.search(page)
    assert "<link" not in page
    assert "<script" not in page
    assert page.count('<img src="data:image/png;base64,') == 2  # throughput, latency
    for queue in QUEUES:
        assert f"/run-report/{queue}</td>" in page
    assert '<span class="badge ok">verified</span>' in page
    assert "Every expectation passed." in page
    assert "<b>1,000</b>" in page  # messages moved
    assert "1,000 confirmed messages: p50 " in page
    # The Data Docs link is relative to the page and leads to the rendered docs.
    docs = re.search(r'Data Docs: <a href="([^"]+)"', page)
    assert docs is not None
    assert not docs.group(1).startswith("/")
    assert (path.parent / unquote(docs.group(1))).resolve().is_file()


def test_report_command_prints_the_path(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.html"

    exit_code = main(["report", RUN_ID, "--ledger", str(ledger), "--out", str(out)])

    assert exit_code == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert "Every expectation passed." in out.read_text(encoding="utf-8")


def test_report_command_takes_the_ledger_from_a_config_without_its_password(
    ledger: Path,
    brokers: Brokers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config(tmp_path / "job.yaml", brokers, vhosts=["run-report"], ledger=ledger)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)

    exit_code = main(["report", RUN_ID, "--config", str(config)])

    assert exit_code == 0
    expected = (ledger / "reports" / f"run_id={RUN_ID}" / "report.html").resolve()
    assert capsys.readouterr().out == f"{expected}\n"


def test_report_of_an_unknown_run_names_the_run_and_the_ledger(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code = main(["report", "no-such-run", "--ledger", str(ledger)])

    captured = capsys.readouterr()
    assert exit_code == 2
    assert captured.out == ""
    assert captured.err.startswith(
        f"rmq-spark: error: run 'no-such-run' is not in the ledger at {ledger}: "
        f"its runs table has 2 run(s), the latest '{RUN_ID}'"
    )


def test_report_command_runs_from_the_wheel_alone(
    ledger: Path, wheel_env: WheelEnv, tmp_path: Path
) -> None:
    out = tmp_path / "run.html"

    report = subprocess.run(
        [str(wheel_env.rmq_spark), "report", RUN_ID, "--ledger", str(ledger), "--out", str(out)],
        cwd=tmp_path,
        env=wheel_env.environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert report.returncode == 0, report.stderr
    assert report.stdout == f"{out}\n"
    assert "Every expectation passed." in out.read_text(encoding="utf-8")


def test_notebook_runs_headless_from_the_installed_wheel(
    ledger: Path, wheel_env: WheelEnv, tmp_path: Path
) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # Where the kernel's rmq_spark came from, printed after the notebook's own cells.
    notebook.cells.append(nbformat.v4.new_code_cell("import rmq_spark\nprint(rmq_spark.__file__)"))
    # Any cell error raises CellExecutionError, which fails the test; `tmp_path` is
    # outside the checkout.
    text = run_notebook(
        notebook,
        tmp_path,
        wheel_env.python,
        wheel_env.environment(
            {
                "RMQ_SPARK_LEDGER": str(ledger),
                "RMQ_SPARK_RUN_ID": RUN_ID,
                "RMQ_SPARK_MESSAGE_ID": f"run-report/{QUEUES[0]}/7",
            }
        ),
    )

    (imported,) = notebook.cells[-1].outputs
    assert imported["text"].startswith(str(wheel_env.root / "lib"))
    assert f"ledger {ledger}, run {RUN_ID}, Spark off" in text
    assert f"run {RUN_ID}: 2 queues, 1,000 messages" in text
    for queue in QUEUES:
        assert f"/run-report/{queue}" in text
    assert "0 of 1,000 rows share their checksums" in text
    images = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 2  # throughput, latency
    # polars: the message moved in both runs (the earlier run had messages 0-99 of the
    # first queue; the seed numbers each batch from 0).
    assert f"message_id 'run-report/{QUEUES[0]}/7': 2 row(s) in 2 run(s)" in text
    # DuckDB: this run against the one before it, run by run and queue by queue.
    assert f"run {RUN_ID} against run {EARLIER_RUN_ID}" in text
    assert re.search(rf"{EARLIER_RUN_ID}\s+1\s+{EARLIER_MESSAGES}\s", text), text
    assert re.search(rf"{RUN_ID}\s+2\s+{2 * MESSAGES_PER_QUEUE}\s", text), text
    assert re.search(rf"{QUEUES[0]}\s+{MESSAGES_PER_QUEUE}\s+{EARLIER_MESSAGES}\s", text), text
    assert re.search(rf"{QUEUES[1]}\s+{MESSAGES_PER_QUEUE}\s+<NA>\s", text), text
    assert "USE_SPARK is False" in text


def test_notebook_spark_cell_queries_the_ledger(
    ledger: Path, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    # The Spark cell runs here, in the suite's Spark session (its build_session gets the
    # running one), rather than starting a second JVM inside the kernel.
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    (spark_cell,) = [c for c in notebook.cells if "spark" in c.metadata.get("tags", [])]
    namespace = {"USE_SPARK": True, "LEDGER_PATH": str(ledger), "RUN_ID": RUN_ID}

    exec(compile(spark_cell.source, f"{NOTEBOOK.name}:spark", "exec"), namespace)

    shown = capsys.readouterr().out
    for queue in QUEUES:
        # source_vhost | source_queue | ledger_rows | uncertain_rows | redelivered_rows
        row = rf"\|run-report\s*\|{queue}\s*\|{MESSAGES_PER_QUEUE}\s*\|0\s*\|0\s*\|"
        assert re.search(row, shown), shown


LEDGER_DOC = REPO / "docs" / "LEDGER.md"


def ledger_doc_python_blocks() -> dict[str, str]:
    """docs/LEDGER.md's Python examples, by the section they stand in."""
    doc = LEDGER_DOC.read_text(encoding="utf-8")
    examples = doc.split("## Example queries", 1)[1]
    blocks = {}
    for section in re.split(r"^### ", examples, flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        for index, code in enumerate(re.findall(r"```python\n(.*?)```", section, flags=re.S)):
            blocks[f"{title} #{index + 1}"] = code
    return blocks


def test_ledger_doc_python_examples_run_against_a_real_ledger(
    ledger: Path, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = ledger_doc_python_blocks()
    # delta-rs's own to_pyarrow_table can abort the process at exit with these
    # versions (the doc says so, and why read_ledger_table avoids it): not run in the
    # suite's process.
    blocks.pop("Without rmq-spark installed #1")
    assert set(blocks) == {"Spark SQL #1", "DuckDB #1", "polars #1", "pandas #1"}
    message_id = f"run-report/{QUEUES[0]}/7"
    for name, code in blocks.items():
        namespace = {"LEDGER": str(ledger), "RUN": RUN_ID, "MESSAGE_ID": message_id}
        exec(compile(code, f"LEDGER.md: {name}", "exec"), namespace)
        if name == "Spark SQL #1":
            names = {t.name for t in spark.catalog.listTables()}
            assert {"runs", "queues", "messages", "plans"} <= names
            counted = spark.sql(f"SELECT count(*) FROM messages WHERE run_id = '{RUN_ID}'").first()
            assert counted is not None
            assert counted[0] == len(QUEUES) * MESSAGES_PER_QUEUE
        if name == "pandas #1":
            assert len(namespace["messages"]) == len(QUEUES) * MESSAGES_PER_QUEUE

    shown = capsys.readouterr().out
    for queue in QUEUES:  # DuckDB's and polars' per-queue tables
        assert len(re.findall(rf"\b{queue}\b.*\b{MESSAGES_PER_QUEUE}\b", shown)) >= 2, shown
    # polars' lookup: the message moved in both runs
    assert re.search(rf"{EARLIER_RUN_ID}.*{QUEUES[0]}.*\b7\b", shown), shown
    assert re.search(rf"{RUN_ID}.*{QUEUES[0]}.*\b7\b", shown), shown
