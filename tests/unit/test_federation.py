"""Pausing federation with override policies: the planning, every crash window, config."""

from __future__ import annotations

import io
import re
from typing import Any, cast

import pytest

from rmq_spark.broker import federation_guard
from rmq_spark.broker.federation import (
    pause,
    pause_preview,
    paused_federation,
    restore,
    restore_federation,
    source_clusters,
)
from rmq_spark.broker.federation_clones import Step, Upstream, restore_steps
from rmq_spark.broker.federation_links import linked
from rmq_spark.broker.federation_plan import (
    MAX_PATTERN_BYTES,
    PLACEHOLDER_UPSTREAM,
    Policy,
    escape,
    listed_policy,
    overridden_policy,
    override_name,
    pattern_queue_names,
    pause_plan,
    queue_names_pattern,
    restore_plan,
)
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import parse_config
from rmq_spark.errors import AccessRefusedError, ConfigError, FederationError
from rmq_spark.model import QueueTransfer
from rmq_spark.planning.rules import matching_queues
from rmq_spark.report.console import plan_document, print_plan_table

FED_ALL = {"federation-upstream-set": "all"}
FED_SET_WITH_LIMITS = {
    "federation-upstream-set": "main-set",
    "max-length": 1000,
    "dead-letter-exchange": "dlx",
}


def policy(
    name: str, definition: dict[str, Any], *, vhost: str = "orders", priority: int = 0
) -> Policy:
    return Policy(
        vhost=vhost,
        name=name,
        pattern=r"^orders\.",
        apply_to="all",
        priority=priority,
        definition=definition,
    )


def pcre_matches(pattern: str, name: str) -> bool:
    """RabbitMQ's match of a policy pattern, for the patterns built here: Python's
    `re` spells PCRE's `\\z` (end of subject) `\\Z`."""
    return re.search(pattern.replace("\\z", "\\Z"), name) is not None


# -- planning -------------------------------------------------------------------------


def test_every_way_of_selecting_upstreams_gets_an_override_without_the_federation_key() -> None:
    for key, value in (
        ("federation-upstream", "up"),
        ("federation-upstream-set", "all"),
        ("federation-upstream-set", "main-set"),
        ("federation-upstream-pattern", "^up"),
    ):
        plan = pause_plan(
            {("orders", "orders.a"): "fed"}, [policy("fed", {key: value, "max-length": 5})]
        )
        (override,) = plan.overrides
        assert override.definition == {"max-length": 5}, key
        assert override.dropped == (key,)


def test_an_override_matches_exactly_the_moved_queues_above_the_original() -> None:
    queues = {("orders", "orders.a"): "fed", ("orders", "orders.b"): "fed"}
    plan = pause_plan(queues, [policy("fed", FED_SET_WITH_LIMITS, priority=7)])
    (override,) = plan.overrides
    assert override.name == "rmq-spark-paused-1--fed"
    assert override.original == "fed"
    assert override.priority == 8
    assert override.definition == {"max-length": 1000, "dead-letter-exchange": "dlx"}
    assert override.pattern == "^(?:orders\\.a|orders\\.b)\\z"
    assert [n for n in ("orders.a", "orders.b") if pcre_matches(override.pattern, n)] == [
        "orders.a",
        "orders.b",
    ]
    for other in ("orders.c", "orders.ab", "xorders.a", "orders.a\n", "ordersXa"):
        assert not pcre_matches(override.pattern, other), other
    assert plan.paused_queues() == [("orders", "orders.a"), ("orders", "orders.b")]
    assert plan.stale == ()
    assert plan.problems == ()


def test_a_policy_holding_only_its_federation_key_names_an_upstream_no_one_defines() -> None:
    plan = pause_plan({("orders", "orders.a"): "fed"}, [policy("fed", FED_ALL)])
    (override,) = plan.overrides
    assert override.definition == {"federation-upstream": PLACEHOLDER_UPSTREAM}
    assert override.dropped == ("federation-upstream-set",)


