# rmq-spark: the two commands a new user runs.
#   make demo   set up, start local brokers, move demo data with spark-submit, verify
#               (RABBITMQ=4.0 or RABBITMQ=4.3 for nodes of that version; 3.10 by default)
#   make test   set up, lint, type-check, build the docs, run unit, Spark and integration tests
#               (the integration suites beside the rest, two lanes at once: see test)
# Day to day: make check (lint, types, unit tests, the docs build; under 3 minutes).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
APT_UPDATED := /tmp/.rmq-spark-apt-updated

.PHONY: setup system roots image demo test test-integration test-fast-lane test-dbr lint typecheck unit check docs docs-build docs-serve soak \
	bench bench-memory bench-stages bench-many-queues bench-verification clean package executor-archive wheel lock-runtime

setup: system $(INSTALLED)

# Java 17 for Spark, fuse3 for one ledger test, and Debian's rabbitmq-server (with its management, shovel and
# federation plugins) for the local brokers; installed only when missing.
system:
	@if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then \
	  echo "installing Java 17"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	fi
	@# fuse3: the ledger test on a FUSE mount without hard links (as Databricks' /Volumes).
	@if ! command -v fusermount3 >/dev/null || ! ldconfig -p | grep -q libfuse3.so.3; then \
	  echo "installing fuse3"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3; \
	fi
	@if [ ! -x /usr/sbin/rabbitmq-server ]; then \
	  echo "installing rabbitmq-server"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server; \
	fi
	@# patchelf and objdump (binutils): make package's relocatable Python (rmq_spark/devtools/executor_env.py).
	@if ! command -v patchelf >/dev/null || ! command -v objdump >/dev/null; then \
	  echo "installing patchelf and binutils"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf binutils; \
	fi
	@# npm: Azurite, the Azure Blob emulator the az:// ledger tests use (rmq_spark/devtools/azurite_server.py).
	@if ! command -v npm >/dev/null; then \
	  echo "installing npm"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; \
	fi
	@if ! command -v mmdebstrap >/dev/null; then \
	  echo "installing mmdebstrap (builds the Debian roots that hold RabbitMQ 4.x)"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap; \
	fi
	@# podman and runc: the image test's containers (crun fails on this kernel's hybrid cgroups).
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then \
	  echo "installing podman and runc (builds and runs the rmq-spark image)"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc; \
	fi

# RabbitMQ 4.0 (Debian trixie) and 4.3 (Debian forky) in Debian roots under
# ~/.cache/rmq-spark/roots, built only when missing (~20 s each); never on the host.
# Beside them the stand-in Spark worker's root (Java 17, no Python; ~1 min, once) and
# the relocatable Python of the executor archive (~10 s, once per Debian python3.11), and
# the object-store ledger's test servers: Azurite from devtools/azurite/package-lock.json
# (npm ci, ~30 s once) and moto's venv from requirements-s3-server.lock (~40 s once).
roots: setup
	$(BIN)/python -m rmq_spark.devtools.rabbitmq_roots build
	$(BIN)/python -m rmq_spark.devtools.worker_root
	$(BIN)/python -m rmq_spark.devtools.executor_env python
	$(BIN)/python -m rmq_spark.devtools.azurite_server
	$(BIN)/python -c 'from rmq_spark.devtools import s3_server; s3_server.server_venv()'

# The rmq-spark image (docker/Dockerfile) with podman, FROM a Debian root mmdebstrap makes
# (no registry needed): localhost/rmq-spark:VERSION. ~3.5 min the first time; rebuilt only
# when its inputs change (seconds otherwise). tests/integration/test_image_cluster.py
# builds it too.
image: setup
	$(BIN)/python -m rmq_spark.devtools.image build

$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# RABBITMQ=4.0 or RABBITMQ=4.3 runs the demo on nodes from a Debian root (built when missing).
# LEDGER=s3 or LEDGER=azure puts the ledger on a local S3 server (moto) or Azure Blob
# emulator (Azurite) started for the demo (docs/OBJECT_STORE_LEDGER.md).
RABBITMQ ?= 3.10
LEDGER ?= local
demo: setup
	$(BIN)/rmq-spark demo --rabbitmq $(RABBITMQ) --ledger $(LEDGER)

# lint-imports checks the package layout's rules ([tool.importlinter] in pyproject.toml).
lint: setup
	$(BIN)/ruff check rmq_spark jobs tests bench
	$(BIN)/ruff format --check rmq_spark jobs tests bench
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit

