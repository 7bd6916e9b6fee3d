#!/usr/bin/env bash
# Submit an rmq-spark job with spark-submit.
#
#   ./spark-submit.sh [spark-submit options...] --config FILE [job options...]
#
# Everything before --config goes to spark-submit, everything from --config on goes
# to the job. Without --master the job runs on local[*,4] (all cores, 4 attempts per
# task), its JVM compiling with C1 only and sharing class data (below); any --master
# passes through:
#
#   ./spark-submit.sh --config conf/prod.yaml                       # local[*,4]
#   ./spark-submit.sh --master spark://host:7077 --config conf/prod.yaml
#   ./spark-submit.sh --master yarn --deploy-mode client --config conf/prod.yaml
#   ./spark-submit.sh --master k8s://https://api:6443 --deploy-mode client \
#       --conf spark.kubernetes.container.image=IMAGE --config conf/prod.yaml
#
# The rmq_spark package is zipped and shipped with --py-files, so executors import
# the same code as the driver; their Python needs the dependencies in pyproject.toml.
# The job defaults to jobs/transfer.py; RMQ_SPARK_JOB=jobs/other.py picks another.
#
# Live progress: spark-submit's JVM passes everything the Python driver writes on to
# its own stdout through a pipe, so the driver cannot tell whether a terminal is
# listening. This script can: when stdout is a terminal it exports
# RMQ_SPARK_TERMINAL=1 and COLUMNS (its width), and the job draws progress bars;
# otherwise the job logs one progress line every 10 s. Set RMQ_SPARK_TERMINAL=0 (or 1)
# yourself to choose.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
job="${RMQ_SPARK_JOB:-$here/jobs/transfer.py}"

spark_args=()
job_args=()
has_master=0
in_job_args=0
for arg in "$@"; do
  if [ "$in_job_args" = 0 ] && [ "$arg" = "--config" ]; then
    in_job_args=1
  fi
  if [ "$in_job_args" = 1 ]; then
    job_args+=("$arg")
  else
    case "$arg" in --master|--master=*) has_master=1 ;; esac
    spark_args+=("$arg")
  fi
done
if [ "${#job_args[@]}" = 0 ]; then
  echo "usage: $0 [spark-submit options...] --config FILE [job options...]" >&2
  exit 2
fi
driver_java_options="-Dlog4j2.configurationFile=file:$here/conf/log4j2.properties"
if [ "$has_master" = 0 ]; then
  # ',4': local mode retries a failed task only when told how often.
  spark_args=(--master 'local[*,4]' "${spark_args[@]}")
  # Locally the JVM mostly waits for the Python movers, and runs of up to 1M ledger
  # rows are verified without it, so its JIT's start-up work dominates: with C1 alone
  # Spark starts on 8 CPU-s instead of 12.5 (2-core box). Spark-heavy work (verifying
  # a run above 1M rows) is ~15% slower; a --conf spark.driver.extraJavaOptions of
  # your own replaces these options.
  driver_java_options+=" -XX:TieredStopAtLevel=1"
fi

# Prefer the project's virtual environment (made by `make`), then what is on PATH.
venv="$here/.venv"
if [ -x "$venv/bin/python" ]; then
  export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$venv/bin/python}"
  export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$venv/bin/python}"
  submit="${SPARK_HOME:+$SPARK_HOME/bin/spark-submit}"
  submit="${submit:-$venv/bin/spark-submit}"
else
  submit="${SPARK_HOME:+$SPARK_HOME/bin/spark-submit}"
  submit="${submit:-spark-submit}"
fi

# Class data sharing, locally: every JVM loads and verifies Spark's classes afresh,
# about half of the 8 s a local SparkSession takes to start on a 2-core box. The
# first local run records them in an archive (the JDK's dynamic CDS, written as the
# JVM exits: ~10 s, once), and later runs map it and start in ~4 s. The archive's name
# depends on the Java, the Spark jars and the spark-submit options, and the JVM
# itself checks it against its classpath and quietly ignores one that does not fit.
# RMQ_SPARK_CDS=0 turns it off; RMQ_SPARK_CDS_DIR says where archives are kept (an
# archive unused for 30 days is removed when a new one is written).
cds_archive=""
cds_new=""
if [ "$has_master" = 0 ] && [ "${RMQ_SPARK_CDS:-1}" != 0 ]; then
  spark_jars="${SPARK_HOME:+$SPARK_HOME/jars}"
  if [ -z "$spark_jars" ]; then
    for candidate in "$venv"/lib/python3*/site-packages/pyspark/jars; do
      if [ -d "$candidate" ]; then spark_jars="$candidate"; fi
    done
  fi
  java_bin="${JAVA_HOME:+$JAVA_HOME/bin/java}"
  java_bin="$(readlink -f "${java_bin:-$(command -v java || true)}" || true)"
  cds_dir="${RMQ_SPARK_CDS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmq-spark}"
  if [ -d "$spark_jars" ] && [ -n "$java_bin" ] && mkdir -p "$cds_dir" 2>/dev/null; then
    cds_key="$(printf '%s\n' "$java_bin" "$spark_jars" "$(stat -c %Y "$spark_jars")" \
      "${spark_args[@]}" | cksum | cut -d' ' -f1)"
    cds_archive="$cds_dir/spark-driver-$cds_key.jsa"
    if [ -s "$cds_archive" ]; then
      driver_java_options+=" -XX:SharedArchiveFile=$cds_archive"
      touch -c "$cds_archive" 2>/dev/null || true  # its mtime: when it was last used
    else
      # Written under this run's own name, renamed into place once whole.
      cds_new="$cds_archive.$$.tmp"
      driver_java_options+=" -XX:ArchiveClassesAtExit=$cds_new"
    fi
    # The JVM's CDS messages (classes it cannot archive, an archive that does not
    # fit) are no business of the job's output.
    driver_java_options+=" -Xlog:cds=off -Xlog:cds+dynamic=off"
  fi
fi

if [ -z "${RMQ_SPARK_TERMINAL:-}" ]; then
  if [ -t 1 ]; then
    export RMQ_SPARK_TERMINAL=1
    # fd 3 is the terminal (inside $(...) stdout is a pipe); stty reads its size.
    { columns="$(stty size <&3 2>/dev/null | cut -d' ' -f2)" || columns=""; } 3>&1
    if [ -n "$columns" ] && [ "$columns" -gt 0 ] 2>/dev/null; then
      export COLUMNS="$columns"
    fi
  else
    export RMQ_SPARK_TERMINAL=0
  fi
fi

package_zip="$(mktemp -d)/rmq_spark.zip"
trap 'rm -rf "$(dirname "$package_zip")"' EXIT
(cd "$here" && "${PYSPARK_DRIVER_PYTHON:-python3}" -m zipfile -c "$package_zip" rmq_spark)

status=0
"$submit" \
  --name "rmq-spark $(basename "$job" .py)" \
  --py-files "$package_zip" \
  --conf spark.speculation=false \
  --conf spark.ui.showConsoleProgress=false \
  --conf "spark.driver.extraJavaOptions=$driver_java_options" \
  "${spark_args[@]}" \
  "$job" "${job_args[@]}" || status=$?
if [ -n "$cds_new" ] && [ -s "$cds_new" ]; then
  mv -f "$cds_new" "$cds_archive" || true
  # Archives of another Java, Spark or set of options, unused for 30 days, go (~110 MB each).
  find "$cds_dir" -maxdepth 1 -name 'spark-driver-*.jsa' -mtime +30 -delete 2>/dev/null || true
fi
rm -f "${cds_new:-/nonexistent}"
exit "$status"
