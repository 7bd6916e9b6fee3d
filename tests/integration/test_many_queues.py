"""Many small queues through the whole job: 60 queues in 3 vhosts moved by spark-submit
commit a handful of ledger files in one Delta commit, verified; and progress samples a
vhost of more queues than it declares passively from the paged management listing."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable

from rmq_spark.config import load_config
from rmq_spark.devtools.demo import seed_demo
from rmq_spark.ledger import tables
from rmq_spark.ledger.layout import is_data_file, run_partition_dir
from rmq_spark.model import TransferKey
from rmq_spark.progress import AMQP_SAMPLE_MAX_QUEUES, depth_sampler
from tests.support.brokers import (
    Brokers,
    depth,
    fresh_vhost,
    queue_names,
    result_of,
    spark_submit,
    write_config,
)
from tests.support.builders import transfer
from tests.support.faults import wait_until

VHOSTS = ["many-a", "many-b", "many-c"]
QUEUES_PER_VHOST = 20
MESSAGES_PER_QUEUE = 10
LISTED_TIMEOUT_SECONDS = 60.0


def wait_until_listed(brokers: Brokers, vhost: str, count: int) -> None:
    """Discovery reads the management API, which lists a new queue once its stats are in."""
    wait_until(
        lambda: len(queue_names(brokers.dr, vhost)) >= count,
        f"{vhost}: the API to list {count} queues",
        timeout=LISTED_TIMEOUT_SECONDS,
    )


def test_sixty_small_queues_commit_one_compacted_file_in_one_commit(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    for vhost in VHOSTS:
        fresh_vhost(brokers, vhost)
    seeded = seed_demo(
        brokers.dr.connect,
        vhosts=VHOSTS,
        per_vhost=QUEUES_PER_VHOST,
        messages_per_queue=MESSAGES_PER_QUEUE,
    )
    assert seeded == 600
    for vhost in VHOSTS:
        wait_until_listed(brokers, vhost, QUEUES_PER_VHOST)
    ledger = tmp_path / "ledger"
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=VHOSTS, ledger=ledger, max_active=4
    )

    completed = spark_submit(config, "many-1")

    assert completed.returncode == 0, completed.stderr[-3000:]
    result = result_of(completed.stdout)
    assert (result["verified"], result["messages"], result["queues"]) == (True, 600, 60)
    messages = tables.table_path(str(ledger), "messages")
    files = DeltaTable(messages).file_uris()
    assert len(files) == 1
    assert Path(files[0]).name.startswith("compacted-")
    # One commit (version 1; 0 created the table), and no executor file left behind.
    assert sorted(p.name for p in Path(messages, "_delta_log").glob("*.json"))[-1] == (
        f"{1:020d}.json"
    )
    assert not [
        p for p in run_partition_dir(str(ledger), "many-1").iterdir() if is_data_file(p.name)
    ]
    rows = tables.read_arrow(str(ledger), "messages", run_id="many-1", columns=["source_queue"])
    assert rows.num_rows == 600
    assert len(pc.unique(rows["source_queue"])) == len(VHOSTS) * QUEUES_PER_VHOST
    for vhost in VHOSTS:
        assert sum(depth(brokers.dr, vhost, q) for q in queue_names(brokers.dr, vhost)) == 0


def test_progress_samples_a_vhost_of_many_queues_from_the_listing(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "many-sampled")
    count = AMQP_SAMPLE_MAX_QUEUES + 10
    seed_demo(brokers.dr.connect, vhosts=[vhost], per_vhost=count, messages_per_queue=3)
    wait_until_listed(brokers, vhost, count)
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "l")
    )
    transfers = [transfer(name, 3, vhost=vhost) for name in queue_names(brokers.dr, vhost)]
    sample = depth_sampler(config, transfers)

    # The listing's counts are sampled by the broker: they reach 3 within seconds.
    sampled: dict[str, dict[TransferKey, int]] = {}

    def all_three() -> bool:
        sampled.update(depths=sample())
        return set(sampled["depths"].values()) == {3} and len(sampled["depths"]) == count

    wait_until(all_three, "every queue sampled at 3 messages", timeout=LISTED_TIMEOUT_SECONDS)
    assert set(sampled["depths"]) == {t.key for t in transfers}
