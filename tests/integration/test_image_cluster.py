"""The job on a Spark standalone cluster whose master and workers are containers of the
rmq-spark image (docker/Dockerfile), built on this machine with podman (`make image`).

The image is built (or found, keyed by its inputs) by rmq_spark.devtools.image. A
module fixture runs a master and two workers from it with podman (`--runtime runc`,
host network, free loopback ports); one worker runs as an arbitrary UID in group 0, as
OpenShift runs images. The containers see nothing of this machine but one host
directory, mounted at the same path in each: the ledger's. A second cluster mounts
nothing at all, and the job's ledger is on the S3 server (issue 25: no shared mount
needed anywhere). The job is submitted from
here in client mode by `spark-submit.sh --in-image` with the pip pyspark of the tests
(the image holds the same 4.2.0): no package zip, no environment archive; the
executors run the image's Python and import the package the image holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
import requests
import yaml

import rmq_spark
from rmq_spark.devtools.image import PODMAN, ensure_image
from rmq_spark.ledger import store, tables
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
from tests.support.faults import wait_until
from tests.support.object_store import objects_under, write_store_config
from tests.support.standalone import alive_workers, free_port

REPO = Path(__file__).resolve().parents[2]
ARBITRARY_USER = "1000700000:0"  # a UID of OpenShift's range; no passwd entry in the image
# As OpenShift's runtime: podman would otherwise add the UID to the container's passwd.
AS_ARBITRARY_USER = ("--user", ARBITRARY_USER, "--passwd=false")
WORK_DIR = "/opt/rmq-spark/work-dir/worker"
QUEUES = ("q1", "q2", "q3", "q4")
MESSAGES = 1000
START_TIMEOUT_SECONDS = 120
CONTAINER_LIMIT = 4096  # open files and processes per container's user


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def ulimits() -> list[str]:
    """Limits at or below this machine's own: runc cannot raise them (podman's default
    nofile is above the host's here). nproc counts the UID's processes host-wide; the
    containers run as UIDs nothing else on this machine uses."""
    options = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        value = min(resource.getrlimit(limit)[0], CONTAINER_LIMIT)
        options += ["--ulimit", f"{name}={value}:{value}"]
    return options


@dataclass(frozen=True)
class ImageCluster:
    url: str
    ui_port: int
    ledger_volume: Path | None
    workers: tuple[str, ...]

    def completed_apps(self) -> list[str]:
        state = requests.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5).json()
        return [app["id"] for app in state.get("completedapps", [])]

    def worker_apps(self, worker: str) -> list[str]:
        """The application directories in a worker container's work dir."""
        listed = podman("exec", worker, "ls", WORK_DIR)
        assert listed.returncode == 0, listed.stderr
        return listed.stdout.split()


@pytest.fixture(scope="module")
def image() -> str:
    return ensure_image().tag


@contextlib.contextmanager
def running_image_cluster(image: str, volume: Path | None) -> Iterator[ImageCluster]:
    """A master and two workers from the image; `volume`, when given, is the one host
    directory they see (mounted at the same path in each), else they see none."""
    port, ui_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    prefix = f"rmq-spark-test-{os.getpid()}-{secrets.token_hex(2)}"
    common = [
        "run",
        "--detach",
        "--network",
        "host",
        *ulimits(),
        "--env",
        "SPARK_LOCAL_IP=127.0.0.1",
        *(["--volume", f"{volume}:{volume}"] if volume is not None else []),
    ]
    containers = {
        f"{prefix}-master": [
            image, "master", "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(ui_port),
        ],
        f"{prefix}-worker-0": [
            image, "worker", url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(free_port()), "--work-dir", WORK_DIR,
        ],
        f"{prefix}-worker-1": [
            *AS_ARBITRARY_USER,
            image, "worker", url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--webui-port", str(free_port()), "--work-dir", WORK_DIR,
        ],
    }  # fmt: skip
    started: list[str] = []
    try:
        for name, args in containers.items():
            run = podman(*common, "--name", name, *args)
            assert run.returncode == 0, f"podman run {name}: {run.stderr[-2000:]}"
            started.append(name)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while alive_workers(ui_port) < len(containers) - 1:
            running = podman("inspect", "--format", "{{.State.Running}}", *started)
            if running.stdout.split() != ["true"] * len(started) or time.monotonic() > deadline:
                logs = {name: podman("logs", name).stdout[-1500:] for name in started}
                pytest.fail(f"the containers' cluster is not up: {running.stdout!r}\n{logs}")
            time.sleep(0.5)
        yield ImageCluster(
            url=url,
            ui_port=ui_port,
            ledger_volume=volume,
            workers=tuple(name for name in started if "-worker-" in name),
        )
    finally:
        if started:
            podman("rm", "--force", "--time", "10", *started)


@pytest.fixture(scope="module")
def image_cluster(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageCluster]:
    volume = tmp_path_factory.mktemp("image-volume")
    volume.chmod(0o2775)  # gid 0 (the containers' group), group-writable, inherited
    with running_image_cluster(image, volume) as cluster:
        yield cluster


@pytest.fixture
def private_image_cluster(image: str) -> Iterator[ImageCluster]:
    """The same cluster with no host directory mounted: each container has only its own
    file system, as a cluster's nodes have (issue 25)."""
    with running_image_cluster(image, None) as cluster:
        yield cluster


def seed_queues(brokers: Brokers, vhost: str) -> None:
    for queue in QUEUES:
        seed(brokers.dr, vhost, queue, MESSAGES)
        declare(brokers.main, vhost, queue)


