"""spark-submit.sh tells the job whether a terminal shows its output (no Spark: a stub
spark-submit records what it was given)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from rmq_spark.progress import TERMINAL_ENV
from tests.support.spark_submit import (
    ENVIRONMENT_PYTHON,
    REPO,
    SCRIPT,
    args_spark_home,
    confs,
    submitted,
)

__all__ = ["args_spark_home"]  # the stub spark-submit fixture, shared


@pytest.fixture
def stub_spark_home(tmp_path: Path) -> Path:
    """A SPARK_HOME whose bin/spark-submit writes the two variables to $STUB_OUT."""
    bin_dir = tmp_path / "spark" / "bin"
    bin_dir.mkdir(parents=True)
    stub = bin_dir / "spark-submit"
    stub.write_text(
        "#!/bin/sh\n"
        f'printf "%s %s" "${{{TERMINAL_ENV}-unset}}" "${{COLUMNS-unset}}" > "$STUB_OUT"\n'
    )
    stub.chmod(0o755)
    return tmp_path / "spark"


def submit(spark_home: Path, tmp_path: Path, stdout: int, **env: str) -> str:
    """Run spark-submit.sh with `stdout`; what the stub saw: '<terminal flag> <columns>'."""
    out = tmp_path / "seen.txt"
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in (TERMINAL_ENV, "COLUMNS", "SPARK_HOME")
    }
    subprocess.run(
        [str(SCRIPT), "--config", "conf/demo.yaml"],
        env={**environ, "SPARK_HOME": str(spark_home), "STUB_OUT": str(out), **env},
        stdout=stdout,
        stderr=subprocess.PIPE,
        check=True,
        timeout=60,
    )
    return out.read_text()


def test_a_terminal_on_stdout_is_announced_with_its_width(
    stub_spark_home: Path, tmp_path: Path
) -> None:
    leader, follower = os.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 97, 0, 0))
        assert submit(stub_spark_home, tmp_path, follower) == "1 97"
    finally:
        os.close(follower)
        os.close(leader)


def test_a_pipe_on_stdout_means_log_lines(stub_spark_home: Path, tmp_path: Path) -> None:
    # stderr is a pipe too here; what counts is stdout, where the driver's output lands.
    assert submit(stub_spark_home, tmp_path, subprocess.PIPE) == "0 unset"


def test_the_users_choice_stands(stub_spark_home: Path, tmp_path: Path) -> None:
    seen = submit(stub_spark_home, tmp_path, subprocess.PIPE, **{TERMINAL_ENV: "1"})
    assert seen == "1 unset"


# -- class data sharing (local runs only) ---------------------------------------------

# Records the driver's Java options, writes an archive where the JVM would at exit
# (-XX:ArchiveClassesAtExit), and exits with $STUB_EXIT.
CDS_STUB = r"""#!/bin/sh
opts=""
for arg in "$@"; do
  case "$arg" in spark.driver.extraJavaOptions=*) opts="${arg#*=}" ;; esac
done
printf '%s' "$opts" > "$STUB_OUT"
case "$opts" in
  *ArchiveClassesAtExit=*)
    archive="${opts#*ArchiveClassesAtExit=}"
    printf 'classes' > "${archive%% *}"
    ;;
