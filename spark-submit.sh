#!/usr/bin/env bash
# Submit an rmq-spark job with spark-submit.
#
#   ./spark-submit.sh [spark-submit options...] --config FILE [job options...]
#
# Everything before --config goes to spark-submit, everything from --config on goes
# to the job. Without a master the job runs on local[*,4] (all cores, 4 attempts per
# task), its JVM compiling with C1 only and sharing class data (below). A master of
# yours wins, found as spark-submit finds it: --master, else --conf spark.master, else
# spark.master in --properties-file, else in spark-defaults.conf ($SPARK_CONF_DIR, or
# the conf directory of the Spark this script runs), else $MASTER:
#
#   ./spark-submit.sh --config conf/prod.yaml                       # local[*,4]
#   ./spark-submit.sh --master spark://host:7077 --config conf/prod.yaml
#   ./spark-submit.sh --master yarn --deploy-mode client --config conf/prod.yaml
#   ./spark-submit.sh --master k8s://https://api:6443 --deploy-mode client \
#       --conf spark.kubernetes.container.image=IMAGE --config conf/prod.yaml
#
# The rmq_spark package is zipped and shipped with --py-files, so executors import
# the same code as the driver. Their Python needs the executor's dependencies: on a
# cluster, ship them with the executor archive `make package` builds, which carries
# its own CPython 3.11 (the nodes need no Python, only glibc >= 2.36):
#
#   ./spark-submit.sh --master yarn --env-archive dist/rmq-spark-executor-env-*.tar.gz \
#       --config conf/prod.yaml
#
# --env-archive ARCHIVE becomes `--archives ARCHIVE#environment`, and the executors'
# Python (and in cluster deploy mode the driver's) becomes ./environment/bin/python,
# a path inside each container's working directory. In cluster deploy mode ship
# dist/rmq-spark-env-*.tar.gz instead (the same CPython with the whole runtime). Without it, a non-local master
# is never told a Python path of this machine: the executors run their own python3
# (or the cluster's spark.pyspark.python, or a PYSPARK_PYTHON you export).
# The job defaults to jobs/transfer.py; RMQ_SPARK_JOB=jobs/other.py picks another.
#
# --in-image: the cluster runs the rmq-spark image (docker/Dockerfile, `make image`),
# which holds the package, its dependencies and jobs/. Nothing is zipped or shipped,
# the executors' Python is the image's (/opt/rmq-spark/venv/bin/python), and in
# cluster deploy mode the driver runs the image's local:///opt/rmq-spark/jobs/JOB with
# the image's log4j2.properties. Kubernetes cluster mode (k8s:// master, --deploy-mode
# cluster) implies it: Spark would otherwise have to upload the package zip
# (spark.kubernetes.file.upload.path). In cluster mode without the image, the driver
# uses the cluster's own log4j configuration (a path of this machine means nothing there).
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
master=""          # --master
conf_master=""     # --conf spark.master=...
properties_file="" # --properties-file
load_defaults=0    # --load-spark-defaults: spark-defaults.conf beside --properties-file
deploy_mode="client"
env_archive=""
in_image=0
user_archives=""
in_job_args=0
pending=""  # the option whose value the next argument is
for arg in "$@"; do
  if [ "$in_job_args" = 0 ] && [ -z "$pending" ] && [ "$arg" = "--config" ]; then
    in_job_args=1
  fi
  if [ "$in_job_args" = 1 ]; then
    job_args+=("$arg")
    continue
  fi
  case "$pending" in
    --env-archive)
      case "$arg" in --*) echo "$0: --env-archive needs a value" >&2; exit 2 ;; esac
      env_archive="$arg"; pending=""; continue ;;
    --archives) user_archives="$arg"; pending=""; continue ;;
    --master) master="$arg" ;;
    --deploy-mode) deploy_mode="$arg" ;;
    --properties-file) properties_file="$arg" ;;
    --conf)
      case "$arg" in
        spark.submit.deployMode=*) deploy_mode="${arg#*=}" ;;
        spark.master=*) conf_master="${arg#*=}" ;;
      esac ;;
  esac
  if [ -n "$pending" ]; then
    pending=""
    spark_args+=("$arg")
    continue
  fi
  case "$arg" in
    --env-archive|--archives) pending="$arg"; continue ;;
    --in-image) in_image=1; continue ;;
    --env-archive=*) env_archive="${arg#*=}"; continue ;;
    --archives=*) user_archives="${arg#*=}"; continue ;;
    --master|--deploy-mode|--conf|--properties-file) pending="$arg" ;;
    --master=*) master="${arg#*=}" ;;
    --deploy-mode=*) deploy_mode="${arg#*=}" ;;
    --properties-file=*) properties_file="${arg#*=}" ;;
    --load-spark-defaults) load_defaults=1 ;;
    --conf=spark.submit.deployMode=*) deploy_mode="${arg#*deployMode=}" ;;
    --conf=spark.master=*) conf_master="${arg#*spark.master=}" ;;
  esac
  spark_args+=("$arg")