def test_queues_without_a_federation_policy_are_left_alone() -> None:
    queues = {("orders", "orders.a"): "limits", ("orders", "orders.b"): None}
    plan = pause_plan(queues, [policy("limits", {"max-length": 5})])
    assert plan.overrides == ()
    assert plan.paused_queues() == []


def test_each_policy_and_vhost_gets_its_own_override() -> None:
    queues = {
        ("orders", "orders.a"): "fed",
        ("orders", "orders.b"): "fed-eu",
        ("billing", "orders.a"): "fed",
    }
    plan = pause_plan(
        queues,
        [
            policy("fed", FED_ALL),
            policy("fed-eu", FED_SET_WITH_LIMITS, priority=4),
            policy("fed", FED_ALL, vhost="billing", priority=1),
        ],
    )
    assert [(o.vhost, o.name, o.queues, o.priority) for o in plan.overrides] == [
        ("billing", "rmq-spark-paused-1--fed", ("orders.a",), 2),
        ("orders", "rmq-spark-paused-1--fed", ("orders.a",), 1),
        ("orders", "rmq-spark-paused-1--fed-eu", ("orders.b",), 5),
    ]


def test_names_are_escaped_so_they_match_literally() -> None:
    name = "a.b*c+(d)|[e]^$\\f g-h/é"
    pattern = queue_names_pattern([name])
    assert pcre_matches(pattern, name)
    assert not pcre_matches(pattern, "a.b*c+(d)|[e]^$\\f g-h/e")
    assert escape("q-1.x") == "q\\-1\\.x"


def test_an_override_s_pattern_reads_back_as_its_queue_names() -> None:
    names = ("fed.a", "a.b*c+(d)|[e]^$\\f g-h/é", "q-1")
    assert pattern_queue_names(queue_names_pattern(names)) == names
    assert pattern_queue_names("^fed\\.") is None  # a hand-made pattern: not ours
    assert pattern_queue_names("^(?:a.b)\\z") is None  # an unescaped dot


def test_many_queues_are_split_so_each_pattern_fits_rabbitmq_s_limit() -> None:
    names = [f"orders.{i:04d}-{'x' * 40}" for i in range(100)]
    plan = pause_plan({("orders", n): "fed" for n in names}, [policy("fed", FED_ALL)])
    assert len(plan.overrides) > 1
    assert [o.name for o in plan.overrides][:2] == [
        "rmq-spark-paused-1--fed",
        "rmq-spark-paused-2--fed",
    ]
    assert all(len(o.pattern.encode()) <= MAX_PATTERN_BYTES for o in plan.overrides)
    assert sorted(q for o in plan.overrides for q in o.queues) == sorted(names)


def test_a_queue_a_crashed_run_left_paused_is_paused_again_under_its_own_policy() -> None:
    left = override_name("fed", 1)
    plan = pause_plan(
        {("orders", "orders.a"): left},
        [policy("fed", FED_ALL), policy(left, {"federation-upstream": PLACEHOLDER_UPSTREAM})],
    )
    assert [o.name for o in plan.overrides] == [left]
    assert plan.stale == ()


def test_overrides_no_longer_wanted_are_stale() -> None:
    left = [policy(override_name("fed", 2), {"max-length": 1}), policy(override_name("x", 1), {})]
    plan = pause_plan({("orders", "orders.a"): "fed"}, [policy("fed", FED_ALL), *left])
    assert plan.stale == (
        ("orders", "rmq-spark-paused-1--x"),
        ("orders", "rmq-spark-paused-2--fed"),
    )


def test_a_paused_queue_whose_policy_is_gone_is_a_problem() -> None:
    plan = pause_plan({("orders", "orders.a"): override_name("fed", 1)}, [])
    assert plan.overrides == ()
    assert plan.problems == (
        "vhost 'orders' queue 'orders.a': paused by 'rmq-spark-paused-1--fed', but policy "
        "'fed' is gone; run `rmq-spark restore-federation` first",
    )


