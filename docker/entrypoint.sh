#!/bin/bash
# The rmq-spark image's entrypoint (written for this image; see docker/Dockerfile).
#
#   driver ARGS...     Spark on Kubernetes, cluster mode: the driver pod runs
#                      spark-submit in client mode inside the pod
#   executor           Spark on Kubernetes: an executor, configured by the SPARK_*
#                      variables the Kubernetes backend sets on the pod
#   master ARGS...     a Spark standalone master (Master's own options)
#   worker ARGS...     a Spark standalone worker (MASTER_URL and Worker's options)
#   anything else      run as given (rmq-spark --version, bash, ...)
#
# Any UID: OpenShift (and `podman run --user 1000700000:0`) runs the image as a UID
# the image's /etc/passwd does not know, with gid 0. Java and Hadoop's user lookup
# fail without a user name, so such a UID gets one through nss_wrapper (a passwd and
# group file of its own, preloaded into every process started from here). Files are
# created group-writable (umask 002), so containers of one group share a volume.
set -euo pipefail

umask 0002

if ! getent passwd "$(id -u)" >/dev/null 2>&1; then
  nss_dir="$(mktemp -d /tmp/rmq-spark-nss.XXXXXX)"
  cp /etc/passwd "$nss_dir/passwd"
  cp /etc/group "$nss_dir/group"
  echo "rmq-spark:x:$(id -u):$(id -g):rmq-spark user:${HOME:-/opt/rmq-spark/work-dir}:/bin/false" \
    >>"$nss_dir/passwd"
  if ! getent group "$(id -g)" >/dev/null 2>&1; then
    echo "rmq-spark:x:$(id -g):" >>"$nss_dir/group"
  fi
  export NSS_WRAPPER_PASSWD="$nss_dir/passwd" NSS_WRAPPER_GROUP="$nss_dir/group"
  export LD_PRELOAD="/usr/local/lib/libnss_wrapper.so${LD_PRELOAD:+ $LD_PRELOAD}"
fi
# A HOME this UID can write (Ivy's cache, Python's user site).
if [ -z "${HOME:-}" ] || [ "$HOME" = / ] || [ ! -w "$HOME" ]; then
  export HOME=/opt/rmq-spark/work-dir
fi

# Spark's classpath: its jars, then what the pod adds (the Kubernetes backend sets
# SPARK_CLASSPATH, SPARK_EXTRA_CLASSPATH and, with Hadoop, SPARK_DIST_CLASSPATH).
spark_classpath() {
  local classpath="$SPARK_HOME/jars/*"
  local extra
  for extra in "${SPARK_CLASSPATH:-}" "${SPARK_EXTRA_CLASSPATH:-}" "${SPARK_DIST_CLASSPATH:-}"; do
    if [ -n "$extra" ]; then classpath="$classpath:$extra"; fi
  done
  if [ -n "${SPARK_CONF_DIR:-}" ]; then classpath="$SPARK_CONF_DIR:$classpath"; fi
  printf '%s' "$classpath"
}

mode="${1:-}"
case "$mode" in
  driver)
    shift
    exec tini -s -- "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?set by Spark on Kubernetes}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # The executor's JVM options arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
    java_opts=()
    index=0
    while name="SPARK_JAVA_OPT_$index" && [ -n "${!name+set}" ]; do
      java_opts+=("${!name}")
      index=$((index + 1))
    done
    exec tini -s -- "$JAVA_HOME/bin/java" ${java_opts[@]+"${java_opts[@]}"} \
      -Xms"${SPARK_EXECUTOR_MEMORY:?}" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$(spark_classpath)" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" \
      --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" \
      --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      ${SPARK_EXECUTOR_POD_NAME:+--podName "$SPARK_EXECUTOR_POD_NAME"} \
      "$@"
    ;;
  master)
    shift
    exec tini -s -- "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master "$@"
    ;;
  worker)
    shift
    exec tini -s -- "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker "$@"
    ;;
  "")
    echo "usage: entrypoint.sh driver|executor|master|worker [ARGS...] | COMMAND [ARGS...]" >&2
    exit 2
    ;;
  *)
    exec tini -s -- "$@"
    ;;
esac