done
if [ "${#job_args[@]}" = 0 ]; then
  echo "usage: $0 [spark-submit options...] [--env-archive ARCHIVE | --in-image] --config FILE [job options...]" >&2
  exit 2
fi
if [ -n "$pending" ]; then
  echo "$0: $pending needs a value" >&2
  exit 2
fi

# spark.master in a Java properties file ("key value", "key=value" or "key: value").
properties_master() {
  [ -f "$1" ] || return 0
  sed -n -E 's/^[[:space:]]*spark\.master([[:space:]]*[=:][[:space:]]*|[[:space:]]+)(.*[^[:space:]])[[:space:]]*$/\2/p' \
    "$1" | tail -n 1
}
# spark-submit's precedence: --master, --conf spark.master, --properties-file (which
# replaces spark-defaults.conf unless --load-spark-defaults), spark-defaults.conf of
# $SPARK_CONF_DIR or of the Spark that runs ($SPARK_HOME, else the .venv's pyspark),
# $MASTER. None of them: local[*,4] (below).
if [ -z "$master" ]; then master="$conf_master"; fi
if [ -z "$master" ] && [ -n "$properties_file" ]; then
  master="$(properties_master "$properties_file")"
fi
if [ -z "$master" ] && { [ -z "$properties_file" ] || [ "$load_defaults" = 1 ]; }; then
  spark_conf_dir="${SPARK_CONF_DIR:-}"
  if [ -z "$spark_conf_dir" ] && [ -n "${SPARK_HOME:-}" ]; then
    spark_conf_dir="$SPARK_HOME/conf"
  fi
  if [ -z "$spark_conf_dir" ]; then
    for candidate in "$here"/.venv/lib/python3*/site-packages/pyspark; do
      if [ -d "$candidate" ]; then spark_conf_dir="$candidate/conf"; fi
    done
  fi
  if [ -n "$spark_conf_dir" ]; then
    master="$(properties_master "$spark_conf_dir/spark-defaults.conf")"
  fi
fi
if [ -z "$master" ]; then master="${MASTER:-}"; fi
has_master=0
if [ -n "$master" ]; then has_master=1; fi
local_master=0
case "${master:-local}" in local|local\[*) local_master=1 ;; esac
if [ -n "$env_archive" ]; then
  if [ "$local_master" = 1 ]; then
    # Local executors are this machine's processes and run the checkout's .venv;
    # Spark unpacks a local run's archives elsewhere than ./environment.
    echo "$0: --env-archive is for cluster masters (yarn, k8s://, spark://); a local run uses this checkout's .venv" >&2
    exit 2
  fi
  if [ ! -f "$env_archive" ]; then
    echo "$0: --env-archive $env_archive: no such file (build it with: make package)" >&2
    exit 2
  fi
  env_archive="$(cd "$(dirname "$env_archive")" && pwd)/$(basename "$env_archive")"
  case "$deploy_mode:$(basename "$env_archive")" in
    cluster:rmq-spark-executor-env-*)
      echo "$0: --env-archive $env_archive: a driver in the cluster needs the whole runtime; in cluster deploy mode ship dist/rmq-spark-env-*.tar.gz (make package builds both)" >&2
      exit 2 ;;
  esac
fi
case "$master" in
  k8s://*)
    if [ "$deploy_mode" = cluster ] && [ -z "$env_archive" ]; then in_image=1; fi ;;
esac
if [ "$in_image" = 1 ]; then
  if [ -n "$env_archive" ]; then
    echo "$0: --in-image and --env-archive: the image already holds the environment; choose one" >&2
    exit 2
  fi
  if [ "$local_master" = 1 ]; then
    echo "$0: --in-image is for cluster masters (k8s://, spark://); a local run uses this checkout's .venv" >&2
    exit 2
  fi
fi
# The paths the image (docker/Dockerfile) puts its Python, jobs and log4j config at.
image_python="/opt/rmq-spark/venv/bin/python"
image_dir="/opt/rmq-spark"
if [ "$deploy_mode" != cluster ]; then
  driver_java_options="-Dlog4j2.configurationFile=file:$here/conf/log4j2.properties"
elif [ "$in_image" = 1 ]; then
  driver_java_options="-Dlog4j2.configurationFile=file:$image_dir/conf/log4j2.properties"
  case "$job" in local://*) ;; *) job="local://$image_dir/jobs/$(basename "$job")" ;; esac
else
  driver_java_options=""
fi
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

# The driver's Python (client deploy mode: this machine) is the project's virtual
# environment (made by `make`) when there is one, else python3 on PATH.
venv="$here/.venv"
local_python="python3"
if [ -x "$venv/bin/python" ]; then
  local_python="$venv/bin/python"
