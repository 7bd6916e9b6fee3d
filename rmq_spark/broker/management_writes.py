"""What the management client changes on a cluster: bindings, queues, exchanges,
policies and runtime parameters (driver side only; topology copy, federation and
migrate call these through `management.ManagementClient`).

Each write names what it asked in its error (`management_http.ManagementHttp`), and
refuses a name the API cannot put in a URL path rather than reach another resource.
"""

from __future__ import annotations

from typing import Any

from rmq_spark.broker.management_http import ManagementHttp, _q


class ManagementWrites(ManagementHttp):
    """The management API's writes, for one cluster."""

    def bind_queue(
        self, vhost: str, exchange: str, queue: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """Bind the queue to the exchange; binding twice is a no-op in RabbitMQ."""
        self._require_addressable(vhost, exchange, queue)
        self._request(
            "POST",
            f"/api/bindings/{_q(vhost)}/e/{_q(exchange)}/q/{_q(queue)}",
            what=f"bind queue {queue!r} to exchange {exchange!r} in vhost {vhost!r}",
            json={"routing_key": routing_key, "arguments": arguments},
        )

    def unbind_queue(self, vhost: str, exchange: str, queue: str, properties_key: str) -> None:
        """Delete one binding (named by the API's properties_key); a missing one is fine."""
        self._require_addressable(vhost, exchange, queue)
        self._request(
            "DELETE",
            f"/api/bindings/{_q(vhost)}/e/{_q(exchange)}/q/{_q(queue)}/{_q(properties_key)}",
            what=f"unbind queue {queue!r} from exchange {exchange!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def delete_queue(self, vhost: str, name: str, *, if_empty: bool = True) -> None:
        """Delete a queue; refused by the broker when `if_empty` and it holds messages.

        A queue that is already gone is fine.
        """
        self._require_addressable(vhost, name)
        self._request(
            "DELETE",
            f"/api/queues/{_q(vhost)}/{_q(name)}{'?if-empty=true' if if_empty else ''}",
            what=f"delete queue {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def put_parameter(self, component: str, vhost: str, name: str, value: dict[str, Any]) -> None:
        """Create or replace a runtime parameter.

        The value is never logged: it may hold a password (a federation upstream's URI).
        """
        self._request(
            "PUT",
            f"/api/parameters/{_q(component)}/{_q(vhost)}/{_q(name)}",
            what=f"define {component} {name!r} in vhost {vhost!r}",
            json={"component": component, "vhost": vhost, "name": name, "value": value},
        )

    def delete_parameter(self, component: str, vhost: str, name: str) -> None:
        """Delete a runtime parameter; one that is already gone is fine."""
        self._request(
            "DELETE",
            f"/api/parameters/{_q(component)}/{_q(vhost)}/{_q(name)}",
            what=f"delete {component} {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def declare_exchange(
        self,
        vhost: str,
        name: str,
        *,
        type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        self._require_addressable(vhost, name)
        self._request(
            "PUT",
            f"/api/exchanges/{_q(vhost)}/{_q(name)}",
            what=f"declare exchange {name!r} in vhost {vhost!r}",
            json={
                "type": type,
                "durable": durable,
                "auto_delete": auto_delete,
                "internal": internal,
                "arguments": arguments,
            },
        )

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
        """Create or replace a policy; the broker validates the definition (400 if not)."""
        self._request(
            "PUT",
            f"/api/policies/{_q(vhost)}/{_q(name)}",
            what=f"define policy {name!r} in vhost {vhost!r}",
            json={
                "pattern": pattern,
                "apply-to": apply_to,
                "priority": priority,
                "definition": definition,
            },
        )

    def delete_policy(self, vhost: str, name: str) -> None:
        """Delete a policy; one that is already gone is fine."""
        self._request(
            "DELETE",
            f"/api/policies/{_q(vhost)}/{_q(name)}",
            what=f"delete policy {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def declare_queue(
        self, vhost: str, name: str, *, durable: bool, arguments: dict[str, Any]
    ) -> None:
        """Declare a queue (migrate's helper queues; pre-flight declares over AMQP)."""
        self._require_addressable(vhost, name)
        self._request(
            "PUT",
            f"/api/queues/{_q(vhost)}/{_q(name)}",
            what=f"declare queue {name!r} in vhost {vhost!r}",
            json={"durable": durable, "auto_delete": False, "arguments": arguments},
        )

    # -- plumbing -------------------------------------------------------------------