def test_override_names_map_back_to_their_policy() -> None:
    assert overridden_policy("rmq-spark-paused-3--fed--eu") == "fed--eu"
    assert overridden_policy("rmq-spark-paused--up") is None  # an earlier build's clone
    assert overridden_policy("fed") is None
    assert listed_policy("rmq-spark-paused-1--fed") == "fed"
    assert listed_policy("fed") == "fed"
    assert listed_policy(None) is None


def test_restore_deletes_every_override_and_nothing_else() -> None:
    kept = [policy("fed", FED_ALL), policy("rmq-spark-paused--x", {"max-length": 1})]
    overrides = [policy(override_name("fed", 1), {}), policy(override_name("fed", 2), {})]
    assert restore_plan([*kept, *overrides]) == overrides


def test_policy_rows_parse() -> None:
    row = {
        "vhost": "orders",
        "name": "fed",
        "pattern": "^o",
        "apply-to": "queues",
        "priority": 3,
        "definition": FED_ALL,
    }
    parsed = Policy.from_row(row)
    assert (parsed.priority, parsed.apply_to, parsed.federates) == (3, "queues", True)
    assert not parsed.is_override


# -- clones left by earlier builds -----------------------------------------------------

UP = {"uri": "amqp://up:s3cret@main-host:5672/orders", "prefetch-count": 100}


def test_an_earlier_build_s_clone_is_restored_unless_the_original_is_back() -> None:
    clone = Upstream("orders", "rmq-spark-paused--up", UP)
    assert restore_steps([clone]) == [
        Step("put", "orders", "up", UP),
        Step("delete", "orders", "rmq-spark-paused--up"),
    ]
    redefined = Upstream("orders", "up", {"uri": "amqp://other"})
    assert restore_steps([clone, redefined]) == [Step("delete", "orders", "rmq-spark-paused--up")]
    assert "s3cret" not in Step("put", "orders", "up", UP).describe()


# -- config -------------------------------------------------------------------------

