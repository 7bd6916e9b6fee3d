"""The job on a real Spark standalone cluster whose workers have no Python at all.

A module fixture starts a master and two workers from the pip pyspark's
`bin/spark-class` (pip ships no sbin start scripts) on free loopback ports. Each
worker runs under chroot in a Debian root that holds Java 17 and no Python
(rmq_spark.devtools.worker_root), in its own mount namespace: it sees the Spark jars
(bound at /opt/spark), its own work directory and one shared directory for ledgers,
and neither the builder's interpreter, nor the checkout, nor any Python 3.11, as on a
YARN node. A private tmpfs at one directory makes a ledger there "local to each host".
The job runs there only with the executor archive `make executor-archive` builds (its
own CPython), shipped by `spark-submit.sh --env-archive`, and gives the same ledger as
local[*]; without it the executor pre-flight refuses the run with exit 2, naming the
interpreter that cannot start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from rmq_spark.devtools import worker_root
from rmq_spark.ledger import tables
from rmq_spark.report.console import RESULT_PREFIX
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    fresh_vhost,
    job_environment,
    seed,
    write_config,
)
from tests.support.standalone import alive_workers, free_port

REPO = Path(__file__).resolve().parents[2]
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
WORKERS = 2
QUEUES = ("q1", "q2", "q3", "q4")
MESSAGES = 2000
START_TIMEOUT_SECONDS = 120
NOT_SHARED = "not-shared"
SHARED = "shared"


@pytest.fixture(scope="module")
def env_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executor archive, built by `make executor-archive` as a user would (~1 min;
    its CPython comes from the cache `make roots` fills)."""
    dist = tmp_path_factory.mktemp("dist")
    completed = subprocess.run(
        ["make", "-s", "-C", str(REPO), "executor-archive", f"DIST={dist}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    (archive,) = dist.glob("rmq-spark-executor-env-*.tar.gz")
    return archive


@pytest.fixture(scope="module")
def standalone_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-standalone")


@pytest.fixture
def shared_dir(standalone_work: Path, request: pytest.FixtureRequest) -> Path:
    """A directory the driver and every worker see (as an NFS mount would be)."""
    path = standalone_work / SHARED / str(request.node.name)
    path.mkdir(parents=True)
    return path


# Run by sh inside the worker's new mount namespace: $0 the root, $1 the work
# directory (seen at the same path inside), $2 the per-worker private directory,
# $3 the pyspark package; then the worker's command, run under chroot with nothing of
# this process's environment.
WORKER_MOUNTS = """
root="$0"; work="$1"; private="$2"; spark="$3"; shift 3
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs worker-tmp "$root/tmp"
mkdir -p "$root$work" && mount --bind "$work" "$root$work"
mount -t tmpfs rmq-spark-not-shared "$root$private"
mount --bind "$spark" "$root/opt/spark"
exec chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root SPARK_LOCAL_IP=127.0.0.1 \
  JAVA_HOME="$JAVA_HOME" SPARK_HOME=/opt/spark SPARK_LOG_DIR="$work" "$@"
"""


@pytest.fixture(scope="module")
def standalone_master(standalone_work: Path) -> Iterator[str]:
    fs_root = worker_root.ensure_worker_root()
    work = standalone_work
    port, ui_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work),
    }
    logs = [open(work / f"{name}.log", "w") for name in ("master", *map(str, range(WORKERS)))]  # noqa: SIM115
    processes = [
        subprocess.Popen(
            [
                str(SPARK_CLASS),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            env=env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    private = work / NOT_SHARED
    private.mkdir()
    (work / SHARED).mkdir()
    for index in range(WORKERS):
        processes.append(
            subprocess.Popen(
                [
                    # unshare execs sh, which execs chroot, env and spark-class, which
                    # execs the JVM: the Popen's pid is the worker's.
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "sh",
                    "-c",
                    WORKER_MOUNTS,
                    str(fs_root),
                    str(work),
                    str(private),
                    str(SPARK_CLASS.parents[1]),
                    f"{worker_root.SPARK_HOME}/bin/spark-class",
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work / f"worker-{index}"),
                ],
                env={"JAVA_HOME": worker_root.JAVA_HOME},
                stdout=logs[index + 1],
                stderr=subprocess.STDOUT,
            )
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while alive_workers(ui_port) < WORKERS:
            assert time.monotonic() < deadline, f"standalone cluster not up; logs in {work}"
            assert all(p.poll() is None for p in processes), f"a Spark daemon died; logs in {work}"
            time.sleep(0.5)
        for worker in processes[1:]:
            assert_sees_no_builder_python(Path(f"/proc/{worker.pid}/root"))
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        for log in logs:
            log.close()


def assert_sees_no_builder_python(view: Path) -> None:
    """`view` is a worker's file system (/proc/PID/root): nothing of the builder's Python."""
    assert (view / "opt/spark/jars").is_dir(), "not a worker's root"
    for builder_path in (sys.executable, os.path.realpath(sys.executable), REPO):
        assert not (view / str(builder_path).lstrip("/")).exists(), builder_path
    assert worker_root.pythons_in(view) == []
    assert not list(view.glob("usr/lib/python3*"))
    assert not list(view.glob("usr/local/lib/python*"))


def submit(config: Path, run_id: str, *spark_args: str) -> subprocess.CompletedProcess[str]:
    # Nothing of this machine's Python is exported: spark-submit.sh decides.
    environ = {
        key: value
        for key, value in job_environment().items()
        if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    return subprocess.run(
        [str(REPO / "spark-submit.sh"), *spark_args, "--config", str(config), "--run-id", run_id],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def run_job(config: Path, run_id: str, *spark_args: str) -> dict[str, object]:
    completed = submit(config, run_id, *spark_args)
    assert completed.returncode == 0, completed.stderr[-4000:]
    (line,) = [x for x in completed.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    result: dict[str, object] = json.loads(line[len(RESULT_PREFIX) :])
    return result


def ledger_content(ledger: Path, run_id: str) -> dict[str, Counter[tuple[str, str]]]:
    rows = tables.read_arrow(str(ledger), "messages", run_id=run_id)
    content: dict[str, Counter[tuple[str, str]]] = {}
    for row in rows.to_pylist():
        content.setdefault(row["source_queue"], Counter())[
            (row["body_sha256"], row["properties_sha256"])
        ] += 1
    return content


@pytest.mark.usefixtures("password_env")
def test_with_the_archive_workers_without_python_give_the_same_ledger_as_local(  # noqa: PLR0917
    brokers: Brokers,
    tmp_path: Path,
    shared_dir: Path,
    standalone_master: str,
    standalone_work: Path,
    env_archive: Path,
) -> None:
    vhost = fresh_vhost(brokers, "standalone")
    ledger = shared_dir / "ledger"
    # max_active 4 with two queues per task: two tasks, one per worker.
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=ledger, max_active=4
    )
    results, contents = {}, {}
    on_cluster = ("--master", standalone_master, "--env-archive", str(env_archive))
    for run_id, master in (("on-local", ()), ("on-standalone", on_cluster)):
        for queue in QUEUES:  # the same deterministic messages for both runs
            seed(brokers.dr, vhost, queue, MESSAGES)
            declare(brokers.main, vhost, queue)
        results[run_id] = run_job(config, run_id, *master)
        contents[run_id] = ledger_content(ledger, run_id)

    for result in results.values():
        assert result["verified"] is True
        assert result["messages"] == len(QUEUES) * MESSAGES
        assert (result["lost"], result["duplicates"]) == (0, 0)
    assert contents["on-standalone"] == contents["on-local"]
    assert set(contents["on-local"]) == set(QUEUES)
    # The second run really ran on the cluster: standalone application ids start "app-".
    runs = tables.read_arrow(str(ledger), "runs").to_pylist()
    app_ids = {run["run_id"]: run["spark_app_id"] for run in runs}
    assert app_ids["on-local"].startswith("local-")
    assert app_ids["on-standalone"].startswith("app-")
    # Each executor ran the CPython of the archive Spark unpacked into its working
    # directory (a file, not a link to the builder's interpreter).
    unpacked = list(standalone_work.glob("worker-*/app-*/*/environment/bin/python3.11"))
    assert len({path.parents[4] for path in unpacked}) == WORKERS, unpacked
    assert not any(path.is_symlink() for path in unpacked)


def test_without_the_archive_workers_without_python_are_refused_before_anything_moves(
    brokers: Brokers, password_env: str, tmp_path: Path, shared_dir: Path, standalone_master: str
) -> None:
    vhost = fresh_vhost(brokers, "standalone-bare")
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=shared_dir / "ledger", max_active=4
    )
    seed(brokers.dr, vhost, "q1", 100)
    declare(brokers.main, vhost, "q1")

    completed = submit(config, "bare", "--master", standalone_master)

    # spark-submit's PythonRunner merges the driver's stderr into its stdout.
    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-4000:]
    errors = [line for line in output.splitlines() if "rmq-spark: error:" in line]
    assert errors == [
        "rmq-spark: error: executor pre-flight refused the run; nothing was moved:"
    ], output[-4000:]
    # One line: Spark's default interpreter (no archive, no PYSPARK_PYTHON), the cause.
    (problem,) = [line for line in output.splitlines() if "cannot start" in line]
    assert "the executors' Python python3 cannot start on host 127.0.0.1 (executor " in problem
    assert "): No such file or directory (error=2); ship the executor archive" in problem
    assert "Py4JJavaError" not in output
    assert (depth(brokers.dr, vhost, "q1"), depth(brokers.main, vhost, "q1")) == (100, 0)


@pytest.mark.usefixtures("password_env")
def test_a_ledger_path_the_executors_do_not_share_is_refused_before_anything_moves(
    brokers: Brokers,
    tmp_path: Path,
    standalone_master: str,
    standalone_work: Path,
    env_archive: Path,
) -> None:
    vhost = fresh_vhost(brokers, "standalone-unshared")
    ledger = standalone_work / NOT_SHARED / "ledger"  # each worker sees its own tmpfs here
    config = write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=ledger)
    seed(brokers.dr, vhost, "q1", 100)
    declare(brokers.main, vhost, "q1")

    completed = submit(
        config, "unshared", "--master", standalone_master, "--env-archive", str(env_archive)
    )

    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output[-4000:]
    errors = [line for line in output.splitlines() if "rmq-spark: error:" in line]
    assert errors == [
        "rmq-spark: error: executor pre-flight refused the run; nothing was moved:"
    ], output[-4000:]
    assert f"ledger.path {ledger} is not shared: the executor on host" in output
    assert "lacks the Python module" not in output  # the archive was shipped
    assert (depth(brokers.dr, vhost, "q1"), depth(brokers.main, vhost, "q1")) == (100, 0)
    assert not (ledger / "_preflight").exists() or not any((ledger / "_preflight").iterdir())


def test_standalone_refuses_cluster_deploy_mode_for_python(
    tmp_path: Path, standalone_master: str, env_archive: Path
) -> None:
    # Spark 4's standalone master runs no Python driver in the cluster: SparkSubmit
    # says so before contacting it. (YARN and Kubernetes do; see docs/deploying/.)
    config = tmp_path / "job.yaml"
    config.write_text("{}\n")
    # A driver in the cluster takes the whole-runtime archive (spark-submit.sh refuses
    # the executor one there); SparkSubmit refuses before reading it, so a link will do.
    whole = tmp_path / env_archive.name.replace("rmq-spark-executor-env", "rmq-spark-env")
    whole.symlink_to(env_archive)
    completed = submit(
        config,
        "cluster-mode",
        "--master",
        standalone_master,
        "--deploy-mode",
        "cluster",
        "--env-archive",
        str(whole),
    )

    assert completed.returncode != 0
    assert (
        "Cluster deploy mode is currently not supported for python applications on "
        "standalone clusters" in completed.stderr
    ), completed.stderr[-4000:]