# make test, what CI runs: lint first (seconds, and a slip fails at once), then two lanes
# at once (make -j2; --output-sync prints each lane's output whole when the lane ends):
#   test-integration  the broker suites: real nodes, Spark, Delta, on two pytest-xdist
#                     workers (~40 minutes here; see docs/testing.md)
#   test-fast-lane    types, the docs build, make test-dbr, the unit and Spark suites (~6 min
#                     alone, ~16 beside the integration lane)
# One integration worker left a third of two cores idle while it waited on brokers (vmstat
# over a whole fresh-clone run: 37 % idle); with two workers and the fast lane beside
# them, 4 %. --durations: CI's log says where the time goes.
test: lint roots
	$(MAKE) -j2 --output-sync=target test-integration test-fast-lane

# -m "not soak": the runs tests/support/matrix.py marks wait for make soak.
# -n 2 --dist loadgroup: two pytest-xdist workers, each test grouped with the nodes it
# needs (tests/integration/conftest.py); the suite waits on brokers more than it computes.
test-integration: roots
	$(BIN)/pytest -n 2 --dist loadgroup -m "not soak" --durations=40 tests/integration

# -p no:cacheprovider: the integration lane's pytest owns .pytest_cache meanwhile.
test-fast-lane: typecheck docs-build test-dbr
	$(BIN)/pytest -q -p no:cacheprovider tests/unit tests/spark

# The fast loop for day-to-day work: lint, types, unit tests and the docs build, no brokers
# or Spark (make test runs all of it and the Spark and integration suites).
check: lint typecheck docs-build
	$(BIN)/pytest -q tests/unit

# The docs site (mkdocs.yml, Material for MkDocs): regenerate the reference pages and the
# config's JSON Schema (rmq_spark/devtools/reference.py), then build site/ strictly: a
# broken link, anchor or missing page fails. make test and make check build without
# regenerating, so a stale generated page fails their unit test instead of being rewritten.
docs: setup
	$(BIN)/python -m rmq_spark.devtools.reference write
	$(MAKE) docs-build

docs-build: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Serve the site on http://127.0.0.1:8000 while editing (rebuilds on save).
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The unit and Spark suites again on what Databricks Runtime 17.3 LTS runs: pyspark 4.0
# and the runtime's pyarrow, pandas and numpy (requirements-dbr.lock), on Python 3.12
# when pyenv or the system has it. Its own venv, .venv-dbr: the dependencies are built
# once per machine under ~/.cache/rmq-spark/venv-dbr/, keyed by a hash of the two lock
# files and the interpreter (rmq_spark/devtools/dbr_venv.py); a fresh clone only adds
# its editable rmq-spark over them (seconds, where the whole closure took ~4 minutes).
# (A pyenv shim named python3.12 exists without that version selected: each candidate runs.)
DBR_PYTHON ?= $(or $(shell for p in $$HOME/.pyenv/versions/3.12.*/bin/python3.12 python3.12; do \
	"$$p" -c '' 2>/dev/null && { command -v "$$p"; break; }; done),$(PYTHON))
DBR_VENV := .venv-dbr
DBR_INSTALLED := $(DBR_VENV)/.installed
$(DBR_INSTALLED): pyproject.toml requirements.lock requirements-dbr.lock | setup
	$(BIN)/python -m rmq_spark.devtools.dbr_venv --python $(DBR_PYTHON) $(DBR_VENV)
	touch $@

