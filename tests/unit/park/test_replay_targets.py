"""park/replay/targets: `--to` parsed, rendered per row, and `origin` decided per row.

Pure: no broker, no Spark, no ledger. Property blocks are built by the independent
encoder (tests/support/amqp_encoding.py) and read back by the selection language's
decoder, so an assertion on a rewritten block is on what a consumer would read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rmq_spark.cli import build_parser, main
from rmq_spark.config import JobConfig, parse_config
from rmq_spark.errors import ConfigError
from rmq_spark.park.replay.targets import (
    OriginTarget,
    Target,
    parse_target,
    parse_template,
    route_rows,
)
from rmq_spark.redrive.header_options import header_policy
from rmq_spark.redrive.headers import MOVED_HEADER, HeaderAction, HeaderPolicy
from rmq_spark.selection.fields import read_properties
from tests.support import amqp_encoding as amqp

DLQ = "shop.dlq"


def config_text() -> str:
    cluster = {"amqp": ["amqp://127.0.0.1:1"], "management": "http://127.0.0.1:1"}
    return yaml.safe_dump(
        {
            "clusters": {"dr": cluster, "main": cluster},
            "routes": [
                {
                    "name": "park",
                    "source": {"cluster": "dr", "queues": [DLQ]},
                    "destination": {"table": "parked"},
                }
            ],
            "ledger": {"path": "/tmp/unused-ledger"},
        }
    )


def config() -> JobConfig:
    return parse_config(config_text(), {})


def row(queue: str = DLQ, vhost: str = "shop", properties: bytes = b"\x00\x00") -> dict[str, Any]:
    return {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": queue,
        "position": 0,
        "properties": properties,
        "body": b"{}",
    }


def destination(target: Target, parked: dict[str, Any]) -> tuple[str, str, str]:
    route = target.route(parked)
    assert route is not None
    return route.queue


def dead(*entries: amqp.Value, expiration: str | None = None) -> bytes:
    headers = amqp.table_bytes(("tenant", amqp.short(7)), ("x-death", amqp.array(*entries)))
    return amqp.BasicProperties(headers=headers, message_id="m-1", expiration=expiration).encode()


def test_source_and_a_plain_queue_and_a_vhost_with_colons() -> None:
    source = parse_target("source", config())
    assert source.label == "source"
    assert source.queue is None
    assert destination(source, row("orders", "a:b")) == ("dr", "a:b", "orders")
    one = parse_target("main:a:b:orders", config())
    assert one.queue == ("main", "a:b", "orders")
    assert destination(one, row("anything")) == ("main", "a:b", "orders")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("main:/:{queue}", ("main", "/", "orders")),
        ("main:{vhost}:{queue}.replayed", ("main", "a:b", "orders.replayed")),
        ("{cluster}:{vhost}-copy:{queue}", ("dr", "a:b-copy", "orders")),
        ("main:/:{{{queue}}}", ("main", "/", "{orders}")),
        ("main:/:literal{{x}}", ("main", "/", "literal{x}")),
    ],
)
def test_a_template_renders_each_part_from_the_rows_source(
    template: str, expected: tuple[str, str, str]
) -> None:
    target = parse_target(template, config())
    assert target.label == template
    assert destination(target, row("orders", "a:b")) == expected


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("main:/:{source_queue}", r"unknown placeholder \{source_queue\}"),
        ("main:/:{queue!r}", r"unknown placeholder \{queue!r\}"),
        ("main:/:{queue:>9}", r"unknown placeholder \{queue:>9\}"),
        ("main:/:{}", r"unknown placeholder \{\}"),
        ("main:/:{queue", "malformed template"),
        ("main:/:queue}", "malformed template"),
        ("orders", "expected 'source', 'origin' or CLUSTER:VHOST:QUEUE"),
        ("main::orders", "expected 'source', 'origin' or CLUSTER:VHOST:QUEUE"),
        ("nowhere:/:orders", r"no cluster 'nowhere' in the config \(it has dr, main\)"),
    ],
)
def test_a_bad_template_is_one_error_naming_it(template: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        parse_target(template, config())
    assert f"--to {template!r}" in str(raised.value)


def test_a_cluster_placeholder_rendering_an_unknown_cluster_is_refused_before_publishing() -> None:
    rows = [row("orders"), {**row("refunds"), "source_cluster": "gone"}]
    with pytest.raises(ConfigError, match="would go to cluster 'gone', which is not in the"):
        route_rows(parse_template("source"), rows, parked_run_id="p", clusters=["dr"])


def test_origin_is_the_newest_x_death_entry_not_naming_the_parked_queue() -> None:
    rows = [
        row(properties=dead(amqp.death_entry("orders", "rejected", "o"))),
        row(
            properties=dead(
                amqp.death_entry(DLQ, "expired"), amqp.death_entry("payments", "rejected")
            )
        ),
        row(
            "other.dlq",
            properties=dead(
                amqp.death_entry("invoices", "expired"), amqp.death_entry("orders", "x")
            ),
        ),
    ]
    routed = route_rows(OriginTarget(), rows, parked_run_id="p", clusters=["dr"])
    assert [r["_to"] for r in routed] == [
        ("dr", "shop", "orders"),
        ("dr", "shop", "payments"),
        ("dr", "shop", "invoices"),
    ]


def test_rows_without_an_origin_are_counted_and_refused_never_guessed() -> None:
    rows = [
        row(properties=dead(amqp.death_entry("orders", "rejected"))),
        row(properties=amqp.BasicProperties(message_id="plain").encode()),
        row(properties=dead(amqp.death_entry(DLQ, "expired"))),  # only the DLQ itself
        row(properties=b"\x10\x00"),  # says delivery-mode follows, ends: unreadable
    ]
    with pytest.raises(ConfigError) as raised:
        route_rows(OriginTarget(), rows, parked_run_id="park-7", clusters=["dr"])
    said = str(raised.value)
    assert said.startswith("--to origin: 2 of the 4 selected rows of parked run 'park-7' have no")
    assert "1 of the 4 selected rows of parked run 'park-7' have a property block" in said
    assert "replay them with --to source or a queue, or leave them out with --where" in said
    assert said.endswith("nothing was published")


def test_origin_moves_the_broker_headers_by_default_and_keeps_the_rest() -> None:
    raw = dead(amqp.death_entry("invoices", "expired", "inv", expiration="500"))
    [routed] = route_rows(OriginTarget(), [row(properties=raw)], parked_run_id="p", clusters=["dr"])
    sent = read_properties(routed["_sent"])
    assert routed["_sent"] != raw
    assert "x-death" not in sent.headers
    assert (sent.headers["tenant"].type, sent.headers["tenant"].value) == ("short-int", 7)
    assert MOVED_HEADER in sent.headers
    assert sent.values.get("message_id") == "m-1"
    assert sent.values.get("expiration") is None


def test_origin_with_keep_sends_the_parked_bytes_exactly_and_restores_the_ttl_when_asked() -> None:
    raw = dead(amqp.death_entry("invoices", "expired", "inv", expiration="500"))
    keep = OriginTarget(HeaderPolicy(HeaderAction.KEEP))
    [kept] = route_rows(keep, [row(properties=raw)], parked_run_id="p", clusters=["dr"])
    assert kept["_sent"] == raw
    restore = OriginTarget(HeaderPolicy(HeaderAction.REMOVE, restore_expiration=True))
    [restored] = route_rows(restore, [row(properties=raw)], parked_run_id="p", clusters=["dr"])
    sent = read_properties(restored["_sent"])
    assert sent.values.get("expiration") == "500"
    assert set(sent.headers) == {"tenant"}


def test_origin_parses_with_the_policy_given() -> None:
    target = parse_target("origin", config(), HeaderPolicy(HeaderAction.REMOVE))
    assert isinstance(target, OriginTarget)
    assert (target.label, target.queue, target.policy.broker_headers) == (
        "origin",
        None,
        HeaderAction.REMOVE,
    )


def test_the_header_policy_options_are_refused_for_other_targets_before_any_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(config_text())
    for extra in (["--broker-headers", "keep"], ["--restore-expiration"]):
        code = main(
            ["replay", "--config", str(config_file), "--parked", "p", "--to", "source", *extra]
        )
        assert code == 2
        assert "--broker-headers and --restore-expiration apply to --to origin only; --to " in (
            capsys.readouterr().err
        )
    parsed = build_parser().parse_args(
        ["replay", "--config", "c", "--parked", "p", "--to", "origin"]
    )
    assert header_policy(parsed) == HeaderPolicy()