CONFIG = """
clusters:
  dr: {amqp: [amqp://dr:5672], management: http://dr:15672, username: u}
  other: {amqp: [amqp://o:5672], management: http://o:15672, username: u}
  main: {amqp: [amqp://m:5672], management: http://m:15672, username: u}
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


# -- running it (an in-memory management API) ---------------------------------------


class FakeManagement:
    """The management API calls federation.py makes, over an in-memory broker."""

    def __init__(
        self, cluster_name: str, policies: list[Policy], listed: dict[str, str], **behaviour: Any
    ) -> None:
        self.cluster_name = cluster_name
        self.held = {(p.vhost, p.name): p for p in policies}
        self.listed = listed  # queue of vhost orders -> its policy
        self.upstream_rows: list[dict[str, Any]] = behaviour.get("upstreams", [])
        # rows, None (no plugin) or an error
        self.links: list[dict[str, Any]] | Exception | None = behaviour.get("links", [])
        self.refuse_deletes = False
        self.connection_names: list[str] = behaviour.get("connections", [])
        self.consumer_rows: list[dict[str, Any]] = []
        self.calls: list[str] = []

    def as_client(self) -> ManagementClient:
        """This fake where federation.py wants the real client (it answers its calls)."""
        return cast(ManagementClient, self)

    def consumers(self) -> list[dict[str, Any]]:
        return self.consumer_rows

    def connections(self) -> list[dict[str, Any]]:
        return [
            {"name": f"127.0.0.1:{i}", "client_properties": {"connection_name": name}}
            for i, name in enumerate(self.connection_names)
        ]

    def queues(self, vhost: str, columns: str) -> list[dict[str, Any]]:
        assert columns == "name,policy"
        return [{"name": q, "policy": p} for q, p in self.listed.items() if vhost == "orders"]

    def policies(self) -> list[dict[str, Any]]:
        return [
            {
                "vhost": p.vhost,
                "name": p.name,
                "pattern": p.pattern,
                "apply-to": p.apply_to,
                "priority": p.priority,
                "definition": p.definition,
            }
            for p in self.held.values()
        ]

    def parameters(self, component: str) -> list[dict[str, Any]]:
        assert component == "federation-upstream"
        return self.upstream_rows

    def federation_links(self) -> list[dict[str, Any]] | None:
        if isinstance(self.links, Exception):
            raise self.links
        return self.links

    def put_policy(
        self,
        vhost: str,
        name: str,
        *,
        pattern: str,
        apply_to: str,
        priority: int,
        definition: dict[str, Any],
    ) -> None:
        self.calls.append(f"put {vhost}/{name}")
        self.held[(vhost, name)] = Policy(vhost, name, pattern, apply_to, priority, definition)

    def delete_policy(self, vhost: str, name: str) -> None:
        if self.refuse_deletes:
            raise ConfigError(f"cluster {self.cluster_name}: HTTP 503")
        self.calls.append(f"delete {vhost}/{name}")
        self.held.pop((vhost, name), None)

    def names(self) -> list[str]:
        return sorted(f"{v}/{n}" for v, n in self.held)


def transfer(cluster: str, queue: str) -> QueueTransfer:
    return QueueTransfer(
        route="a",
        source_cluster=cluster,
        source_vhost="orders",
        source_queue=queue,
        source_type="classic",
        source_node="",
        destination_cluster="main",
        destination_vhost="orders",
        destination_queue=queue,
        messages=1,
        message_bytes=0,
        destination_messages=0,
    )


def dr_and_other() -> dict[str, FakeManagement]:
    return {
        "dr": FakeManagement("dr", [policy("fed", FED_ALL)], {"orders.a": "fed", "plain": ""}),
        "other": FakeManagement("other", [], {}),
    }


MOVED = [transfer("dr", "orders.a"), transfer("dr", "plain")]


def pausing_config() -> Any:
    return parse_config(CONFIG + "federation: pause\n", {})


def test_paused_inside_the_block_and_restored_after_it() -> None:
    clients = dr_and_other()
    with paused_federation(pausing_config(), clients, MOVED) as paused:  # type: ignore[arg-type]
        assert paused == [("dr", "orders", "orders.a")]
        assert clients["dr"].names() == ["orders/fed", "orders/rmq-spark-paused-1--fed"]
    assert clients["dr"].names() == ["orders/fed"]
    assert clients["dr"].held[("orders", "fed")] == policy("fed", FED_ALL)  # never changed


def test_keep_touches_nothing() -> None:
    clients = dr_and_other()
    with paused_federation(parse_config(CONFIG, {}), clients, MOVED) as paused:  # type: ignore[arg-type]
        assert paused == []
    assert clients["dr"].calls == []


def test_the_dry_run_shows_the_override_of_each_queue_and_changes_nothing() -> None:
    clients = dr_and_other()
    preview = pause_preview(pausing_config(), clients, MOVED)  # type: ignore[arg-type]
    assert list(preview) == [("dr", "orders", "orders.a")]
    assert preview[("dr", "orders", "orders.a")].as_plan_entry() == {
        "paused_by": "rmq-spark-paused-1--fed",
        "priority": 1,
        "definition": {"federation-upstream": PLACEHOLDER_UPSTREAM},
        "dropped": ["federation-upstream-set"],
        "restored": "fed",
    }
    assert clients["dr"].calls == []


def move_failing(clients: dict[str, FakeManagement], *, refuse_restore: bool = False) -> None:
    """A run whose move stage fails inside the paused block."""
    with paused_federation(pausing_config(), clients, MOVED):  # type: ignore[arg-type]
        clients["dr"].refuse_deletes = refuse_restore
        raise RuntimeError("executor lost")


def test_restored_when_the_block_fails() -> None:
    clients = dr_and_other()
    with pytest.raises(RuntimeError, match="executor lost"):
        move_failing(clients)
    assert clients["dr"].names() == ["orders/fed"]


def test_a_failed_restore_after_a_failed_run_names_both() -> None:
    clients = dr_and_other()
    with pytest.raises(FederationError) as raised:
        move_failing(clients, refuse_restore=True)
    message = str(raised.value)
    assert (
        "cluster dr vhost 'orders': could not delete policy 'rmq-spark-paused-1--fed' "
        "to restore federation" in message
    )
    assert "rmq-spark restore-federation" in message
    assert "the run had failed first: executor lost" in message
    assert clients["dr"].names() == ["orders/fed", "orders/rmq-spark-paused-1--fed"]


def test_an_upstream_named_like_the_placeholder_stops_the_pause_before_anything_changes() -> None:
    clients = dr_and_other()
    clients["dr"].upstream_rows = [{"vhost": "orders", "name": PLACEHOLDER_UPSTREAM, "value": {}}]
    with pytest.raises(FederationError, match=r"an upstream is named 'rmq-spark-paused'"):
        move_failing(clients)
    assert clients["dr"].calls == []


def test_links_that_outlive_the_pause_fail_it_and_it_is_undone() -> None:
    link = {"vhost": "orders", "queue": "orders.a", "upstream": "up", "status": "running"}
    client = FakeManagement("dr", [policy("fed", FED_ALL)], {"orders.a": "fed"}, links=[link])
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(FederationError, match=r"queue 'orders.a' upstream 'up' \(running\)"):
        pause(
            client.as_client(),
            [("orders", "orders.a")],
            link_timeout=1.0,
            sleep=sleep,
            clock=lambda: now[0],
        )
    assert restore(client.as_client()) == [
        ("orders", "federation of policy 'fed' (override 'rmq-spark-paused-1--fed' deleted)")
    ]
    assert client.names() == ["orders/fed"]


def test_links_of_other_queues_and_exchanges_are_not_waited_for() -> None:
    rows = [
        {"vhost": "orders", "exchange": "orders.x", "upstream": "up", "status": "running"},
        {"vhost": "orders", "queue": "orders.b", "upstream": "up", "status": "running"},
        {"vhost": "billing", "queue": "orders.a", "upstream": "up", "status": "starting"},
        {"vhost": "orders", "queue": "orders.a", "upstream": "up", "status": "running"},
    ]
    assert linked(rows, [("orders", "orders.a")]) == [("orders", "orders.a", "up", "running")]


def test_without_the_links_api_the_pause_does_not_wait() -> None:
    client = FakeManagement("dr", [policy("fed", FED_ALL)], {"orders.a": "fed"}, links=None)
    assert pause(client.as_client(), [("orders", "orders.a")]) == [("orders", "orders.a")]


def test_a_user_who_may_not_see_links_pauses_without_waiting() -> None:
    refused = AccessRefusedError("cluster dr management API (dr:15672): Not monitor user")
    client = FakeManagement("dr", [policy("fed", FED_ALL)], {"orders.a": "fed"}, links=refused)
    assert pause(client.as_client(), [("orders", "orders.a")]) == [("orders", "orders.a")]
    assert client.names() == ["orders/fed", "orders/rmq-spark-paused-1--fed"]


def test_the_plan_shows_how_each_queue_is_paused_and_what_applies_after() -> None:
    override = pause_plan({("orders", "orders.a"): "fed"}, [policy("fed", FED_ALL)]).overrides[0]
    document = plan_document(
        pausing_config(), MOVED, [0, 0], {("dr", "orders", "orders.a"): override}
    )
    assert document["federation"] == "pause"
    assert [q["federation"] for q in document["queues"]] == [override.as_plan_entry(), None]
    out = io.StringIO()
    print_plan_table(document, file=out)
    text = out.getvalue()
    assert (
        "paused by rmq-spark-paused-1--fed (priority 1, no federation-upstream-set); "
        "after: fed again" in text
    )
    assert "not federated" in text
    kept = plan_document(parse_config(CONFIG, {}), MOVED, [0, 0])
    out = io.StringIO()
    print_plan_table(kept, file=out)
    assert "federation" not in out.getvalue()  # federation: keep: no such column


def test_restore_federation_refuses_while_a_mover_still_consumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: dict[str, int] = {}  # what the queues themselves count (passive declare)
    monkeypatch.setattr(
        federation_guard,
        "consumer_counts",
        lambda _cluster, _config, vhost, queues: {q: counted.get(q, 0) for q in queues},
    )
    clients = dr_and_other()
    with paused_federation(pausing_config(), clients, MOVED):  # type: ignore[arg-type]
        clients["dr"].connection_names = [
            "rmq-spark run-7 consumer vhost orders",
            "rmq-spark run-7 publisher vhost orders",  # main's side: no link pulls there
            "shop-frontend",
        ]
        with pytest.raises(FederationError) as raised:
            restore_federation(pausing_config(), clients, unless_consuming=True)  # type: ignore[arg-type]
        assert "cluster dr: rmq-spark run-7 consumer vhost orders" in str(raised.value)
        assert "publisher" not in str(raised.value)
        assert "shop-frontend" not in str(raised.value)
        assert clients["dr"].names() == ["orders/fed", "orders/rmq-spark-paused-1--fed"]
        # The connection is gone, but the queue still lists its consumer: closing.
        clients["dr"].connection_names = ["shop-frontend"]
        clients["dr"].consumer_rows = [
            {
                "queue": {"name": "orders.a", "vhost": "orders"},
                "channel_details": {"connection_name": "127.0.0.1:9 -> 127.0.0.1:5672"},
            },
            {
                "queue": {"name": "shop", "vhost": "orders"},
                "channel_details": {"connection_name": "127.0.0.1:0"},
            },
        ]
        with pytest.raises(FederationError) as raised:
            restore_federation(pausing_config(), clients, unless_consuming=True)  # type: ignore[arg-type]
        assert (
            "cluster dr: a consumer of queue 'orders.a' in vhost 'orders' whose connection "
            "is closing" in str(raised.value)
        )
        assert "'shop'" not in str(raised.value)
        clients["dr"].consumer_rows = clients["dr"].consumer_rows[1:]
        # The API lists it no more, but the queue still counts it (its channel closed
        # before the queue dropped it): a link restored now would pull for it.
        counted["orders.a"] = 1
        with pytest.raises(FederationError) as raised:
            restore_federation(pausing_config(), clients, unless_consuming=True)  # type: ignore[arg-type]
        assert (
            "cluster dr: queue 'orders.a' in vhost 'orders' still counts 1 consumer(s) whose "
            "connection is gone" in str(raised.value)
        )
        # A consumer the API lists on an open connection is nobody's ghost.
        clients["dr"].consumer_rows.append(
            {
                "queue": {"name": "orders.a", "vhost": "orders"},
                "channel_details": {"connection_name": "127.0.0.1:0"},
            }
        )
        assert restore_federation(pausing_config(), clients, unless_consuming=True) == [  # type: ignore[arg-type]
            (
                "dr",
                "orders",
                "federation of policy 'fed' (override 'rmq-spark-paused-1--fed' deleted)",
            )
        ]
    assert clients["dr"].names() == ["orders/fed"]


def test_a_queue_a_crashed_run_left_paused_is_still_selected_by_its_policy() -> None:
    config = parse_config(
        CONFIG.replace("source: {cluster: dr}", "source: {cluster: dr, policy_pattern: fed}"),
        {},
    )
    queues = [
        {"name": "orders.a", "policy": "rmq-spark-paused-1--fed"},
        {"name": "orders.b", "policy": "fed"},
        {"name": "orders.c", "policy": "rmq-spark-paused-1--other"},
        {"name": "orders.d"},
    ]
    chosen = matching_queues(config.routes[0], queues)
    assert [q["name"] for q in chosen] == ["orders.a", "orders.b"]