esac
exit "${STUB_EXIT:-0}"
"""


@pytest.fixture
def cds_spark_home(tmp_path: Path) -> Path:
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    (home / "jars").mkdir()
    stub = home / "bin" / "spark-submit"
    stub.write_text(CDS_STUB)
    stub.chmod(0o755)
    return home


def driver_options(
    spark_home: Path,
    tmp_path: Path,
    *spark_args: str,
    expect_status: int = 0,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run spark-submit.sh; the driver Java options the stub was given."""
    out = tmp_path / "options.txt"
    environ = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    completed = subprocess.run(
        [str(SCRIPT), *spark_args, "--config", "conf/demo.yaml"],
        env={
            **environ,
            "SPARK_HOME": str(spark_home),
            "STUB_OUT": str(out),
            "RMQ_SPARK_CDS_DIR": str(tmp_path / "cds"),
            **(env or {}),
        },
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == expect_status, completed.stderr
    assert completed.stderr == b""
    return out.read_text()


def test_the_first_local_run_writes_the_archive_and_later_runs_map_it(
    cds_spark_home: Path, tmp_path: Path
) -> None:
    first = driver_options(cds_spark_home, tmp_path)
    archives = list((tmp_path / "cds").iterdir())
    assert "-XX:ArchiveClassesAtExit=" in first
    assert [a.suffix for a in archives] == [".jsa"]  # renamed from its .tmp name

    second = driver_options(cds_spark_home, tmp_path)
    assert f"-XX:SharedArchiveFile={archives[0]}" in second
    assert "ArchiveClassesAtExit" not in second
    assert list((tmp_path / "cds").iterdir()) == archives


def test_other_spark_options_make_another_archive(cds_spark_home: Path, tmp_path: Path) -> None:
    driver_options(cds_spark_home, tmp_path)
    options = driver_options(cds_spark_home, tmp_path, "--driver-memory", "2g")
    assert "-XX:ArchiveClassesAtExit=" in options
    assert len(list((tmp_path / "cds").iterdir())) == 2


def test_the_exit_status_is_the_jobs_and_only_whole_archives_stay(
    cds_spark_home: Path, tmp_path: Path
) -> None:
    # A job that fails (verification: exit 1) still leaves a whole archive.
    driver_options(cds_spark_home, tmp_path, expect_status=3, env={"STUB_EXIT": "3"})
    assert [a.suffix for a in (tmp_path / "cds").iterdir()] == [".jsa"]
    # A JVM that dies before writing anything leaves nothing behind.
    (cds_spark_home / "bin" / "spark-submit").write_text("#!/bin/sh\nexit 4\n")
    for archive in (tmp_path / "cds").iterdir():
        archive.unlink()
    completed = subprocess.run(
        [str(SCRIPT), "--config", "conf/demo.yaml"],
        env={
            **os.environ,
            "SPARK_HOME": str(cds_spark_home),
            "RMQ_SPARK_CDS_DIR": str(tmp_path / "cds"),
        },
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 4
    assert list((tmp_path / "cds").iterdir()) == []


@pytest.mark.parametrize(
    ("spark_args", "env"),
    [(("--master", "yarn"), {}), ((), {"RMQ_SPARK_CDS": "0"})],
    ids=["a cluster master", "turned off"],
)
def test_no_class_data_sharing_on_a_cluster_or_when_turned_off(
    cds_spark_home: Path, tmp_path: Path, spark_args: tuple[str, ...], env: dict[str, str]
) -> None:
    options = driver_options(cds_spark_home, tmp_path, *spark_args, env=env)
    assert "SharedArchiveFile" not in options
    assert "ArchiveClassesAtExit" not in options
    assert not (tmp_path / "cds").exists() or not list((tmp_path / "cds").iterdir())


def test_a_new_archive_clears_out_archives_unused_for_a_month(
    cds_spark_home: Path, tmp_path: Path
) -> None:
    cds = tmp_path / "cds"
    cds.mkdir()
    stale, recent, other = cds / "spark-driver-1.jsa", cds / "spark-driver-2.jsa", cds / "notes"
    for path in (stale, recent, other):
        path.write_text("x")
    month_and_more = time.time() - 31 * 24 * 3600
    os.utime(stale, (month_and_more, month_and_more))
    os.utime(other, (month_and_more, month_and_more))

    driver_options(cds_spark_home, tmp_path)

    left = sorted(p.name for p in cds.iterdir())
    assert stale.name not in left
    assert {recent.name, other.name} <= set(left)
    assert len(left) == 3  # recent, other, and the one just written


def test_using_an_archive_marks_it_as_used(cds_spark_home: Path, tmp_path: Path) -> None:
    driver_options(cds_spark_home, tmp_path)
    (archive,) = (tmp_path / "cds").iterdir()
    long_ago = time.time() - 40 * 24 * 3600
    os.utime(archive, (long_ago, long_ago))

    assert "SharedArchiveFile" in driver_options(cds_spark_home, tmp_path)
    assert archive.stat().st_mtime > time.time() - 3600


# -- which Python the driver and the executors run ---------------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "dist" / "rmq-spark-env-0.1.0-cp311-linux_x86_64.tar.gz"
    path.parent.mkdir()
    path.write_bytes(b"not really a tarball")
    return path


def test_yarn_without_an_archive_exports_no_python_of_this_machine(
    args_spark_home: Path, tmp_path: Path
) -> None:
    args, env = submitted(args_spark_home, tmp_path, "--master", "yarn")

    assert env["PYSPARK_PYTHON"] == "unset"
    assert "spark.pyspark.python" not in confs(args)
    assert "spark.executorEnv.PYSPARK_PYTHON" not in confs(args)
    assert "--archives" not in args
    # The driver is here in client mode: its Python may be this machine's.
    assert env["PYSPARK_DRIVER_PYTHON"] in (str(REPO / ".venv" / "bin" / "python"), "python3")
    assert args[-5:] == [str(REPO / "jobs" / "transfer.py"), "--config", "conf/prod.yaml",
                         "--run-id", "r1"]  # fmt: skip


def test_yarn_with_the_archive_ships_it_and_points_the_executors_into_it(
    args_spark_home: Path, tmp_path: Path, archive: Path
) -> None:
    args, env = submitted(
        args_spark_home, tmp_path, "--master", "yarn", "--env-archive", str(archive)
    )

    assert args[args.index("--archives") + 1] == f"{archive}#environment"
    settings = confs(args)
    assert settings["spark.pyspark.python"] == ENVIRONMENT_PYTHON
    assert settings["spark.executorEnv.PYSPARK_PYTHON"] == ENVIRONMENT_PYTHON
    assert env["PYSPARK_PYTHON"] == "unset"
    # client mode: the driver runs here, with this checkout's Python, named explicitly
    # (spark-submit would otherwise give the driver spark.pyspark.python too).
    assert settings["spark.pyspark.driver.python"] == env["PYSPARK_DRIVER_PYTHON"]
    assert not settings["spark.pyspark.driver.python"].startswith("./")
    assert "--env-archive" not in args


def test_cluster_deploy_mode_runs_the_driver_from_the_archive_too(
    args_spark_home: Path, tmp_path: Path, archive: Path
) -> None:
    args, env = submitted(
        args_spark_home,
        tmp_path,
        "--master=yarn",
        "--deploy-mode",
        "cluster",
        "--archives",
        "extra.zip#extra",
        f"--env-archive={archive}",
    )

    settings = confs(args)
    assert settings["spark.pyspark.python"] == ENVIRONMENT_PYTHON
    assert settings["spark.pyspark.driver.python"] == ENVIRONMENT_PYTHON
    assert settings["spark.yarn.appMasterEnv.PYSPARK_PYTHON"] == ENVIRONMENT_PYTHON
    assert env == {"PYSPARK_PYTHON": "unset", "PYSPARK_DRIVER_PYTHON": "unset"}
    # One --archives with the user's archive and ours (a second would replace the first).
    assert args.count("--archives") == 1
    assert args[args.index("--archives") + 1] == f"extra.zip#extra,{archive}#environment"
    assert args[args.index("--deploy-mode") + 1] == "cluster"


def test_a_local_run_uses_this_checkouts_python(args_spark_home: Path, tmp_path: Path) -> None:
    args, env = submitted(args_spark_home, tmp_path)

    assert args[args.index("--master") + 1] == "local[*,4]"
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"]
    assert "spark.pyspark.python" not in confs(args)


@pytest.mark.parametrize(
    ("spark_args", "message"),
    [
        (("--master", "yarn", "--env-archive", "dist/missing.tar.gz"), "no such file"),
        (("--master", "local[2]", "--env-archive", "{archive}"), "for cluster masters"),
        (("--master", "yarn", "--env-archive"), "--env-archive needs a value"),
        (
            ("--master", "yarn", "--deploy-mode", "cluster", "--env-archive", "{executor}"),
            "a driver in the cluster needs the whole runtime",
        ),
    ],
    ids=["missing archive", "local master", "no value", "executor archive for a cluster driver"],
)
def test_a_wrong_env_archive_stops_before_spark_submit(
    args_spark_home: Path, tmp_path: Path, archive: Path, spark_args: tuple[str, ...], message: str
) -> None:
    out = tmp_path / "stub"
    executor = archive.with_name(archive.name.replace("rmq-spark-env", "rmq-spark-executor-env"))
    executor.write_bytes(b"not really a tarball either")
    given = [a.format(archive=archive, executor=executor) for a in spark_args]
    completed = subprocess.run(
        [str(SCRIPT), *given, "--config", "c.yaml"],
        env={**os.environ, "SPARK_HOME": str(args_spark_home), "STUB_OUT": str(out)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert completed.returncode == 2
    assert message in completed.stderr
    assert not Path(f"{out}.args").exists()


# -- whose master: spark-submit's precedence, local[*,4] only when none is set -----------


def submitted_with(
    spark_home: Path, tmp_path: Path, spark_args: tuple[str, ...], **env: str
) -> tuple[list[str], dict[str, str]]:
    """Like `submitted`, with extra environment variables (SPARK_CONF_DIR, MASTER)."""
    out = tmp_path / "stub"
    environ = {
        key: value
        for key, value in os.environ.items()
        if key
        not in ("SPARK_HOME", "SPARK_CONF_DIR", "MASTER", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    subprocess.run(
        [str(SCRIPT), *spark_args, "--config", "conf/prod.yaml"],
        env={**environ, "SPARK_HOME": str(spark_home), "STUB_OUT": str(out), **env},
        capture_output=True,
        check=True,
        timeout=60,
    )
    args = Path(f"{out}.args").read_text().splitlines()
    seen = dict(line.split("=", 1) for line in Path(f"{out}.env").read_text().splitlines())
    return args, seen


def runs_locally_by_default(args: list[str], env: dict[str, str]) -> bool:
    """Whether the script chose local[*,4] (and this machine's Python for the executors)."""
    chose = "local[*,4]" in args
    assert chose == (env["PYSPARK_PYTHON"] != "unset")
    return chose


@pytest.mark.parametrize(
    "spark_args",
    [("--conf", "spark.master=yarn"), ("--conf=spark.master=yarn",)],
    ids=["--conf", "--conf="],
)
def test_a_master_in_conf_wins_over_the_local_default(
    args_spark_home: Path, tmp_path: Path, spark_args: tuple[str, ...]
) -> None:
    args, env = submitted_with(args_spark_home, tmp_path, spark_args)

    assert not runs_locally_by_default(args, env)
    assert "--master" not in args  # spark-submit reads it from --conf itself
    assert [a for a in args if a.endswith("spark.master=yarn")] == [spark_args[-1]]


@pytest.mark.parametrize(
    "line", ["spark.master yarn", "spark.master=yarn", "  spark.master :  yarn  "]
)
def test_a_master_in_spark_defaults_wins_over_the_local_default(
    args_spark_home: Path, tmp_path: Path, line: str
) -> None:
    conf_dir = tmp_path / "hadoop-edge-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"# edge node\n{line}\n")

    args, env = submitted_with(args_spark_home, tmp_path, (), SPARK_CONF_DIR=str(conf_dir))

    assert not runs_locally_by_default(args, env)
    assert "--master" not in args


def test_spark_homes_conf_is_read_without_spark_conf_dir(
    args_spark_home: Path, tmp_path: Path
) -> None:
    (args_spark_home / "conf").mkdir()
    (args_spark_home / "conf" / "spark-defaults.conf").write_text("spark.master k8s://https://x\n")

    args, env = submitted_with(args_spark_home, tmp_path, ())

    assert not runs_locally_by_default(args, env)


def test_spark_defaults_without_a_master_keep_the_local_default(
    args_spark_home: Path, tmp_path: Path
) -> None:
    (args_spark_home / "conf").mkdir()
    (args_spark_home / "conf" / "spark-defaults.conf").write_text(
        "spark.executor.memory 2g\n# spark.master yarn\nspark.masterish yarn\n"
    )

    args, env = submitted_with(args_spark_home, tmp_path, ())

    assert runs_locally_by_default(args, env)


def test_a_properties_file_replaces_spark_defaults(args_spark_home: Path, tmp_path: Path) -> None:
    (args_spark_home / "conf").mkdir()
    (args_spark_home / "conf" / "spark-defaults.conf").write_text("spark.master yarn\n")
    properties = tmp_path / "job.properties"
    properties.write_text("spark.executor.cores 2\n")

    # spark-submit reads spark-defaults.conf only with --load-spark-defaults then.
    args, env = submitted_with(args_spark_home, tmp_path, ("--properties-file", str(properties)))
    assert runs_locally_by_default(args, env)

    args, env = submitted_with(
        args_spark_home, tmp_path, (f"--properties-file={properties}", "--load-spark-defaults")
    )
    assert not runs_locally_by_default(args, env)

    properties.write_text("spark.master yarn\n")
    args, env = submitted_with(args_spark_home, tmp_path, ("--properties-file", str(properties)))
    assert not runs_locally_by_default(args, env)


def test_the_command_line_master_comes_first(args_spark_home: Path, tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.master yarn\n")

    # --master local[2] over --conf and spark-defaults: local, this machine's Python.
    args, env = submitted_with(
        args_spark_home,
        tmp_path,
        ("--master", "local[2]", "--conf", "spark.master=yarn"),
        SPARK_CONF_DIR=str(conf_dir),
    )
    assert env["PYSPARK_PYTHON"] != "unset"
    assert "local[*,4]" not in args
    # --conf spark.master=local[3] over spark-defaults' yarn: local too.
    args, env = submitted_with(
        args_spark_home, tmp_path, ("--conf", "spark.master=local[3]"), SPARK_CONF_DIR=str(conf_dir)
    )
    assert env["PYSPARK_PYTHON"] != "unset"
    assert "local[*,4]" not in args
    # $MASTER last of all.
    args, env = submitted_with(args_spark_home, tmp_path, (), MASTER="yarn")
    assert not runs_locally_by_default(args, env)
