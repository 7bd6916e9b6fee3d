#!/usr/bin/env bash
# Submit an rmq-spark job with spark-submit.
#
#   ./spark-submit.sh [spark-submit options...] --config FILE [job options...]
#
# Everything before --config goes to spark-submit, everything from --config on goes
# to the job. Without --master the job runs on local[*,4] (all cores, 4 attempts per
# task), its JVM compiling with C1 only (below); any --master passes through:
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

"$submit" \
  --name "rmq-spark $(basename "$job" .py)" \
  --py-files "$package_zip" \
  --conf spark.speculation=false \
  --conf spark.ui.showConsoleProgress=false \
  --conf "spark.driver.extraJavaOptions=$driver_java_options" \
  "${spark_args[@]}" \
  "$job" "${job_args[@]}"
