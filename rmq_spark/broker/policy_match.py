"""Which of a vhost's policies may apply to a queue, read from their definitions.

The management API's queue object names its effective policy, but from the statistics
database, which lags behind a policy set or changed a moment ago (seen on 3.10: a queue
whose TTL policy was already expiring its messages still listed none). The policies
themselves are read exactly, so a caller that must not miss a policy matches them
itself. Conservative: a policy whose pattern matches counts, even where a policy of
higher priority would win on the broker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# `apply-to` values under which a policy reaches a queue (4.x adds the per-type ones).
_QUEUE_TARGETS = ("queues", "all", "classic_queues", "quorum_queues")


def policy_applies(policy: Mapping[str, Any], queue: str) -> bool:
    """RabbitMQ matches a policy's pattern to queue names as an unanchored regex.

    >>> policy_applies({"pattern": "^orders$", "apply-to": "queues"}, "orders")
    True
    >>> policy_applies({"pattern": "orders", "apply-to": "exchanges"}, "orders")
    False
    """
    if policy.get("apply-to", "all") not in _QUEUE_TARGETS:
        return False
    try:
        return re.search(str(policy.get("pattern") or ""), queue) is not None
    except re.error:  # the broker accepted it, Python's re does not: assume it matches
        return True