def submit_in_image(cluster: ImageCluster, config: Path, run_id: str) -> tuple[dict[str, Any], str]:
    """The job submitted from here in client mode to the containers' cluster; its RESULT
    and its whole output, once it exited 0."""
    # Nothing of this machine's Python is exported: --in-image names the image's.
    environ = {
        key: value
        for key, value in job_environment().items()
        if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    completed = subprocess.run(
        [
            str(REPO / "spark-submit.sh"),
            "--master", cluster.url,
            "--conf", "spark.driver.host=127.0.0.1",
            "--in-image",
            "--config", str(config), "--run-id", run_id,
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        # The driver creates ledger directories the arbitrary UID must write into: group 0.
        umask=0o002,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    (line,) = [x for x in completed.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    return json.loads(line[len(RESULT_PREFIX) :]), output


def assert_every_queue_moved(brokers: Brokers, vhost: str, result: dict[str, Any]) -> None:
    assert result["verified"] is True
    assert result["messages"] == len(QUEUES) * MESSAGES
    assert (result["lost"], result["duplicates"]) == (0, 0)
    for queue in QUEUES:
        assert (depth(brokers.dr, vhost, queue), depth(brokers.main, vhost, queue)) == (
            0,
            MESSAGES,
        )


def test_the_image_runs_as_an_arbitrary_uid_with_a_user_name(image: str) -> None:
    script = 'id -un; id -u; touch "$HOME/written" && echo "$HOME"; java -version 2>&1 | head -1'
    completed = podman("run", "--rm", *ulimits(), *AS_ARBITRARY_USER, image, "sh", "-c", script)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[:3] == [
        "rmq-spark",
        ARBITRARY_USER.split(":", maxsplit=1)[0],
        "/opt/rmq-spark/work-dir",
    ]
    assert '"17.' in lines[3]


def test_the_image_holds_one_spark_and_the_package(image: str) -> None:
    script = "import pyspark, rmq_spark; print(pyspark.__version__, rmq_spark.__version__)"
    completed = podman("run", "--rm", *ulimits(), image, "python", "-c", script)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [pyspark.__version__, rmq_spark.__version__]


def test_the_job_runs_on_containers_of_the_image_and_verifies(
    brokers: Brokers, password_env: str, tmp_path: Path, image_cluster: ImageCluster
) -> None:
    vhost = fresh_vhost(brokers, "image-cluster")
    assert image_cluster.ledger_volume is not None
    ledger = image_cluster.ledger_volume / "ledger"
    # max_active 4 with two queues per task: two tasks, one per worker.
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=ledger, max_active=4
    )
    seed_queues(brokers, vhost)
    for container in image_cluster.workers:  # the containers do not see this machine
        seen = podman("exec", container, "ls", "-d", str(REPO), sys.executable, str(ledger.parent))
        assert seen.stdout.split() == [str(ledger.parent)], seen.stdout + seen.stderr

    result, _output = submit_in_image(image_cluster, config, "in-image")

    assert_every_queue_moved(brokers, vhost, result)
    (run,) = tables.read_arrow(str(ledger), "runs").to_pylist()
    app_id = run["spark_app_id"]
    assert app_id.startswith("app-")  # a standalone application, not local[*]
    # Both workers (one of them the arbitrary UID) ran executors of this application.
    for worker in image_cluster.workers:
        assert app_id in image_cluster.worker_apps(worker), worker
    wait_until(
        lambda: app_id in image_cluster.completed_apps(), f"the master to list {app_id} as ended"
    )


@pytest.mark.usefixtures("password_env")
def test_with_the_ledger_on_s3_the_containers_share_no_directory_and_it_verifies(
    brokers: Brokers,
    tmp_path: Path,
    private_image_cluster: ImageCluster,
    s3_ledger: dict[str, Any],
) -> None:
    vhost = fresh_vhost(brokers, "image-cluster-s3")
    config_path = write_store_config(tmp_path, brokers, vhost, s3_ledger)
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config["max_active"] = 4  # two queues per task: two tasks, one per worker
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    seed_queues(brokers, vhost)
    for container in private_image_cluster.workers:
        mounts = podman("inspect", "--format", "{{len .Mounts}}", container)
        assert mounts.stdout.strip() == "0", mounts.stdout + mounts.stderr
        seen = podman("exec", container, "ls", "-d", str(REPO), sys.executable, str(tmp_path))
        assert seen.stdout.split() == [], seen.stdout

    result, output = submit_in_image(private_image_cluster, config_path, "in-image-s3")

    assert_every_queue_moved(brokers, vhost, result)
    assert os.environ[s3_ledger["storage_options"]["secret_access_key_env"]] not in output
    ledger, options = str(s3_ledger["path"]), s3_ledger["storage_options"]
    store.configure(
        ledger,
        store.StoreOptions(
            endpoint=options["endpoint"],
            region=options["region"],
            access_key_id=os.environ[options["access_key_id_env"]],
            secret_access_key=os.environ[options["secret_access_key_env"]],
        ),
    )
    on_store = objects_under(ledger)
    assert "verification/run_id=in-image-s3/verification.json" in on_store
    assert not [key for key in on_store if key.startswith(("intents/", "rows/", "_preflight/"))]
    assert tables.read_arrow(ledger, "messages", run_id="in-image-s3").num_rows == (
        len(QUEUES) * MESSAGES
    )
    (run,) = tables.read_arrow(ledger, "runs").to_pylist()
    # Both workers (one of them the arbitrary UID) ran executors of this application:
    # with no directory in common, what they staged before acking went to the store.
    for worker in private_image_cluster.workers:
        assert run["spark_app_id"] in private_image_cluster.worker_apps(worker), worker
