"""Pausing and restoring federation upstreams: the planning, every crash window, config."""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.broker.federation import (
    PAUSED_PREFIX,
    FederationError,
    Step,
    Upstream,
    clone_name,
    linked,
    pause,
    pause_steps,
    paused_after,
    paused_federation,
    restore,
    restore_steps,
    set_all_hazards,
    source_clusters,
)
from rmq_spark.config import parse_config
from rmq_spark.errors import AccessRefusedError, ConfigError

ART = {"uri": "amqp://art:s3cret@art-host:5672/orders", "prefetch-count": 100}
BACKUP = {"uri": "amqp://art:s3cret@art-backup:5672/orders", "ack-mode": "on-publish"}


def upstream(name: str, value: dict[str, Any], vhost: str = "orders") -> Upstream:
    return Upstream(vhost=vhost, name=name, value=value)


def apply(upstreams: list[Upstream], steps: list[Step]) -> list[Upstream]:
    """What the broker holds after the steps, as the management API would do them."""
    held = {(u.vhost, u.name): u for u in upstreams}
    for step in steps:
        if step.action == "put":
            assert step.value is not None
            held[(step.vhost, step.name)] = upstream(step.name, step.value, step.vhost)
        else:
            held.pop((step.vhost, step.name), None)
    return sorted(held.values(), key=lambda u: (u.vhost, u.name))


def test_parameter_rows_become_upstreams() -> None:
    row = {"vhost": "orders", "component": "federation-upstream", "name": "art", "value": ART}
    parsed = Upstream.from_parameter(row)
    assert parsed == upstream("art", ART)
    assert not parsed.is_clone
    assert parsed.original_name == "art"
    clone = upstream(clone_name("art"), ART)
    assert clone.name == "rmq-spark-paused--art"
    assert clone.is_clone
    assert clone.original_name == "art"


def test_pause_clones_each_upstream_then_deletes_it() -> None:
    found = [upstream("art", ART), upstream("art-backup", BACKUP, vhost="billing")]
    steps = pause_steps(found)
    assert steps == [
        Step("put", "billing", "rmq-spark-paused--art-backup", BACKUP),
        Step("delete", "billing", "art-backup"),
        Step("put", "orders", "rmq-spark-paused--art", ART),
        Step("delete", "orders", "art"),
    ]
    assert apply(found, steps) == [
        upstream("rmq-spark-paused--art-backup", BACKUP, vhost="billing"),
        upstream("rmq-spark-paused--art", ART),
    ]


def test_pause_then_restore_gives_back_identical_definitions() -> None:
    found = [upstream("art", ART), upstream("art-backup", BACKUP)]
    paused = apply(found, pause_steps(found))
    assert apply(paused, restore_steps(paused)) == found


def test_pausing_paused_upstreams_changes_nothing_and_never_clones_a_clone() -> None:
    paused = [upstream("rmq-spark-paused--art", ART)]
    assert pause_steps(paused) == []
    twice = apply(paused, pause_steps(paused))
    assert twice == paused
    assert not any(u.name.startswith(PAUSED_PREFIX * 2) for u in twice)


def test_pause_after_a_crash_between_clone_and_delete_only_deletes_the_original() -> None:
    both = [upstream("art", ART), upstream("rmq-spark-paused--art", ART)]
    assert pause_steps(both) == [Step("delete", "orders", "art")]
    assert apply(both, pause_steps(both)) == [upstream("rmq-spark-paused--art", ART)]


def test_restore_after_a_crash_in_either_window_keeps_the_original() -> None:
    both = [upstream("art", ART), upstream("rmq-spark-paused--art", ART)]
    assert restore_steps(both) == [Step("delete", "orders", "rmq-spark-paused--art")]
    assert apply(both, restore_steps(both)) == [upstream("art", ART)]


def test_restore_with_nothing_paused_does_nothing() -> None:
    assert restore_steps([upstream("art", ART)]) == []
    assert restore_steps([]) == []
    assert pause_steps([]) == []


def test_an_original_changed_by_hand_while_paused_wins_over_the_clone() -> None:
    changed = {**ART, "prefetch-count": 5}
    both = [upstream("art", changed), upstream("rmq-spark-paused--art", ART)]
    assert apply(both, restore_steps(both)) == [upstream("art", changed)]
    paused = apply(both, pause_steps(both))
    assert paused == [upstream("rmq-spark-paused--art", changed)]
    assert apply(paused, restore_steps(paused)) == [upstream("art", changed)]


