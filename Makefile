# rmq-spark: the two commands a new user runs.
#   make demo   set up, start local brokers, move demo data with spark-submit, verify
#               (RABBITMQ=4.0 or RABBITMQ=4.3 for nodes of that version; 3.10 by default)
#   make test   set up, lint, type-check, run unit, Spark and integration tests
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
APT_UPDATED := /tmp/.rmq-spark-apt-updated

.PHONY: setup system roots demo test lint typecheck unit soak bench bench-memory bench-stages clean

setup: system $(INSTALLED)

# Java 17 for Spark and Debian's rabbitmq-server (with its management, shovel and
# federation plugins) for the local brokers; installed only when missing.
system:
	@if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then \
	  echo "installing Java 17"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	fi
	@if [ ! -x /usr/sbin/rabbitmq-server ]; then \
	  echo "installing rabbitmq-server"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server; \
	fi
	@if ! command -v mmdebstrap >/dev/null; then \
	  echo "installing mmdebstrap (builds the Debian roots that hold RabbitMQ 4.x)"; \
	  [ -f $(APT_UPDATED) ] || { apt-get update -qq && touch $(APT_UPDATED); }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap; \
	fi

# RabbitMQ 4.0 (Debian trixie) and 4.3 (Debian forky) in Debian roots under
# ~/.cache/rmq-spark/roots, built only when missing (~20 s each); never on the host.
roots: setup
	$(BIN)/python -m rmq_spark.rabbitmq_roots build

$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# RABBITMQ=4.0 or RABBITMQ=4.3 runs the demo on nodes from a Debian root (built when missing).
RABBITMQ ?= 3.10
demo: setup
	$(BIN)/rmq-spark demo --rabbitmq $(RABBITMQ)

lint: setup
	$(BIN)/ruff check rmq_spark jobs tests
	$(BIN)/ruff format --check rmq_spark jobs tests

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest tests/unit

test: lint typecheck roots
	$(BIN)/pytest tests

# The fault matrix three times over (each run starts its own brokers): flaky
# recovery shows up here before it shows up in CI.
soak: setup
	for round in 1 2 3; do $(BIN)/pytest -q tests/integration/test_faults.py || exit 1; done

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache

bench-memory: setup
	$(BIN)/python -m bench.memory

# Where one mover's window sits (source, intent log, destination, ledger), ~1 min a round.
bench-stages: setup
	$(BIN)/python -m bench.stages

# rmq-spark vs RabbitMQ's Shovel, side by side (~30 min); figures in bench/results/.
bench: setup
	$(BIN)/python -m bench.throughput
