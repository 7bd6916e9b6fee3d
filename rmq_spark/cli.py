"""`rmq-spark` command line: parse arguments, load config, call one stage function.

Exit codes, for schedulers: 0 verified, 1 verification failed, 2 the job could not
run (bad arguments or config, broker unreachable, refused pre-flight...; the error
line names what is wrong), 3 an internal error (a bug, or a failure of Spark or a
library the job did not expect: the traceback is in the log, one line names it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rmq_spark import __version__
from rmq_spark.compat import check_pika
from rmq_spark.config import JobConfig, json_schema, load_config, validate_run_id
from rmq_spark.demo_command import add_demo_arguments, run_demo_command
from rmq_spark.errors import RmqSparkError
from rmq_spark.logs import mask_known_secrets, mask_secrets_in_logs, setup_logging
from rmq_spark.park.command import add_park_arguments, run_park_command
from rmq_spark.park.replay.command import add_replay_arguments, run_replay_command
from rmq_spark.redrive.command import add_redrive_arguments, run_redrive_command
from rmq_spark.run_id import resolve_run_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rmq_spark.pipeline import PreparedRun

log = logging.getLogger("rmq_spark")

EXIT_VERIFIED, EXIT_UNVERIFIED, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 3
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
# All cores, and up to 4 attempts per task (a retried mover task resumes its queue).
LOCAL_MASTER = "local[*,4]"


def add_logging_arguments(parser: argparse.ArgumentParser, default_level: str) -> None:
    parser.add_argument("--log-level", default=default_level, type=str.upper, choices=LOG_LEVELS)
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="json: one JSON object per log line, for log collectors",
    )


def print_error(exc: RmqSparkError, config: JobConfig | None = None) -> None:
    """The one error line (more lines, indented, when it lists several problems).

    Messages are built from names only; masking the configured passwords here is
    defence in depth, like SecretMaskingFilter for log lines.
    """
    message = str(exc)
    if config is not None:
        for cluster in config.clusters.values():
            secret = cluster.password.get_secret_value()
            if secret and secret != cluster.username:  # guest/guest is no secret
                message = message.replace(secret, "***")
    print(f"rmq-spark: error: {message}", file=sys.stderr, flush=True)


def run_guarded(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run one command; an exception it did not expect becomes exit 3.

    The traceback goes to the log (stderr, masked like every log line); one line names
    the error, so a scheduler's summary shows it. Commands turn the errors a user can
    act on (RmqSparkError) into exit 2 themselves; one that escapes is still exit 2.
    """
    try:
        return command(args)
    except RmqSparkError as exc:
        print_error(exc)
        return EXIT_ERROR
    except Exception as exc:
        log.critical("internal error in rmq-spark %s", args.command, exc_info=True)
        lines = str(exc).strip().splitlines()
        summary = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        summary = mask_known_secrets(summary)
        print(
            f"rmq-spark: internal error (exit {EXIT_INTERNAL}): {summary}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERNAL


SPARK_EXTRA = "pip install 'rmq-spark[spark]'"


def require_spark(command: str) -> None:
    """Exit-2 error, before anything runs, when this Python has no pyspark.

    `plan`, `report` and `restore-federation` need no Spark and run from the wheel
    alone; `transfer` and `migrate` run on Spark: on a cluster its own pyspark, on a
    laptop the `[spark]` extra.
    """
    if importlib.util.find_spec("pyspark") is None:
        raise RmqSparkError(
            f"rmq-spark {command} runs on Spark and this Python has no pyspark: run it "
            f"with spark-submit or on Databricks, or install the extra: {SPARK_EXTRA}"
        )


def default_master() -> str | None:
    """local[*,4] unless spark-submit or Databricks already chose a master, or the user
    set one where spark-submit would read it (`spark_session.configured_master`:
    PYSPARK_SUBMIT_ARGS, spark-defaults.conf, MASTER).

    The ",4" lets a failed task run again: local mode ignores spark.task.maxFailures.
    """
    from rmq_spark.spark_session import configured_master

    launched = "PYSPARK_GATEWAY_PORT" in os.environ or "DATABRICKS_RUNTIME_VERSION" in os.environ
    return None if launched else (configured_master() or LOCAL_MASTER)


@contextmanager
def command_session(
    app_name: str, master: str | None, remote: str | None = None
) -> Iterator[SparkSession]:
    """A command's SparkSession, stopped on the way out unless one was already active:
    a notebook's or Databricks' session is theirs to stop, not ours.

    `remote` (--remote, else SPARK_REMOTE): a Spark Connect server, sc://host:port.
    """
    from pyspark.sql import SparkSession

    from rmq_spark.spark_session import build_session

    # On Databricks the runtime owns the session (its driver may not show it as this
    # process's active one yet): stopping it would break the cluster's other work.
    ours = (
        SparkSession.getActiveSession() is None and "DATABRICKS_RUNTIME_VERSION" not in os.environ
    )
    remote = remote or os.environ.get("SPARK_REMOTE") or None
    if remote:
        spark = build_session(app_name, remote=remote)
    else:
        spark = build_session(app_name, master=master or default_master())
    try:
        yield spark
    finally:
        if ours:
            spark.stop()


# -- transfer ------------------------------------------------------------------------


def add_transfer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (see conf/example.yaml)")
    parser.add_argument(
        "--run-id",
        help="run identifier (default: $RMQ_SPARK_RUN_ID, else the YARN application id, "
        "else timestamp + random suffix): a driver started again with the same id resumes",
    )
    parser.add_argument("--master", help="Spark master when not launched by spark-submit")
    parser.add_argument(
        "--remote",
        help="Spark Connect server, sc://host:port (default: $SPARK_REMOTE); replaces --master",
    )
    add_logging_arguments(parser, "INFO")


def transfer_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of jobs/transfer.py and `rmq-spark transfer`."""
    parser = argparse.ArgumentParser(prog="rmq-spark transfer", description=__doc__)
    add_transfer_arguments(parser)
    args = parser.parse_args(argv)
    args.command = "transfer"
    return run_guarded(run_transfer_command, args)


def run_transfer_command(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    try:
        require_spark("transfer")
        check_pika()
        config = load_config(args.config)
        mask_secrets_in_logs(config)
        config.require_moves()
        run_id, source = resolve_run_id(args.run_id, os.environ)
    except RmqSparkError as exc:
        print_error(exc)
        return EXIT_ERROR
    log.info("run %s (run id from %s)", run_id, source)

    # Spark takes seconds to start, most of them in its JVM, while this thread waits on
    # it. The pipeline's imports, the pre-flight (ledger, discovery, plan: mostly
    # waiting for the brokers) and then verification's imports need no Spark: they run
    # on another thread meanwhile (`prepare_and_preload`), so the driver's own Python
    # work overlaps the JVM's instead of coming before it.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmq-spark-preflight") as pool:
        preflight = pool.submit(prepare_and_preload, config, run_id)
        with command_session(f"rmq-spark transfer {run_id}", args.master, args.remote) as spark:
            from rmq_spark.pipeline import run_transfer

            try:
                # Still running: the executors are probed meanwhile (pipeline.probe_beside).
                result = run_transfer(spark, config, run_id=run_id, prepared=preflight)
            except RmqSparkError as exc:
                print_error(exc, config)
                return EXIT_ERROR
            # The run's report (its imports, matplotlib's ~0.4 s, and its figures: the
            # driver's Python) is built while Spark stops (the JVM's work).
            reports = pool.submit(build_run_reports, config.ledger.path, run_id)
    from rmq_spark.report.console import print_queue_table, result_line, result_summary
    from rmq_spark.report.html import print_report_paths

    print_queue_table(result)
    summary = result_summary(result, config.ledger.path)
    for report in print_report_paths(reports.result()):
        summary["report"] = str(report)
    print(result_line(summary), flush=True)
    return EXIT_VERIFIED if result.verification.verified else EXIT_UNVERIFIED


def build_run_reports(ledger_path: str, run_id: str) -> list[Path]:
    from rmq_spark.report.html import build_reports

    return build_reports(ledger_path, [run_id])


def prepare_and_preload(config: JobConfig, run_id: str) -> PreparedRun:
    """`pipeline.prepare_run` (importing the pipeline first), then Great Expectations'
    import started: the pre-flight's imports and its errors come before verification's
    seconds of imports (~2 CPU-s), which the move leaves time for."""
    from rmq_spark.pipeline import prepare_run
    from rmq_spark.verify import preload_great_expectations

    prepared = prepare_run(config, run_id)
    preload_great_expectations()
    return prepared


# -- plan (dry run) ------------------------------------------------------------------


def plan_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of jobs/plan.py and `rmq-spark plan`."""
    parser = argparse.ArgumentParser(prog="rmq-spark plan", description=run_plan_command.__doc__)
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    args.command = "plan"
    return run_guarded(run_plan_command, args)


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (see conf/example.yaml)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_logging_arguments(parser, "WARNING")


def run_plan_command(args: argparse.Namespace) -> int:
    """Discovery and pre-flight only: print what a transfer would do; move nothing.

    Exit 0 with the plan, or 2 with the pre-flight problems.
    """
    setup_logging(args.log_level, args.log_format)
    from rmq_spark.broker.federation import pause_preview
    from rmq_spark.broker.management import management_clients
    from rmq_spark.planning.discovery import discover
    from rmq_spark.planning.partitions import assign_partitions
    from rmq_spark.report.console import plan_document, print_plan_table

    config: JobConfig | None = None
    try:
        config = load_config(args.config)
        mask_secrets_in_logs(config)
        config.require_moves()
        with management_clients(config) as clients:
            transfers = discover(config, clients, dry_run=True)
            paused = pause_preview(config, clients, transfers)
    except RmqSparkError as exc:
        if args.json:
            problems = list(getattr(exc, "problems", None) or [str(exc)])
            print(json.dumps({"problems": [str(p) for p in problems]}, indent=2))
        print_error(exc, config)
        return EXIT_ERROR
    assignment = assign_partitions(transfers, config.max_active, config.mover.queues_per_task)
    document = plan_document(config, transfers, assignment, paused)
    if args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        print_plan_table(document)
    return EXIT_VERIFIED


# -- restore-federation --------------------------------------------------------------


def add_restore_federation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (see conf/example.yaml)")
    add_logging_arguments(parser, "WARNING")


def run_restore_federation_command(args: argparse.Namespace) -> int:
    """Undo every federation pause a transfer or a park left on the source clusters.

    For after a crash that left queues paused (federation: pause); idempotent. Prints
    each restored policy (and upstream an earlier build cloned); exit 0, or 2 when a
    cluster could not be restored, or a mover still consumes there (its queues' links
    would pull into the queues it drains).
    """
    setup_logging(args.log_level, args.log_format)
    from rmq_spark.broker.federation import restore_federation, source_clusters
    from rmq_spark.broker.management import management_clients

    config: JobConfig | None = None
    try:
        config = load_config(args.config)
        mask_secrets_in_logs(config)
        with management_clients(config) as clients:
            restored = restore_federation(config, clients, unless_consuming=True)
    except RmqSparkError as exc:
        print_error(exc, config)
        return EXIT_ERROR
    for cluster, vhost, what in restored:
        print(f"restored cluster {cluster} vhost {vhost!r} {what}")
    if not restored:
        clusters = ", ".join(source_clusters(config))
        print(f"nothing to restore: no paused federation on cluster(s) {clusters}")
    return EXIT_VERIFIED


# -- migrate -------------------------------------------------------------------------


def migrate_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of jobs/migrate.py and `rmq-spark migrate`."""
    parser = argparse.ArgumentParser(
        prog="rmq-spark migrate", description=run_migrate_command.__doc__
    )
    add_migrate_arguments(parser)
    args = parser.parse_args(argv)
    args.command = "migrate"
    return run_guarded(run_migrate_command, args)


def add_migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        required=True,
        help="YAML config; its routes' sources select the classic queues of one cluster",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="pre-flight only: print what would happen"
    )
    parser.add_argument("--json", action="store_true", help="dry run: print the plan as JSON")
    parser.add_argument(
        "--migration-id", help="id of the migration (default: timestamp + random suffix)"
    )
    parser.add_argument(
        "--consumers",
        choices=("refuse", "wait"),
        default="refuse",
        help="a queue with consumers: refuse it (default) or wait for them to go",
    )
    parser.add_argument("--consumer-wait-seconds", type=float, default=300.0)
    parser.add_argument(
        "--drop-priorities",
        action="store_true",
        help="migrate queues with x-max-priority (quorum queues have no priorities)",
    )
    parser.add_argument("--replicas", type=int, help="x-quorum-initial-group-size of new queues")
    parser.add_argument("--master", help="Spark master when not launched by spark-submit")
    parser.add_argument(
        "--remote",
        help="Spark Connect server, sc://host:port (default: $SPARK_REMOTE); replaces --master",
    )
    add_logging_arguments(parser, "INFO")


def run_migrate_command(args: argparse.Namespace) -> int:
    """Migrate classic queues to quorum queues of the same name, in place, verified.

    Exit 0 migrated and verified, 1 verification failed, 2 the migration could not run
    or pre-flight refused (each problem on its own line). A re-run with the same
    config finishes a migration a crash interrupted.
    """
    setup_logging(args.log_level, args.log_format)
    require_spark("migrate")  # its modules import pyspark, --dry-run's too
    from rmq_spark.migrate import (
        MigrationOptions,
        migrate,
        migration_cluster,
        new_migration_id,
        plan_migration,
        raise_problems,
    )
    from rmq_spark.report.console import (
        migration_line,
        migration_summary,
        print_migrated_queues,
        print_migration_plan,
    )

    config: JobConfig | None = None
    options = MigrationOptions(
        consumers=args.consumers,
        consumer_wait_seconds=args.consumer_wait_seconds,
        priorities="drop" if args.drop_priorities else "refuse",
        replicas=args.replicas,
    )
    try:
        check_pika()
        config = load_config(args.config)
        mask_secrets_in_logs(config)
        config.require_moves()
        cluster = migration_cluster(config)
        migration_id = validate_run_id(args.migration_id or new_migration_id())
        if args.dry_run:
            from rmq_spark.broker.management import management_clients

            with management_clients(config) as clients:
                plans = plan_migration(config, clients[cluster], options, migration_id)
            document = [plan.as_dict() for plan in plans]
            if args.json:
                print(json.dumps(document, indent=2, sort_keys=True, default=str))
            else:
                print_migration_plan(document, cluster)
            raise_problems(plans)
            return EXIT_VERIFIED
    except RmqSparkError as exc:
        print_error(exc, config)
        return EXIT_ERROR

    with command_session(f"rmq-spark migrate {migration_id}", args.master, args.remote) as spark:
        try:
            result = migrate(spark, config, options=options, migration_id=migration_id)
        except RmqSparkError as exc:
            print_error(exc, config)
            return EXIT_ERROR
    print_migrated_queues(result)
    summary = migration_summary(result)
    from rmq_spark.report.html import write_reports

    reports = write_reports(config.ledger.path, [r.run_id for r in result.runs])
    summary["reports"] = [str(path) for path in reports]
    print(migration_line(summary), flush=True)
    return EXIT_VERIFIED if result.verified else EXIT_UNVERIFIED


# -- report --------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN_ID", help="the run to report on (runs.run_id)")
    ledger = parser.add_mutually_exclusive_group(required=True)
    ledger.add_argument("--ledger", help="the ledger directory (a config's ledger.path)")
    ledger.add_argument(
        "--config", help="the job's YAML config; only ledger.path is used, no password needed"
    )
    parser.add_argument(
        "--out", help="where to write the report (default: <ledger>/reports/run_id=RUN/report.html)"
    )
    add_logging_arguments(parser, "WARNING")


def run_report_command(args: argparse.Namespace) -> int:
    """Write one run's self-contained HTML report from the ledger and print its path.

    Reads the Delta tables with delta-rs: no Spark, no broker, no password. Exit 0 with
    the path (whatever the run's verdict, which the report shows), or 2 with the error.
    """
    setup_logging(args.log_level, args.log_format)

    from rmq_spark.report.html import build_report
    from rmq_spark.report.ledger_config import ledger_path_of

    try:
        ledger_path = args.ledger or ledger_path_of(args.config)
        path = build_report(
            ledger_path, validate_run_id(args.run_id), Path(args.out) if args.out else None
        )
    except RmqSparkError as exc:
        print_error(exc)
        return EXIT_ERROR
    print(path, flush=True)
    return EXIT_VERIFIED


# -- main ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """`rmq-spark` and its commands (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="rmq-spark", description="Move RabbitMQ messages, verifiably."
    )
    parser.add_argument("--version", action="version", version=f"rmq-spark {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_transfer_arguments(commands.add_parser("transfer", help="run the transfer job in-process"))
    add_plan_arguments(
        commands.add_parser("plan", help="discovery and pre-flight only; moves nothing")
    )
    add_restore_federation_arguments(
        commands.add_parser(
            "restore-federation",
            help="undo the federation pause a crashed transfer or park left",
        )
    )
    add_report_arguments(
        commands.add_parser("report", help="write a run's HTML report from the ledger")
    )
    add_migrate_arguments(
        commands.add_parser(
            "migrate", help="migrate classic queues to quorum queues in place, verified"
        )
    )
    add_redrive_arguments(
        commands.add_parser("redrive", help="dead-lettered messages back to where they died")
    )
    add_park_arguments(
        commands.add_parser("park", help="a queue's messages into the ledger's parked table")
    )
    add_replay_arguments(
        commands.add_parser("replay", help="a parked run's rows back into queues, byte-exact")
    )
    add_demo_arguments(
        commands.add_parser("demo", help="local brokers + demo data + spark-submit + verification")
    )
    commands.add_parser("config-schema", help="print the config file's JSON Schema")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands_by_name: dict[str, Callable[[argparse.Namespace], int]] = {
        "transfer": run_transfer_command,
        "plan": run_plan_command,
        "restore-federation": run_restore_federation_command,
        "report": run_report_command,
        "migrate": run_migrate_command,
        "redrive": partial(run_redrive_command, session=redrive_session),
        "park": partial(run_park_command, session=park_session),
        "replay": partial(run_replay_command, session=replay_session),
        "demo": run_demo_command,
        "config-schema": run_config_schema_command,
    }
    return run_guarded(commands_by_name[args.command], args)


def redrive_session(app_name: str) -> AbstractContextManager[SparkSession]:
    """A moving redrive's Spark session: as `transfer`'s, on the master spark-submit,
    Databricks or the environment chose (else local)."""
    require_spark("redrive")
    return command_session(app_name, None)


def park_session(app_name: str) -> AbstractContextManager[SparkSession]:
    """A park's Spark session, chosen as `transfer`'s."""
    require_spark("park")
    return command_session(app_name, None)


def replay_session(app_name: str) -> AbstractContextManager[SparkSession]:
    """A replay's Spark session (for --where only), chosen as `transfer`'s."""
    require_spark("replay")
    return command_session(app_name, None)


def run_config_schema_command(args: argparse.Namespace) -> int:
    """Print the config file's JSON Schema (docs/reference/config.schema.json is a copy)."""
    print(json.dumps(json_schema(), indent=2))
    return EXIT_VERIFIED


def script_main() -> None:
    """Console-script and Databricks python_wheel_task entry point: exits with the code.

    A python_wheel_task ignores a return value; only the process's exit status (or an
    exception) tells the job run that it failed.
    """
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