def test_same_names_in_different_vhosts_are_different_upstreams() -> None:
    found = [upstream("art", ART, vhost="orders"), upstream("rmq-spark-paused--art", BACKUP, "b")]
    assert pause_steps(found) == [
        Step("put", "orders", "rmq-spark-paused--art", ART),
        Step("delete", "orders", "art"),
    ]
    assert paused_after(found) == [("b", "art"), ("orders", "art")]


def test_step_descriptions_name_vhost_and_upstream_but_never_the_uri() -> None:
    step = pause_steps([upstream("art", ART)])[0]
    assert step.describe() == "define vhost 'orders' upstream 'rmq-spark-paused--art'"
    assert "s3cret" not in step.describe()
    assert "s3cret" not in repr(Step("delete", "orders", "art"))


def test_a_policy_on_the_all_upstream_set_is_a_hazard_only_where_upstreams_exist() -> None:
    policies = [
        {"vhost": "orders", "name": "fed-all", "definition": {"federation-upstream-set": "all"}},
        {"vhost": "orders", "name": "fed-art", "definition": {"federation-upstream": "art"}},
        {"vhost": "orders", "name": "fed-set", "definition": {"federation-upstream-set": "dc"}},
        {"vhost": "empty", "name": "fed-all", "definition": {"federation-upstream-set": "all"}},
        {"vhost": "orders", "name": "limits", "definition": {"max-length": 10}},
    ]
    assert set_all_hazards([upstream("art", ART)], policies) == [("orders", "fed-all")]
    assert set_all_hazards([], policies) == []


def test_links_of_paused_upstreams_are_found_by_vhost_and_upstream() -> None:
    links = [
        {"vhost": "orders", "upstream": "art", "status": "running", "queue": "q1"},
        {"vhost": "billing", "upstream": "art", "status": "starting", "queue": "q2"},
        {"vhost": "orders", "upstream": "other", "status": "running", "queue": "q3"},
    ]
    assert linked(links, [("orders", "art")]) == [("orders", "art", "running")]
    assert linked([], [("orders", "art")]) == []


CONFIG = """
clusters:
  dr: {amqp: ["amqp://dr:5672"], management: "http://dr:15672"}
  main: {amqp: ["amqp://main:5672"], management: "http://main:15672"}
  other: {amqp: ["amqp://other:5672"], management: "http://other:15672"}
routes:
  - {name: a, source: {cluster: dr}, destination: {cluster: main}}
  - {name: b, source: {cluster: other}, destination: {cluster: main}}
  - {name: c, source: {cluster: dr, vhosts: [x]}, destination: {cluster: main}}
ledger: {path: /tmp/ledger}
"""


def test_federation_defaults_to_keep_and_accepts_pause() -> None:
    assert parse_config(CONFIG, {}).federation == "keep"
    assert parse_config(CONFIG + "federation: pause\n", {}).federation == "pause"


def test_an_unknown_federation_mode_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"federation: Input should be 'keep' or 'pause'"):
        parse_config(CONFIG + "federation: stop\n", {})


def test_only_source_clusters_are_paused_each_once() -> None:
    assert source_clusters(parse_config(CONFIG, {})) == ["dr", "other"]


class FakeManagement:
    """The management API calls federation.py makes, over an in-memory broker."""

    def __init__(self, cluster_name: str, upstreams: list[Upstream], **behaviour: Any) -> None:
        self.cluster_name = cluster_name
        self.held = {(u.vhost, u.name): u for u in upstreams}
        self.policy_rows: list[dict[str, Any]] = behaviour.get("policies", [])
        self.links: Any = behaviour.get("links", [])  # rows, None (no plugin) or an error
        self.refuse_puts = False
        self.calls: list[str] = []

    def parameters(self, component: str) -> list[dict[str, Any]]:
        assert component == "federation-upstream"
        return [{"vhost": v, "name": n, "value": u.value} for (v, n), u in self.held.items()]

    def policies(self) -> list[dict[str, Any]]:
        return self.policy_rows

    def federation_links(self) -> list[dict[str, Any]] | None:
        if isinstance(self.links, Exception):
            raise self.links
        return self.links

    def put_parameter(self, component: str, vhost: str, name: str, value: dict[str, Any]) -> None:
        if self.refuse_puts:
            raise ConfigError(f"cluster {self.cluster_name}: HTTP 503")
        self.calls.append(f"put {vhost}/{name}")
        self.held[(vhost, name)] = upstream(name, value, vhost)

    def delete_parameter(self, component: str, vhost: str, name: str) -> None:
        self.calls.append(f"delete {vhost}/{name}")
        self.held.pop((vhost, name), None)

    def names(self) -> list[str]:
        return sorted(f"{v}/{n}" for v, n in self.held)


