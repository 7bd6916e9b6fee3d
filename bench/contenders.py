"""The ways to move a queue that the throughput benchmark puts side by side.

* `run_shovel`: one dynamic Shovel (on the source node, ack-mode on-confirm, the
  same prefetch as the mover's window), timed from its creation until the
  destination holds every message; the Shovel deletes itself (``src-delete-after:
  queue-length``).
* `run_local_shovel`: one dynamic *local* Shovel (RabbitMQ 4.2+, ``src-protocol`` and
  ``dest-protocol`` ``local``): no AMQP connections, it consumes through the queue
  type's credit API and publishes through the queue type's deliver call inside the
  broker, the seed's "better shovel". Its credit (``shovel.local.max_credit``, a
  node-wide setting, default 1000) is set to the same prefetch before each run.
  Only within one cluster: `not_applicable` says where it cannot run.
* `run_orchestrated_shovels`: the seed's transfer script for many queues: one
  dynamic Shovel per queue, at most `ORCHESTRATED_MAX_ACTIVE` at once, completion
  found by polling depths once a second.
* `run_mover`: `rmq_spark.transfer.executor.move_queue` in a fresh interpreter
  (`bench.mover_child`), ledger on, or off for the ledger-cost pair.
* `run_job`: the whole job, ``./spark-submit.sh --config FILE --run-id ID``, to a
  verified ledger; its stages are timed from the outside (ledger timestamps and
  file times), since the job itself only reports its total.

Each returns a `Run`: wall seconds, what moved, client CPU, peak RSS and the CPU
the two brokers spent meanwhile.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow.compute as pc
import yaml

from bench.process_memory import TreeMemory
from bench.workload import (
    DESTINATION,
    ONE_NODE,
    SOURCE,
    Brokers,
    Workload,
    wait_until_depth,
)
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.ledger import store, tables
from rmq_spark.report.console import RESULT_PREFIX

REPO = Path(__file__).resolve().parents[1]
SPARK_SUBMIT = REPO / "spark-submit.sh"
PASSWORD_ENV = "RMQ_SPARK_BENCH_PASSWORD"
# A single Shovel's completion is polled tightly: its time is not padded by the poll.
SHOVEL_POLL_SECONDS = 0.05
# How long a finished Shovel may take to settle its last acks and delete itself.
SHOVEL_SETTLE_TIMEOUT_SECONDS = 60.0
# The seed's orchestration: at most this many shovels at once, depths polled this often.
ORCHESTRATED_MAX_ACTIVE = 5
ORCHESTRATED_POLL_SECONDS = 1.0
# Generous: a 1M-message DR run on a loaded 2-core box.
RUN_TIMEOUT_SECONDS = 1800.0
# The mover's byte window (config default); the Shovel gets the same derived prefetch.
WINDOW_BYTES = 64 * 1024 * 1024
SHOVEL, LOCAL_SHOVEL = "shovel", "local_shovel"
# The first release with local shovels (release-notes/4.2.0.md, "Local Shovels").
LOCAL_SHOVEL_SINCE = (4, 2)


class BenchError(RuntimeError):
    """A contender did not move what it was given; the benchmark stops."""


@dataclass
class Run:
    """One contender moving one workload once."""

    contender: str
    messages: int
    bytes: int
    seconds: float
    broker_cpu_seconds: dict[str, float]
    client_cpu_seconds: float | None = None
    peak_rss_kib: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rate": round(self.rate, 1)}


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per Erlang VM: ``src`` and ``dst``, or ``src_and_dst`` when they are one node."""
    return {vm: round(after[vm] - before[vm], 2) for vm in before}


def not_applicable(contender: str, layout: str, rabbitmq_version: str) -> str | None:
    """Why `contender` cannot move a queue in `layout` on `rabbitmq_version`; None if it can.

    Only the local shovel has limits: it needs RabbitMQ 4.2+, and it consumes and
    publishes inside the cluster it runs in, so a move between two clusters is out
    of its reach.
    """
    if contender != LOCAL_SHOVEL:
        return None
    major_minor = tuple(int(part) for part in rabbitmq_version.split(".")[:2])
    if major_minor < LOCAL_SHOVEL_SINCE:
        return (
            f"RabbitMQ {rabbitmq_version} has no local shovel "
            f"(new in {'.'.join(map(str, LOCAL_SHOVEL_SINCE))})"
        )
    if layout != ONE_NODE:
        return (
            "a local shovel consumes and publishes inside one cluster; "
            "this layout moves between two clusters"
        )
    return None