test-dbr: setup $(DBR_INSTALLED)
	$(DBR_VENV)/bin/python -c 'import sys, pyspark, pyarrow, pandas; print("test-dbr: Python", sys.version.split()[0], "pyspark", pyspark.__version__, "pyarrow", pyarrow.__version__, "pandas", pandas.__version__)'
	$(DBR_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/unit tests/spark

# The runs make test leaves out (tests/support/matrix.py), then the fault matrix three
# times over (each run starts its own brokers): flaky recovery shows up here before it
# shows up in CI.
soak: setup roots
	$(BIN)/pytest -q -m soak tests/integration
	for round in 1 2 3; do $(BIN)/pytest -q tests/integration/test_faults.py tests/integration/test_crash.py || exit 1; done

clean:
	rm -rf $(VENV) $(DBR_VENV) site .demo .pytest_cache .mypy_cache .ruff_cache .import_linter_cache dist build

bench-memory: setup
	$(BIN)/python -m bench.memory

# Where one mover's window sits (source, intent log, destination, ledger), ~1 min a round.
bench-stages: setup
	$(BIN)/python -m bench.stages

# 1,000 queues x 20 messages over 5 vhosts, job vs orchestrated shovels, and planning
# 10,000 queues (~5 min); ARGS="--quick" for a small run.
bench-many-queues: setup
	$(BIN)/python -m bench.many_queues $(ARGS)

# Verification at scale, without brokers: a 1.2 M-row ledger (12 queues x 100,000 x
# 256 B) written as the executors write it, verified as the job does on the Spark and
# the driver engine (~4 min); ARGS="--engines spark" for the Spark engine alone.
bench-verification: setup
	$(BIN)/python -m bench.verification $(ARGS)

# rmq-spark vs RabbitMQ's Shovel, side by side, in two CPU layouts (separated: brokers
# on half the cores, client on the other half; shared); figures in bench/results/.
# About an hour in all; shorter: ARGS="--layouts separated", ARGS="--scenarios single",
# ARGS="--fraction 0.5". Where the RabbitMQ 4.3 root is built (make roots), a 4.3
# section with the local shovel follows; ARGS="--rabbitmq 4.3" runs only that.
bench: setup
	$(BIN)/python -m bench.throughput $(ARGS)

# What a cluster runs, built into dist/ (see README, Deploying):
#   rmq_spark-VERSION-py3-none-any.whl        the package; Spark is the [spark] extra
#   requirements-runtime.lock                 the runtime closure it was built from
#   requirements-executor.lock                what the executors import, and its closure
#   rmq-spark-executor-env-VERSION-cp311-linux_ARCH.tar.gz
#                                             for spark-submit --env-archive (client mode):
#                                             CPython 3.11 itself, the executor lock, the wheel
#   rmq-spark-env-VERSION-cp311-linux_ARCH.tar.gz
#                                             the same CPython with the whole runtime lock,
#                                             for a driver in the cluster (cluster deploy mode)
# Both archives carry their own CPython (Debian bookworm's, made relocatable: see
# rmq_spark/devtools/executor_env.py), so a node needs only glibc >= 2.36, not the
# builder's interpreter. The CPython is built once and cached in ~/.cache/rmq-spark/python.
DIST := dist
EXECUTOR_IMPORTS := obstore,pika,pyarrow,pyarrow.parquet,pydantic,requests,yaml,rmq_spark.transfer.executor,rmq_spark.planning.executor_preflight
DRIVER_IMPORTS := $(EXECUTOR_IMPORTS),deltalake,great_expectations,pandas,matplotlib
ENV_TOOL := $(BIN)/python -m rmq_spark.devtools.executor_env archive
package: executor-archive
	cp requirements-runtime.lock $(DIST)/
	$(ENV_TOOL) --stem rmq-spark-env --requirements requirements-runtime.lock \
	  --wheel $(DIST)/rmq_spark-*.whl --dist $(DIST) --imports $(DRIVER_IMPORTS)
	@ls -l $(DIST)

# The wheel and the executor archive alone (what the standalone-cluster test ships).
executor-archive: setup
	rm -rf $(DIST) build
	mkdir -p $(DIST)
	$(BIN)/pip wheel -q --no-deps --wheel-dir $(DIST) .
	rm -rf build
	cp requirements-executor.lock $(DIST)/
	$(ENV_TOOL) --stem rmq-spark-executor-env --requirements requirements-executor.lock \
	  --wheel $(DIST)/rmq_spark-*.whl --dist $(DIST) --imports $(EXECUTOR_IMPORTS)

# The wheel alone, dist/rmq_spark-VERSION-py3-none-any.whl: what databricks.yml's artifact
# build runs on the deploying machine. Needs only Python and pip (no apt, Java or brokers).
wheel:
	rm -rf build $(DIST)/rmq_spark-*.whl
	$(PYTHON) -m pip wheel -q --no-deps --wheel-dir $(DIST) .
	rm -rf build
	@ls -l $(DIST)/rmq_spark-*.whl

# requirements-runtime.lock from requirements.lock: resolve the package's own
# dependencies (no dev tools, no Spark) in a scratch venv, constrained to the tested pins.
lock-runtime: setup
	rm -rf $(DIST)/.lock-env
	$(PYTHON) -m venv $(DIST)/.lock-env
	$(DIST)/.lock-env/bin/pip install -q -c requirements.lock .
	{ sed -n '1,/^# Regenerate/p' requirements-runtime.lock; \
	  $(DIST)/.lock-env/bin/pip freeze --exclude rmq-spark; } > requirements-runtime.lock.new
	mv requirements-runtime.lock.new requirements-runtime.lock
	rm -rf $(DIST)/.lock-env build
