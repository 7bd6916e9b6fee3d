"""Which run a driver continues: the run id, stable across a scheduler's attempts.

A scheduler that starts a driver again after a crash (a YARN application re-attempt,
a Kubernetes Job or operator restarting the driver pod, a Databricks repair run) must
land on the same run id, or the second driver starts a new run beside the first one's
half-moved queues instead of finishing it. The precedence, first found wins:

1. ``--run-id`` on the command line (Databricks: ``{{job.run_id}}``, which a repair run
   keeps; databricks.yml passes it);
2. ``RMQ_SPARK_RUN_ID`` in the driver's environment (Kubernetes: set it from something
   the restart keeps, e.g. the Job's name, see docs/running.md);
3. YARN: the application id, read from the ``CONTAINER_ID`` the NodeManager exports to
   every container (the driver's, in cluster mode, is the ApplicationMaster's): an
   application re-attempt gets a new container and attempt number, the same application;
4. a new id: timestamp + random suffix.

Read before Spark starts (the pre-flight runs meanwhile), so from the environment only.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime

from rmq_spark.config import validate_run_id

RUN_ID_ENV = "RMQ_SPARK_RUN_ID"
YARN_CONTAINER_ENV = "CONTAINER_ID"
# container_[e<epoch>_]<cluster timestamp>_<application>_<attempt>_<container>
# (Hadoop's ContainerId.toString; the epoch part from Hadoop 2.6 on).
_YARN_CONTAINER = re.compile(r"container_(?:e\d+_)?(\d+)_(\d+)_\d+_\d+")


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def yarn_application_id(container_id: str) -> str | None:
    """application_<cluster timestamp>_<sequence> of a YARN container id, or None.

    The sequence keeps its 4-digit padding (ApplicationId.toString), so the id reads
    as in the ResourceManager's UI and `yarn application -list`.
    """
    match = _YARN_CONTAINER.fullmatch(container_id.strip())
    if match is None:
        return None
    cluster_timestamp, sequence = match.groups()
    return f"application_{cluster_timestamp}_{int(sequence):04d}"


def scheduler_run_id(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(run id, where it came from) given by the driver's scheduler, or None."""
    explicit = environ.get(RUN_ID_ENV, "").strip()
    if explicit:
        return validate_run_id(explicit), RUN_ID_ENV
    application = yarn_application_id(environ.get(YARN_CONTAINER_ENV, ""))
    if application is not None:
        return application, f"YARN {YARN_CONTAINER_ENV}"
    return None


def resolve_run_id(
    given: str | None, environ: Mapping[str, str], now: datetime | None = None
) -> tuple[str, str]:
    """(run id, its source): --run-id, else the scheduler's, else a new one.

    Raises ConfigError when the chosen id has characters a run id may not have.
    """
    if given:
        return validate_run_id(given), "--run-id"
    found = scheduler_run_id(environ)
    if found is not None:
        return found
    return new_run_id(now), "new"