# -- the Shovel -------------------------------------------------------------------------


def _amqp_uri(node: LocalNode, vhost: str) -> str:
    """Shovel URIs carry credentials; they go to the management API only, never a log."""
    user, password = quote(node.username, safe=""), quote(node.password, safe="")
    return f"amqp://{user}:{password}@127.0.0.1:{node.amqp_port}/{quote(vhost, safe='')}"


def _shovel_path(vhost: str, name: str) -> str:
    return f"/api/parameters/shovel/{quote(vhost, safe='')}/{quote(name, safe='')}"


def shovel_definition(src_uri: str, dest_uri: str, queue: str, prefetch: int) -> dict[str, Any]:
    """An AMQP 0-9-1 dynamic Shovel moving what `queue` holds when it starts, once.

    Publishing through the default exchange (``dest-exchange: ""``) leaves the
    destination queue as declared (a ``dest-queue`` would be re-declared classic).
    """
    return {
        "src-protocol": "amqp091",
        "src-uri": src_uri,
        "src-queue": queue,
        "src-prefetch-count": prefetch,
        "src-delete-after": "queue-length",
        "dest-protocol": "amqp091",
        "dest-uri": dest_uri,
        "dest-exchange": "",
        "dest-exchange-key": queue,
        "ack-mode": "on-confirm",
    }


def local_shovel_definition(src_uri: str, dest_uri: str, queue: str) -> dict[str, Any]:
    """A local dynamic Shovel (RabbitMQ 4.2+) moving what `queue` holds when it starts, once.

    A local shovel opens no connection: it reads only the user, password and vhost
    from each URI (host and port are ignored), logs in as that user and checks its
    access to the vhost, so the source and destination may be different vhosts of
    one cluster. It has no prefetch parameter; its credit is the node's
    ``shovel.local.max_credit``. ``dest-queue`` routes straight to the queue (no
    exchange); ``*-predeclared`` makes it check the prepared queues instead of
    declaring them.
    """
    return {
        "src-protocol": "local",
        "src-uri": src_uri,
        "src-queue": queue,
        "src-predeclared": True,
        "src-delete-after": "queue-length",
        "dest-protocol": "local",
        "dest-uri": dest_uri,
        "dest-queue": queue,
        "dest-predeclared": True,
        "ack-mode": "on-confirm",
    }


def start_shovel(brokers: Brokers, vhost: str, queue: str, prefetch: int) -> str:
    """Create a dynamic Shovel on the source node that moves what `queue` holds now."""
    name = f"bench-{queue}"
    value = shovel_definition(
        _amqp_uri(brokers.src, vhost),
        _amqp_uri(brokers.contender_dst(), brokers.destination_vhost(vhost)),
        queue,
        prefetch,
    )
    brokers.src.management("PUT", _shovel_path(vhost, name), json={"value": value}, timeout=10)
    return name


def set_local_shovel_credit(node: LocalNode, credit: int) -> None:
    """``shovel.local.max_credit`` at run time: read by each local shovel as it starts."""
    node.rabbitmqctl(
        "eval", f"ok = application:set_env(rabbitmq_shovel, max_local_shovel_credit, {credit})."
    )


def start_local_shovel(brokers: Brokers, vhost: str, queue: str) -> str:
    """Create a local Shovel that moves what `queue` holds now into the destination vhost."""
    name = f"bench-local-{queue}"
    value = local_shovel_definition(
        _amqp_uri(brokers.src, vhost),
        _amqp_uri(brokers.dst, brokers.destination_vhost(vhost)),
        queue,
    )
    brokers.src.management("PUT", _shovel_path(vhost, name), json={"value": value}, timeout=10)
    return name


def wait_until_shovel_gone(brokers: Brokers, vhost: str, name: str) -> bool:
    """Poll until a Shovel has deleted itself (``src-delete-after``), which it does once
    it has settled what it moved; False after `SHOVEL_SETTLE_TIMEOUT_SECONDS`.

    The destination holds every message a confirm's trip before the Shovel acks the
    last of them at the source; deleting it in between returns those to the source
    (duplicates), which a far destination makes likely.
    """
    deadline = time.monotonic() + SHOVEL_SETTLE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            brokers.src.management("GET", _shovel_path(vhost, name), timeout=10)
        except Exception as exc:
            if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                return True
            raise
        time.sleep(SHOVEL_POLL_SECONDS)
    return False


def delete_shovel(brokers: Brokers, vhost: str, name: str) -> None:
    """Remove the parameter; a Shovel that deleted itself after its queue-length is gone."""
    try:
        brokers.src.management("DELETE", _shovel_path(vhost, name), timeout=10)
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) != 404:
            raise


