"""Building the SparkSession the job runs in, with the settings it relies on."""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a session is built: `report` and `plan` run without Spark
    from pyspark.sql import SparkSession

from rmq_spark.errors import ConfigError

log = logging.getLogger(__name__)

# A speculative copy of a mover task would consume the same queue twice at once:
# duplicates with no crash to explain them. Retries are fine: a retried task resumes.
ENFORCED_CONF: Mapping[str, str] = {
    "spark.speculation": "false",
    "spark.task.maxFailures": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}

# Set unconditionally: when the Delta jars are absent Spark logs that it cannot load
# the extension and carries on; when present (Databricks, --packages) Delta is on.
DELTA_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_DELTA_CLASS = "io.delta.tables.DeltaTable"

# spark.master in a Java properties file: "key value", "key=value" or "key: value".
_PROPERTIES_MASTER = re.compile(r"^\s*spark\.master(?:\s*[=:]\s*|\s+)(\S.*?)\s*$", re.MULTILINE)


def configured_master(environ: Mapping[str, str] = os.environ) -> str | None:
    """The master the user set outside this program, where a spark-submit would find it.

    spark-submit's precedence: --master, then --conf spark.master (here both from
    PYSPARK_SUBMIT_ARGS), then a --properties-file, then spark-defaults.conf of
    SPARK_CONF_DIR or of the Spark that runs (SPARK_HOME, else pip pyspark's conf/),
    then MASTER. None: nothing set one, and the caller's default applies.
    """
    words = shlex.split(environ.get("PYSPARK_SUBMIT_ARGS", ""))
    options = _submit_options(words)
    if master := options.get("--master") or options.get("spark.master"):
        return master
    files = []
    if properties := options.get("--properties-file"):
        files.append(Path(properties))
    if not properties or "--load-spark-defaults" in words:
        files.append(_spark_conf_dir(environ) / "spark-defaults.conf")
    for path in files:
        try:
            found = _PROPERTIES_MASTER.findall(path.read_text(encoding="utf-8"))
        except OSError:
            continue
        if found:
            return str(found[-1])
    return environ.get("MASTER") or None


def _submit_options(words: list[str]) -> dict[str, str]:
    """--master, --properties-file and --conf key=value settings of spark-submit words."""
    options: dict[str, str] = {}
    for word, following in zip_longest(words, words[1:], fillvalue=""):
        option, value = (
            word.split("=", 1) if word.startswith("--") and "=" in word else (word, following)
        )
        if option in ("--master", "--properties-file"):
            options[option] = value
        elif option == "--conf" and "=" in value:
            key, setting = value.split("=", 1)
            options[key] = setting
    return options


def _spark_conf_dir(environ: Mapping[str, str]) -> Path:
    if conf_dir := environ.get("SPARK_CONF_DIR"):
        return Path(conf_dir)
    if home := environ.get("SPARK_HOME"):
        return Path(home) / "conf"
    import pyspark

    return Path(pyspark.__file__).parent / "conf"


def build_session(
    app_name: str,
    *,
    master: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """Get or create the session, forcing the settings in ENFORCED_CONF.

    `master` is only used when nothing (spark-submit, Databricks) has set one.
    `remote` (sc://host:port) makes a Spark Connect session instead: see
    `connect_session`.
    """
    if remote:
        return connect_session(app_name, remote)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    conf = {**DELTA_CONF, **(extra_conf or {}), **ENFORCED_CONF}
    if master:
        builder = builder.master(master)
        if master.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
            # Local workers run on this machine: give them this interpreter (and so this
            # environment's packages) rather than whatever python3 is first on PATH.
            # PySpark reads the variable when the context starts, not a Spark setting.
            os.environ["PYSPARK_PYTHON"] = sys.executable
    if not delta_jars_on_classpath_hint(conf):
        # Without the jars, the catalog class would make every table lookup fail.
        conf.pop("spark.sql.catalog.spark_catalog", None)
        conf.pop("spark.sql.extensions", None)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in ENFORCED_CONF.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    return spark


def connect_session(app_name: str, remote: str) -> SparkSession:
    """A Spark Connect session to `remote`, with the package shipped as an artifact.

    The server's settings are its own: a client sets SQL settings only. A server that
    runs speculative tasks is refused (a speculative copy of a mover task would consume
    the same queue twice at once); spark.task.maxFailures is the server's.
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
    speculation = str(spark.conf.get("spark.speculation", "false")).strip().lower()
    if speculation == "true":
        spark.stop()
        raise ConfigError(
            f"Spark Connect server {remote} runs with spark.speculation=true: a speculative "
            "copy of a mover task would consume the same queue twice; start it with "
            "--conf spark.speculation=false"
        )
    for key, value in ENFORCED_CONF.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    ship_package(spark)
    return spark


def ship_package(spark: SparkSession) -> None:
    """Add this rmq_spark package (without devtools/) to the session as a Python artifact,
    as spark-submit.sh ships it with --py-files: the server's workers import it."""
    package = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="rmq-spark-artifact-") as scratch:
        archive = Path(scratch) / "rmq_spark.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(package.rglob("*")):
                parts = path.relative_to(package).parts
                if path.is_file() and parts[0] != "devtools" and "__pycache__" not in parts:
                    out.write(path, Path(package.name, *parts))
        spark.addArtifacts(str(archive), pyfile=True)


def delta_jars_on_classpath_hint(conf: Mapping[str, str]) -> bool:
    """Whether the Delta jars are probably present before the JVM starts.

    True on Databricks and when --packages/--jars name delta; the running session
    is asked for certain by `spark_has_delta`.
    """
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    joined = " ".join(
        [submit_args, conf.get("spark.jars.packages", ""), conf.get("spark.jars", "")]
    )
    return "delta" in joined.lower()


def spark_has_delta(spark: SparkSession) -> bool:
    """Whether Spark's own Delta reader/writer can be used in this session.

    A Spark Connect session has no JVM here to ask: Delta counts as there when the
    server's session names Delta's extension (not tried on Databricks, whose runtime
    has Delta built in).
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return "delta" in str(spark.conf.get("spark.sql.extensions", "") or "").lower()
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return False
    try:
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(_DELTA_CLASS)
    except Exception:  # py4j wraps ClassNotFoundException in a generic error
        return False
    return True
