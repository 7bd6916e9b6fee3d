"""Pre-flight's rules, judged on management API rows written inline (no broker)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rmq_spark.broker.management import Permissions
from rmq_spark.config import DestinationSpec, RouteConfig, SourceSelector
from rmq_spark.errors import (
    AccessRefusedError,
    DestinationIncompatibleError,
    DiscoveryError,
    PreflightError,
)
from rmq_spark.model import QueueTransfer
from rmq_spark.planning import rules
from tests.support.builders import transfer


def route(**destination: Any) -> RouteConfig:
    return RouteConfig(
        name="r",
        source=SourceSelector(cluster="dr", queues=["orders"]),
        destination=DestinationSpec(cluster="main", **destination),
    )


def row(name: str = "orders", **fields: Any) -> dict[str, Any]:
    """A queue as the management API lists it."""
    return {"name": name, "type": "classic", "durable": True, "arguments": {}, **fields}


def moved(source: str, destination: str, *, route_name: str = "r") -> QueueTransfer:
    return replace(transfer(source, 5), destination_queue=destination, route=route_name)


def messages(problems: list[Any] | tuple[Any, ...]) -> list[str]:
    return [str(p) for p in problems]


# -- the plan as a whole ------------------------------------------------------------------


def test_a_plan_of_distinct_queues_has_no_problem() -> None:
    assert rules.check_plan([moved("a", "a"), moved("b", "b")]) == []


def test_queue_moved_onto_itself_is_a_loop() -> None:
    onto_itself = replace(transfer("a", 5), destination_cluster="dr")
    (problem,) = rules.check_plan([onto_itself])
    assert isinstance(problem, DiscoveryError)
    assert str(problem) == (
        "cluster dr vhost '/' queue 'a': route 'r' moves it onto itself; expected a "
        "destination other than the source"
    )


def test_queue_selected_by_two_routes_is_an_overlap() -> None:
    problems = rules.check_plan([moved("a", "a1", route_name="r1"), moved("a", "a2")])
    assert messages(problems) == [
        "cluster dr vhost '/' queue 'a': selected by both route 'r1' and route 'r'; "
        "expected one route per source queue"
    ]


def test_two_sources_into_one_destination_is_fan_in() -> None:
    (problem,) = rules.check_plan([moved("a", "all"), moved("b", "all")])
    assert "cluster main vhost '/' queue 'all': destination of both" in str(problem)
    assert "expected one source per destination" in str(problem)


def test_destination_that_is_also_a_source_is_a_chain() -> None:
    first = moved("a", "b")
    second = replace(moved("b", "c"), source_cluster="main")
    (problem,) = rules.check_plan([first, second])
    assert "cluster main vhost '/' queue 'b': destination of" in str(problem)
    assert "is also a source (route 'r'); its messages would move twice" in str(problem)


# -- sources ------------------------------------------------------------------------------


def test_named_queue_missing_or_exclusive_or_of_another_type_is_refused() -> None:
    selector = SourceSelector(
        cluster="dr", queues=["orders", "absent", "owned", "stream"], queue_types=["classic"]
    )
    r = RouteConfig(name="r", source=selector, destination=DestinationSpec(cluster="main"))
    listed = [row(), row("owned", exclusive=True), row("stream", type="stream")]

    chosen, problems = rules.named_queues(r, "v", listed)

    assert [q["name"] for q in chosen] == ["orders"]
    assert messages(problems) == [
        "cluster dr vhost 'v' queue 'absent': source queue not found; route 'r' "
        "source.queues names it",
        "cluster dr vhost 'v' queue 'owned': exclusive to another connection, so it cannot "
        "be consumed",
        "cluster dr vhost 'v' queue 'stream': is a stream queue; route 'r' "
        "source.queue_types allows ['classic']",
    ]


def test_queue_pattern_policy_pattern_type_and_exclusivity_filter_a_vhost() -> None:
    selector = SourceSelector(cluster="dr", queue_pattern="o.*", policy_pattern="keep")
    r = RouteConfig(name="r", source=selector, destination=DestinationSpec(cluster="main"))
    listed = [
        row("orders", policy="keep"),
        row("other", policy="drop"),
        row("x", policy="keep"),
        row("owned", policy="keep", exclusive=True),
        row("ostream", policy="keep", type="stream"),
    ]
    assert [q["name"] for q in rules.matching_queues(r, listed)] == ["orders"]


def test_missing_vhosts_name_the_cluster_the_vhost_and_the_routes() -> None:
    assert str(rules.missing_source_vhost(route(), "gone", "alice")) == (
        "cluster dr vhost 'gone': source vhost not found (it does not exist or user "
        "'alice' cannot see it); route 'r' source.vhosts names it"
    )
    problem = rules.missing_destination_vhost("main", "gone", "alice", ["r2", "r1", "r1"])
    assert isinstance(problem, DestinationIncompatibleError)
    assert "3 queue(s) of route(s) 'r1', 'r2' go there" in str(problem)


def test_queue_refusing_a_passive_declare_is_named_with_the_broker_reason() -> None:
    (problem,) = rules.refused_passive_declares(
        "main", "v", {"q": "404 NOT_FOUND - no queue 'q'"}, role="destination"
    )
    assert str(problem) == (
        "cluster main vhost 'v' queue 'q': the destination queue did not answer a passive "
        "declare (404 NOT_FOUND - no queue 'q')"
    )


# -- destinations -------------------------------------------------------------------------


def check(
    existing: dict[str, Any] | None,
    *,
    source: dict[str, Any] | None = None,
    depth: int | None = 0,
    version: str = "3.10.8",
    r: RouteConfig | None = None,
) -> rules.DestinationCheck:
    return rules.check_destination(
        transfer("orders", 5),
        r or route(),
        source or row(),
        existing,
        destination_depth=depth,
        destination_version=version,
    )


def test_fitting_destination_has_no_problem_and_is_not_created() -> None:
    result = check(row())
    assert result.problems == ()
    assert not result.create


@pytest.mark.parametrize(
    ("source", "existing", "expected"),
    [
        (row(), row(type="quorum"), "is a quorum queue, expected classic"),
        (
            row(arguments={"x-max-priority": 5}),
            row(),
            "expected x-max-priority >= 5 like the source, found none",
        ),
        (
            row(arguments={"x-max-priority": 5}),
            row(arguments={"x-max-priority": 3}),
            "expected x-max-priority >= 5 like the source, found 3",
        ),
        (row(), row(durable=False), "is not durable but the source is"),
        (row(), row(exclusive=True), "exclusive to another connection"),
        (
            row(),
            row(arguments={"x-max-length": 3, "x-overflow": "reject-publish"}),
            "holds at most 3 messages (max-length, overflow reject-publish) and has 0; "
            "expected room for the source's 5 (the rest would be refused and stay in the "
            "source)",
        ),
        (
            row(),
            row(effective_policy_definition={"max-length": 4}),
            "(max-length, overflow drop-head) and has 0; expected room for the source's 5 "
            "(the oldest would be dropped and lost)",
        ),
        (
            row(),
            row(arguments={"x-max-length-bytes": 100}),
            "holds at most 100 bytes (max-length-bytes, overflow drop-head)",
        ),
    ],
    ids=[
        "type",
        "no priorities",
        "fewer priorities",
        "transient",
        "exclusive",
        "max-length",
        "policy max-length",
        "max-length-bytes",
    ],
)
def test_existing_destination_that_does_not_fit_its_source_is_refused(
    source: dict[str, Any], existing: dict[str, Any], expected: str
) -> None:
    (problem,) = check(existing, source=source).problems
    assert isinstance(problem, DestinationIncompatibleError)
    assert str(problem).startswith("cluster main vhost '/' queue 'orders': ")
    assert expected in str(problem)


def test_length_limit_counts_the_exact_depth_over_the_sampled_one() -> None:
    limited = row(arguments={"x-max-length": 10}, messages_ready=0)
    assert check(limited, depth=4).problems == ()
    (problem,) = check(limited, depth=6).problems
    assert "holds at most 10 messages (max-length, overflow drop-head) and has 6" in str(problem)


def test_priorities_may_be_dropped_when_the_route_says_so() -> None:
    r = route(priorities="drop")
    assert check(row(), source=row(arguments={"x-max-priority": 5}), r=r).problems == ()


def test_missing_destination_is_created_with_the_inherited_arguments_translated() -> None:
    source = row(arguments={"x-max-priority": 5, "x-queue-mode": "lazy", "x-expires": 1000})
    result = check(None, source=source, version="4.3.6")
    assert result.problems == ()
    assert result.create
    # x-expires is not inherited without topology: copy; 4.3 ignores x-queue-mode.
    assert result.arguments == {"x-max-priority": 5, "x-queue-type": "classic"}
    assert ("x-queue-mode", "dropped") in {(d.key, d.action) for d in result.decisions}


def test_missing_destination_with_topology_copy_inherits_every_argument() -> None:
    source = row(arguments={"x-expires": 1000})
    result = check(None, source=source, r=route(topology="copy"))
    assert result.arguments == {"x-expires": 1000, "x-queue-type": "classic"}


def test_missing_destination_without_create_missing_is_refused() -> None:
    (problem,) = check(None, r=route(create_missing=False)).problems
    assert str(problem) == (
        "cluster main vhost '/' queue 'orders': missing, and create_missing is false for route 'r'"
    )


def test_missing_destination_whose_arguments_the_type_refuses_is_not_created() -> None:
    source = row(arguments={"x-max-priority": 5})
    result = check(None, source=source, r=route(queue_type="quorum"))
    assert not result.create
    (problem,) = result.problems
    assert "cannot be created as a quorum queue (destination.queue_type)" in str(problem)
    assert "argument x-max-priority=5" in str(problem)


@pytest.mark.parametrize(
    ("arguments", "source_durable", "durable"),
    [({"x-queue-type": "quorum"}, False, True), ({}, False, False), ({}, True, True)],
)
def test_created_destination_is_durable_like_its_source_or_quorum(
    arguments: dict[str, Any], source_durable: bool, durable: bool
) -> None:
    assert rules.destination_durable(arguments, row(durable=source_durable)) is durable


# -- permissions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "name", "allowed"),
    [
        (".*", "orders", True),
        ("", "orders", False),  # '' permits nothing
        ("^ord", "orders", True),
        ("ers", "orders", True),  # unanchored, like RabbitMQ's
        ("^x", "orders", False),
        ("^\\.$", ".", True),
        ("(?<!", "orders", True),  # not Python syntax: the broker decides
    ],
)
def test_permission_regex_matches_like_rabbitmq(pattern: str, name: str, allowed: bool) -> None:
    assert rules.allows(pattern, name) is allowed


def test_read_permission_must_match_each_source_queue() -> None:
    permissions = Permissions(configure=".*", write=".*", read="^orders$")
    problems = rules.read_problems("dr", "v", "alice", permissions, ["orders", "audit", "audit"])
    assert messages(problems) == [
        "cluster dr vhost 'v' queue 'audit': user 'alice' may not consume it; expected a read "
        "permission matching it, found '^orders$'"
    ]
    assert all(isinstance(p, AccessRefusedError) for p in problems)


def test_write_on_the_default_exchange_and_configure_for_created_queues() -> None:
    permissions = Permissions(configure="^made$", write="^audit", read=".*")
    problems = rules.write_problems(
        "main", "v", "alice", permissions, [("orders", True), ("made", True), ("kept", False)]
    )
    assert messages(problems) == [
        "cluster main vhost 'v': user 'alice' may not publish to queue(s) 'kept', 'made', "
        "'orders'; expected a write permission matching 'amq.default', found '^audit'",
        "cluster main vhost 'v' queue 'orders': missing, and user 'alice' may not declare "
        "it; expected a configure permission matching it, found '^made$'",
    ]


def test_full_permissions_give_no_problem() -> None:
    everything = Permissions(configure=".*", write=".*", read=".*")
    assert rules.read_problems("dr", "v", "u", everything, ["a"]) == []
    assert rules.write_problems("main", "v", "u", everything, [("a", True)]) == []


# -- one error ----------------------------------------------------------------------------


def test_no_problem_is_no_error() -> None:
    assert rules.one_error([]) is None


def test_problems_of_one_kind_are_one_error_of_that_kind_one_line_each() -> None:
    first = DestinationIncompatibleError("cluster main vhost 'v' queue 'a': is a quorum queue")
    second = DestinationIncompatibleError("cluster main vhost 'v' queue 'b': missing")
    error = rules.one_error([first, second])
    assert type(error) is DestinationIncompatibleError
    assert str(error) == (
        "pre-flight found 2 problems; nothing was moved:\n"
        "  cluster main vhost 'v' queue 'a': is a quorum queue\n"
        "  cluster main vhost 'v' queue 'b': missing"
    )
    assert error.problems == (first, second)


def test_problems_of_several_kinds_are_one_preflight_error() -> None:
    error = rules.one_error([DiscoveryError("x"), AccessRefusedError("y")])
    assert type(error) is PreflightError
    assert str(error) == "pre-flight found 2 problems; nothing was moved:\n  x\n  y"
