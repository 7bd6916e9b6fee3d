"""How long a classic → quorum migration takes: `rmq-spark migrate` against plain shovels.

One local 3-node cluster, two vhosts filled alike (QUEUES classic queues mirrored by an
`ha-mode: all` policy, MESSAGES persistent 1 KiB demo messages each, one direct
binding each), migrated one after the other in the same process:

* `rmq-spark`: `rmq_spark.migrate.migrate` (move out, recreate, move back, drain the
  holding queues; three ledgered, GE-verified transfer runs) on local Spark.
* `shovels`: what operators script today: per queue, a dynamic Shovel (ack-mode
  on-confirm, src-delete-after queue-length) into a temporary quorum queue, delete and
  re-declare the original as quorum, re-bind it, a second Shovel back, delete the
  temporary queue; all queues at once, completion found by polling exact depths
  every 0.1 s. No ledger, no verification.

Both end with every message in its quorum queue (checked by exact depth). Writes
`bench/results/migrate-<UTC stamp>.json`; prints one JSON line.

    python -m bench.migrate [--queues 20] [--messages 5000]
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from rmq_spark.config import load_config
from rmq_spark.devtools.demo import demo_messages
from rmq_spark.devtools.local_brokers import LocalCluster, start_cluster, stop_cluster
from rmq_spark.ledger import tables
from rmq_spark.migrate import MigrationOptions, migrate
from rmq_spark.spark_session import build_session

log = logging.getLogger("bench.migrate")
RESULTS = Path(__file__).resolve().parent / "results"
PASSWORD_ENV = "RMQ_SPARK_BENCH_PASSWORD"
POLL_SECONDS = 0.1
TIMEOUT_SECONDS = 1800.0
PREFETCH = 1000  # the mover's default window in messages


def names(queues: int) -> list[str]:
    return [f"q{index:02d}" for index in range(queues)]


def seed(cluster: LocalCluster, vhost: str, queues: int, messages: int) -> None:
    node = cluster.first
    node.add_vhost(vhost)
    node.management(
        "PUT",
        f"/api/policies/{quote(vhost, safe='')}/ha-all",
        json={"pattern": "^q", "definition": {"ha-mode": "all"}, "apply-to": "queues"},
        timeout=60,
    )
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.exchange_declare("bench.direct", "direct", durable=True)
        for name in names(queues):
            channel.queue_declare(name, durable=True)
            channel.queue_bind(name, "bench.direct", name)
            # No confirms (a blocking confirm per message is ~100 msg/s on a loaded box);
            # the depths are checked below.
            for message in demo_messages(vhost, name, messages):
                channel.basic_publish("", name, message.body, message.properties)
    finally:
        connection.close()
    wait_for(
        lambda: all(d == messages for d in depths(cluster, vhost, names(queues)).values()),
        f"{queues} x {messages} messages in vhost {vhost!r}",
    )


def depths(cluster: LocalCluster, vhost: str, queue_names: list[str]) -> dict[str, int]:
    connection = cluster.first.connect(vhost)
    try:
        channel = connection.channel()
        return {
            name: int(channel.queue_declare(name, passive=True).method.message_count)
            for name in queue_names
        }
    finally:
        connection.close()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def shovel(cluster: LocalCluster, vhost: str, source: str, destination: str) -> None:
    node = cluster.first
    user, password = quote(node.username, safe=""), quote(node.password, safe="")
    uris = [
        f"amqp://{user}:{password}@127.0.0.1:{n.amqp_port}/{quote(vhost, safe='')}"
        for n in cluster.nodes
    ]
    value = {
        "src-protocol": "amqp091",
        "src-uri": uris,
        "src-queue": source,
        "src-prefetch-count": PREFETCH,
        "src-delete-after": "queue-length",
        "dest-protocol": "amqp091",
        "dest-uri": uris,
        "dest-exchange": "",
        "dest-exchange-key": destination,
        "ack-mode": "on-confirm",
    }
    path = f"/api/parameters/shovel/{quote(vhost, safe='')}/{quote(f'mig-{source}', safe='')}"
    node.management("PUT", path, json={"value": value}, timeout=60)


def run_shovels(cluster: LocalCluster, vhost: str, queues: int, messages: int) -> float:
    node, vq = cluster.first, quote(vhost, safe="")
    originals = names(queues)
    temps = [f"tmp-{name}" for name in originals]
    started = time.monotonic()
    for name, temp in zip(originals, temps, strict=True):
        node.management(
            "PUT",
            f"/api/queues/{vq}/{temp}",
            json={"durable": True, "arguments": {"x-queue-type": "quorum"}},
            timeout=60,
        )
        shovel(cluster, vhost, name, temp)
    wait_for(
        lambda: all(d == messages for d in depths(cluster, vhost, temps).values()),
        "the shovels out",
    )
    for name, temp in zip(originals, temps, strict=True):
        node.management(
            "DELETE", f"/api/parameters/shovel/{vq}/mig-{name}", timeout=60, missing_ok=True
        )
        node.management("DELETE", f"/api/queues/{vq}/{name}", timeout=60, missing_ok=True)
        node.management(
            "PUT",
            f"/api/queues/{vq}/{name}",
            json={"durable": True, "arguments": {"x-queue-type": "quorum"}},
            timeout=60,
        )
        node.management(
            "POST",
            f"/api/bindings/{vq}/e/bench.direct/q/{name}",
            json={"routing_key": name, "arguments": {}},
            timeout=60,
        )
        shovel(cluster, vhost, temp, name)
    wait_for(
        lambda: all(d == messages for d in depths(cluster, vhost, originals).values()),
        "the shovels back",
    )
    for temp in temps:
        node.management(
            "DELETE", f"/api/parameters/shovel/{vq}/mig-{temp}", timeout=60, missing_ok=True
        )
        node.management("DELETE", f"/api/queues/{vq}/{temp}", timeout=60, missing_ok=True)
    return time.monotonic() - started


def run_rmq_spark(
    cluster: LocalCluster, vhost: str, work: Path, queues: int, messages: int
) -> dict[str, Any]:
    config_path = work / "migrate.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "clusters": {
                    "bench": {
                        "amqp": cluster.amqp_uris,
                        "management": cluster.first.management_url,
                        "username": cluster.first.username,
                        "password_env": PASSWORD_ENV,
                    }
                },
                "routes": [
                    {
                        "name": "migrate",
                        "source": {"cluster": "bench", "vhosts": [vhost]},
                        "destination": {"cluster": "bench"},
                    }
                ],
                "ledger": {"path": str(work / "ledger")},
                "max_active": 4,
            }
        ),
        encoding="utf-8",
    )
    config = load_config(config_path, {PASSWORD_ENV: cluster.first.password})
    spark = build_session("bench-migrate", master="local[*,4]")
    try:
        started = time.monotonic()
        result = migrate(spark, config, options=MigrationOptions(), migration_id="bench")
        seconds = time.monotonic() - started
    finally:
        spark.stop()
    if not result.verified:
        raise RuntimeError("rmq-spark migration did not verify")
    final = depths(cluster, vhost, names(queues))
    if any(d != messages for d in final.values()):
        raise RuntimeError(f"rmq-spark: unexpected final depths {final}")
    runs = {
        row["run_id"]: row["seconds"]
        for row in tables.read_arrow(str(work / "ledger"), "runs").to_pylist()
    }
    return {"seconds": seconds, "run_seconds": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.migrate")
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("pika", "py4j", "great_expectations", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench-migrate-"))
    cluster = start_cluster("bench", work / "cluster", password=secrets.token_urlsafe(16))
    try:
        total = args.queues * args.messages
        seed(cluster, "shovel", args.queues, args.messages)
        seed(cluster, "rmq-spark", args.queues, args.messages)
        shovel_seconds = run_shovels(cluster, "shovel", args.queues, args.messages)
        log.info("shovels: %d messages in %.1f s", total, shovel_seconds)
        ours = run_rmq_spark(cluster, "rmq-spark", work, args.queues, args.messages)
        log.info("rmq-spark: %d messages in %.1f s", total, ours["seconds"])
    finally:
        stop_cluster(cluster, remove_data=True)
    figures = {
        "queues": args.queues,
        "messages_per_queue": args.messages,
        "messages": total,
        "body_bytes": 1024,
        "cluster_nodes": len(cluster.nodes),
        "shovels_seconds": round(shovel_seconds, 1),
        "rmq_spark_seconds": round(ours["seconds"], 1),
        "rmq_spark_run_seconds": {k: round(v, 1) for k, v in ours["run_seconds"].items()},
        "ratio_rmq_spark_to_shovels": round(ours["seconds"] / shovel_seconds, 2),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"migrate-{stamp}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({**figures, "file": str(out)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