def _time_shovel(
    brokers: Brokers,
    vhost: str,
    queue: str,
    workload: Workload,
    start: Callable[[], str],
) -> tuple[float, dict[str, float]]:
    """Seconds from a Shovel's creation until the destination holds every message,
    and the brokers' CPU meanwhile."""
    connection = brokers.dst.connect(brokers.destination_vhost(vhost))
    name = None
    try:
        channel = connection.channel()
        cpu_before = brokers.cpu_seconds()
        started = time.monotonic()
        name = start()
        finished = wait_until_depth(
            channel,
            queue,
            workload.messages,
            poll_seconds=SHOVEL_POLL_SECONDS,
            timeout=RUN_TIMEOUT_SECONDS,
        )
        cpu_after = brokers.cpu_seconds()
        # Untimed: its last acks are on their way; if it never goes, the depth check
        # after the run reports what stayed in the source.
        wait_until_shovel_gone(brokers, vhost, name)
    finally:
        connection.close()
        if name is not None:
            delete_shovel(brokers, vhost, name)
    return finished - started, _cpu_delta(cpu_before, cpu_after)


def run_shovel(brokers: Brokers, vhost: str, queue: str, workload: Workload, prefetch: int) -> Run:
    """One Shovel, from its creation until the destination holds every message."""
    seconds, cpu = _time_shovel(
        brokers, vhost, queue, workload, lambda: start_shovel(brokers, vhost, queue, prefetch)
    )
    return Run(
        contender=SHOVEL,
        messages=workload.messages,
        bytes=workload.bytes,
        seconds=seconds,
        broker_cpu_seconds=cpu,
        details={"prefetch": prefetch},
    )


def run_local_shovel(
    brokers: Brokers, vhost: str, queue: str, workload: Workload, credit: int
) -> Run:
    """One local Shovel with `credit` (the others' prefetch), from its creation until the
    destination holds every message."""
    reason = not_applicable(LOCAL_SHOVEL, brokers.layout, brokers.rabbitmq_version())
    if reason is not None:
        raise BenchError(f"local shovel on {brokers.layout}: {reason}")
    set_local_shovel_credit(brokers.src, credit)
    seconds, cpu = _time_shovel(
        brokers, vhost, queue, workload, lambda: start_local_shovel(brokers, vhost, queue)
    )
    return Run(
        contender=LOCAL_SHOVEL,
        messages=workload.messages,
        bytes=workload.bytes,
        seconds=seconds,
        broker_cpu_seconds=cpu,
        details={"credit": credit},
    )


def run_orchestrated_shovels(
    brokers: Brokers, queues: Sequence[tuple[str, str]], workload: Workload, prefetch: int
) -> Run:
    """The seed's script: a Shovel per queue, at most 5 running, depths polled each second."""
    pending = list(queues)
    active: dict[tuple[str, str], str] = {}
    connections = {
        vhost: brokers.dst.connect(brokers.destination_vhost(vhost)) for vhost, _ in queues
    }
    try:
        channels = {vhost: connection.channel() for vhost, connection in connections.items()}
        cpu_before = brokers.cpu_seconds()
        started = time.monotonic()
        polls = 0
        while pending or active:
            for (vhost, queue), name in list(active.items()):
                if _depth(channels[vhost], queue) >= workload.messages:
                    delete_shovel(brokers, vhost, name)
                    del active[(vhost, queue)]
            while pending and len(active) < ORCHESTRATED_MAX_ACTIVE:
                vhost, queue = pending.pop(0)
                active[(vhost, queue)] = start_shovel(brokers, vhost, queue, prefetch)
            if active:
                time.sleep(ORCHESTRATED_POLL_SECONDS)
                polls += 1
            if time.monotonic() - started > RUN_TIMEOUT_SECONDS:
                raise BenchError(f"orchestrated shovels still running after {polls} polls")
        seconds = time.monotonic() - started
        cpu_after = brokers.cpu_seconds()
    finally:
        for connection in connections.values():
            connection.close()
    return Run(
        contender="orchestrated_shovels",
        messages=workload.messages * len(queues),
        bytes=workload.bytes * len(queues),
        seconds=seconds,
        broker_cpu_seconds=_cpu_delta(cpu_before, cpu_after),
        details={
            "prefetch": prefetch,
            "max_active": ORCHESTRATED_MAX_ACTIVE,
            "poll_seconds": ORCHESTRATED_POLL_SECONDS,
            "polls": polls,
        },
    )