def pausing_config() -> Any:
    return parse_config(CONFIG + "federation: pause\n", {})


def test_paused_inside_the_block_and_restored_after_it() -> None:
    clients = {
        "dr": FakeManagement("dr", [upstream("art", ART)]),
        "other": FakeManagement("other", []),
    }
    with paused_federation(pausing_config(), clients) as paused:
        assert paused == [("dr", "orders", "art")]
        assert clients["dr"].names() == ["orders/rmq-spark-paused--art"]
    assert clients["dr"].names() == ["orders/art"]
    assert clients["dr"].held[("orders", "art")].value == ART


def test_keep_touches_nothing() -> None:
    clients = {
        "dr": FakeManagement("dr", [upstream("art", ART)]),
        "other": FakeManagement("other", []),
    }
    config = parse_config(CONFIG, {})
    with paused_federation(config, clients) as paused:
        assert paused == []
    assert clients["dr"].calls == []


def move_failing(clients: dict[str, FakeManagement], *, refuse_restore: bool = False) -> None:
    """A run whose move stage fails inside the paused block."""
    with paused_federation(pausing_config(), clients):  # type: ignore[arg-type]
        clients["dr"].refuse_puts = refuse_restore
        raise RuntimeError("executor lost")


def test_restored_when_the_block_fails() -> None:
    clients = {
        "dr": FakeManagement("dr", [upstream("art", ART)]),
        "other": FakeManagement("other", []),
    }
    with pytest.raises(RuntimeError, match="executor lost"):
        move_failing(clients)
    assert clients["dr"].names() == ["orders/art"]


def test_a_failed_restore_after_a_failed_run_names_both() -> None:
    clients = {
        "dr": FakeManagement("dr", [upstream("art", ART)]),
        "other": FakeManagement("other", []),
    }
    with pytest.raises(FederationError) as raised:
        move_failing(clients, refuse_restore=True)
    message = str(raised.value)
    assert "cluster dr define vhost 'orders' upstream 'art': could not restore" in message
    assert "rmq-spark restore-federation" in message
    assert "the run had failed first: executor lost" in message
    assert clients["dr"].names() == ["orders/rmq-spark-paused--art"]  # still saved


def test_a_policy_on_the_all_set_stops_the_pause_before_anything_changes() -> None:
    policy = {
        "vhost": "orders",
        "name": "fed-all",
        "definition": {"federation-upstream-set": "all"},
    }
    clients = {
        "dr": FakeManagement("dr", [upstream("art", ART)], policies=[policy]),
        "other": FakeManagement("other", []),
    }
    with pytest.raises(FederationError, match=r"cluster dr vhost 'orders' policy 'fed-all'"):
        move_failing(clients)
    assert clients["dr"].calls == []


def test_links_that_outlive_their_upstream_fail_the_pause_and_it_is_undone() -> None:
    link = {"vhost": "orders", "upstream": "art", "status": "running"}
    clients = {
        "dr": FakeManagement("dr", [upstream("art", ART)], links=[link]),
        "other": FakeManagement("other", []),
    }
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(FederationError, match=r"vhost 'orders' upstream 'art' \(running\)"):
        pause(clients["dr"], link_timeout=1.0, sleep=sleep, clock=lambda: now[0])
    assert clients["dr"].names() == ["orders/rmq-spark-paused--art"]
    assert restore(clients["dr"]) == [("orders", "art")]
    assert clients["dr"].names() == ["orders/art"]


def test_without_the_links_api_the_pause_does_not_wait() -> None:
    client = FakeManagement("dr", [upstream("art", ART)], links=None)
    assert pause(client) == [("orders", "art")]


def test_a_user_who_may_not_see_links_pauses_without_waiting() -> None:
    refused = AccessRefusedError("cluster dr management API (dr:15672): Not monitor user")
    client = FakeManagement("dr", [upstream("art", ART)], links=refused)
    assert pause(client) == [("orders", "art")]
    assert client.names() == ["orders/rmq-spark-paused--art"]