fi
submit="${SPARK_HOME:+$SPARK_HOME/bin/spark-submit}"
if [ -z "$submit" ] && [ -x "$venv/bin/spark-submit" ]; then
  submit="$venv/bin/spark-submit"
fi
submit="${submit:-spark-submit}"
python_args=()
environment_python="./environment/bin/python"
if [ "$local_master" = 1 ]; then
  # Local executors run on this machine: this environment's Python is theirs too.
  export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$local_python}"
  export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$local_python}"
elif [ "$in_image" = 1 ]; then
  # Every executor (and in cluster mode the driver) runs in the image, beside its Python.
  python_args+=(--conf "spark.pyspark.python=$image_python")
  unset PYSPARK_PYTHON
  if [ "$deploy_mode" = cluster ]; then
    python_args+=(--conf "spark.pyspark.driver.python=$image_python")
    unset PYSPARK_DRIVER_PYTHON
  else
    driver_python="${PYSPARK_DRIVER_PYTHON:-$local_python}"
    python_args+=(--conf "spark.pyspark.driver.python=$driver_python")
    export PYSPARK_DRIVER_PYTHON="$driver_python"
  fi
elif [ -n "$env_archive" ]; then
  # Every container unpacks the archive into ./environment of its working directory.
  # spark.pyspark.python is what the driver hands to the executors (as PYSPARK_PYTHON
  # in its process); the executorEnv copy covers code that reads the variable there.
  python_args+=(
    --archives "${user_archives:+$user_archives,}$env_archive#environment"
    --conf "spark.pyspark.python=$environment_python"
    --conf "spark.executorEnv.PYSPARK_PYTHON=$environment_python"
  )
  unset PYSPARK_PYTHON
  if [ "$deploy_mode" = cluster ]; then
    # The driver runs in a container of the cluster too (YARN's application master,
    # a Kubernetes driver pod), where the archive is unpacked beside it.
    python_args+=(
      --conf "spark.pyspark.driver.python=$environment_python"
      --conf "spark.yarn.appMasterEnv.PYSPARK_PYTHON=$environment_python"
    )
    unset PYSPARK_DRIVER_PYTHON
  else
    # spark-submit would run a client-mode driver with spark.pyspark.python too when
    # no driver Python is configured; the driver is here, where ./environment is not.
    driver_python="${PYSPARK_DRIVER_PYTHON:-$local_python}"
    python_args+=(--conf "spark.pyspark.driver.python=$driver_python")
    export PYSPARK_DRIVER_PYTHON="$driver_python"
  fi
else
  # No archive: the executors use their own Python; a path of this machine would not
  # exist there. A PYSPARK_PYTHON the user exported is theirs to choose.
  if [ "$deploy_mode" != cluster ]; then
    export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$local_python}"
  fi
fi
if [ -n "$user_archives" ] && [ -z "$env_archive" ]; then
  python_args+=(--archives "$user_archives")
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

py_files_args=()
if [ "$in_image" = 0 ]; then
  package_zip="$(mktemp -d)/rmq_spark.zip"
  py_files_args=(--py-files "$package_zip")
  trap 'rm -rf "$(dirname "$package_zip")"' EXIT
  # Without the dev harness (rmq_spark/devtools: local brokers, the demo), which no job
  # imports, and without bytecode caches.
  (cd "$here" && "$local_python" - "$package_zip" <<'PY'
import sys
import zipfile
from pathlib import Path

with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as archive:
    for path in sorted(Path("rmq_spark").rglob("*")):
        parts = path.parts
        if path.is_file() and parts[1] != "devtools" and "__pycache__" not in parts:
            archive.write(path)
PY
  )
fi
driver_java_args=()
if [ -n "$driver_java_options" ]; then
  driver_java_args=(--conf "spark.driver.extraJavaOptions=$driver_java_options")
fi

status=0
"$submit" \
  --name "rmq-spark $(basename "$job" .py)" \
  ${py_files_args[@]+"${py_files_args[@]}"} \
  --conf spark.speculation=false \
  --conf spark.ui.showConsoleProgress=false \
  ${driver_java_args[@]+"${driver_java_args[@]}"} \
  ${python_args[@]+"${python_args[@]}"} \
  "${spark_args[@]}" \
  "$job" "${job_args[@]}" || status=$?
if [ -n "$cds_new" ] && [ -s "$cds_new" ]; then
  mv -f "$cds_new" "$cds_archive" || true
  # Archives of another Java, Spark or set of options, unused for 30 days, go (~110 MB each).
  find "$cds_dir" -maxdepth 1 -name 'spark-driver-*.jsa' -mtime +30 -delete 2>/dev/null || true
fi
rm -f "${cds_new:-/nonexistent}"
exit "$status"