def _depth(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


# -- the mover alone --------------------------------------------------------------------


def cluster_request(node: LocalNode) -> dict[str, str]:
    """A node as `bench.mover_child` requests name it (the password included)."""
    return {
        "amqp": node.amqp_uri,
        "management": node.management_url,
        "username": node.username,
        "password": node.password,
    }


def run_mover(
    brokers: Brokers,
    vhost: str,
    queue: str,
    workload: Workload,
    *,
    window: int,
    ledger: Path | None,
    run_id: str,
    start_window: int | None = None,
    contender: str | None = None,
) -> Run:
    """`move_queue` in a fresh interpreter; ``ledger=None`` discards the rows instead.

    `window` is `window.messages`; with `start_window` the window starts there and grows
    up to it as the rate it measures grows (window_growth.py), otherwise it is fixed.
    `contender` names the run (default: "mover", or "mover_no_ledger" without a ledger).
    """
    if ledger is not None:
        tables.ensure_tables(str(ledger))  # the driver's job, not the mover's: untimed
    request = {
        "run_id": run_id,
        "ledger": ledger is not None,
        "ledger_path": str(ledger or ""),
        "clusters": {
            SOURCE: cluster_request(brokers.src),
            DESTINATION: cluster_request(brokers.contender_dst()),
        },
        "window_messages": window,
        "window_start_messages": start_window,
        "window_bytes": WINDOW_BYTES,
        "row": {
            "source_cluster": SOURCE,
            "source_vhost": vhost,
            "source_queue": queue,
            "destination_cluster": DESTINATION,
            "destination_vhost": brokers.destination_vhost(vhost),
            "destination_queue": queue,
            "messages": workload.messages,
            "message_bytes": workload.bytes,
        },
    }
    cpu_before = brokers.cpu_seconds()
    completed = subprocess.run(
        [sys.executable, "-m", "bench.mover_child"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    cpu_after = brokers.cpu_seconds()
    if completed.returncode != 0:
        raise BenchError(
            f"mover child failed ({completed.returncode}):\n{completed.stderr[-3000:]}"
        )
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    if result["status"] != "moved":
        raise BenchError(f"mover failed: {result}")
    # A "moved" outcome with fewer messages than seeded is a finding, not a crash:
    # the run is kept (rate over what moved) and the caller records what was left.
    return Run(
        contender=contender or ("mover" if ledger is not None else "mover_no_ledger"),
        messages=result["messages"],
        bytes=result["bytes"],
        seconds=result["seconds"],
        broker_cpu_seconds=_cpu_delta(cpu_before, cpu_after),
        client_cpu_seconds=round(result["client_cpu_seconds"], 2),
        peak_rss_kib=result["peak_rss_kib"],
        details={
            "window": window,
            "start_window": start_window,
            "window_at_end": result["window_messages"],
            "sessions": result["sessions"],
        },
    )


# -- the whole job ----------------------------------------------------------------------


def job_config(
    brokers: Brokers,
    *,
    vhosts: Sequence[str],
    ledger: Path,
    destination_type: str,
    window: int | None,
    max_active: int,
    queues: Sequence[str] | None = None,
    queue_pattern: str | None = None,
    queues_per_task: int | None = None,
) -> dict[str, Any]:
    """A job config moving the bench queues from ``src`` to ``dst`` (same name; same
    vhost on two nodes, the sibling vhost on one)."""

    def cluster(node: LocalNode) -> dict[str, Any]:
        return {
            "amqp": [node.amqp_uri],
            # Co-location would otherwise take the node's address from its listeners
            # and bypass a delay proxy in front of it (the far scenarios).
            "nodes": {node.node_name: node.amqp_uri},
            "management": node.management_url,
            "username": node.username,
            "password_env": PASSWORD_ENV,
        }

    source: dict[str, Any] = {"cluster": SOURCE, "vhosts": list(vhosts)}
    if queues is not None:
        source["queues"] = list(queues)
    else:
        source["queue_pattern"] = queue_pattern
    return {
        "clusters": {SOURCE: cluster(brokers.src), DESTINATION: cluster(brokers.contender_dst())},
        "routes": [
            {
                "name": "bench",
                "source": source,
                "destination": {
                    "cluster": DESTINATION,
                    "vhost": brokers.destination_vhost("{vhost}"),
                    "queue_type": destination_type,
                },
            }
        ],
        # window None: the shipped window (it starts at 5000 and grows with the rate).
        "window": {"bytes": WINDOW_BYTES} | ({"messages": window} if window else {}),
        "max_active": max_active,
        "ledger": {"path": str(ledger)},
    } | ({"mover": {"queues_per_task": queues_per_task}} if queues_per_task else {})


def run_job(
    brokers: Brokers, config: dict[str, Any], work_dir: Path, run_id: str, messages: int
) -> Run:
    """``./spark-submit.sh --config FILE --run-id ID`` to a verified ledger, timed whole."""
    config_path = work_dir / f"{run_id}.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PASSWORD_ENV: brokers.src.password,
    }
    children_before = _children_cpu_seconds()
    cpu_before = brokers.cpu_seconds()
    launched, started = datetime.now(UTC), time.monotonic()
    with (
        subprocess.Popen(
            [str(SPARK_SUBMIT), "--config", str(config_path), "--run-id", run_id],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as job,
        TreeMemory(job.pid) as memory,
    ):
        try:
            stdout, stderr = job.communicate(timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            job.kill()
            raise
    completed = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
    seconds, exited = time.monotonic() - started, datetime.now(UTC)
    cpu_after = brokers.cpu_seconds()
    # The job's log (stdout) and Spark's (stderr), for --keep-work-dir.
    (work_dir / f"{run_id}.stdout").write_text(completed.stdout, encoding="utf-8")
    (work_dir / f"{run_id}.stderr").write_text(completed.stderr, encoding="utf-8")
    result = _result_line(completed.stdout)
    if completed.returncode not in (0, 1) or not result:  # 1: ran, verification failed
        # rmq-spark logs to stdout and names its error on stderr: the tails of both.
        raise BenchError(
            f"job {run_id} exited {completed.returncode} with {result}:\n"
            f"{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
        )
    stages = job_stages(str(config["ledger"]["path"]), run_id, launched, exited)
    return Run(
        contender="job",
        # What the job says it moved; the caller counts what the sources still hold.
        messages=int(result["messages"]),
        bytes=int(result["bytes"]),
        seconds=seconds,
        broker_cpu_seconds=_cpu_delta(cpu_before, cpu_after),
        # The whole spark-submit tree: JVM, Python driver and Python workers.
        client_cpu_seconds=round(_children_cpu_seconds() - children_before, 2),
        details={
            "stages": stages,
            "fixed_overhead_seconds": round(seconds - stages["transfer"], 2),
            "verified": result["verified"],
            "exit_code": completed.returncode,
            "seeded": messages,
            "job_seconds": result["seconds"],
            "max_active": config["max_active"],
            # Sampled from /proc while it ran (bench/process_memory.py).
            "peak_memory": memory.to_json(),
        },
    )


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _result_line(stdout: str) -> dict[str, Any] | None:
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX) :]) if lines else None


def job_stages(ledger: str, run_id: str, launched: datetime, exited: datetime) -> dict[str, float]:
    """Where a job's wall time went, from what the run left behind.

    The runs row's start (the pre-flight: the Python driver is up), the first consume
    and last confirm in the ledger (the transfer), the Delta commit file and
    verification.json (their modification times, as the directory or the object store
    records them), and the process exit.
    """
    # tables.read_arrow, not DeltaTable.to_pyarrow_table: the latter can abort the
    # interpreter at exit (code 134).
    runs = tables.read_rows(ledger, "runs", run_id)
    if not runs:
        raise BenchError(f"job {run_id}: expected its row in {ledger}/runs, found none")
    run = runs[0]
    moved = tables.read_arrow(
        ledger, "messages", run_id=run_id, columns=["consumed_at", "confirmed_at"]
    )
    first_consumed = pc.min(moved["consumed_at"]).as_py()
    last_confirmed = pc.max(moved["confirmed_at"]).as_py()
    root = store.root(ledger)
    committed = _mtime(max((root / "messages" / "_delta_log").glob("*.json")))
    verified = _mtime(root / "verification" / f"run_id={run_id}" / "verification.json")
    marks = [
        # The pre-flight starts as soon as the Python driver is up, and Spark starts
        # alongside it (cli.run_transfer_command).
        ("launch", run["started_at"]),
        ("spark_and_plan", first_consumed),
        ("transfer", last_confirmed),
        ("commit", committed),
        ("verify", verified),
        ("record_and_exit", exited),  # queues/runs rows, Spark stop, JVM exit
    ]
    stages, previous = {}, launched
    for name, mark in marks:
        stages[name] = round((mark - previous).total_seconds(), 2)
        previous = mark
    return stages


def _mtime(path: Any) -> datetime:
    """A local Path's or a StorePath's modification time."""
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)
