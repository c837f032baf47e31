# `make test` and `make demo` set up everything they need on a fresh Debian machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ZK_JAR := /usr/share/java/zookeeper.jar

.PHONY: netns-tools browser test demo demo-katta demo-broker demo-crawl-large bench-crawl chaos test-netns lint bench profile zookeeper redis-server install clean

# `make test` runs the suite in 3 processes (pytest-xdist), each with its own ZooKeeper
# (the session fixture in tests/conftest.py): about 5-7 minutes instead of 12-13 in one
# process on the 2-core machine (most tests wait: sessions expiring, processes starting;
# 3 workers were faster than 2, 7-8 minutes).  `make test TEST_WORKERS=0` runs it in one
# process (docs/architecture.md, "Test suite time").
TEST_WORKERS ?= 3

test: zookeeper netns-tools browser install lint
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The fault tests in network namespaces (tests/test_netns_partitions.py; also part of
# `make test` when run as root): need iproute2.
test-netns: zookeeper netns-tools install
	$(PY) -m pytest -q -m netns

netns-tools:
	@if { ! command -v ip >/dev/null || ! command -v iptables >/dev/null; } \
	    && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Installing iproute2 and iptables (network namespaces for the partition tests)..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    iproute2 iptables >/dev/null; \
	fi

# Debian's headless Chromium and its driver, for the dashboard's browser test
# (tests/test_dashboard.py); no browser download.
browser:
	@if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; } && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null; then \
	  echo "Installing Debian's chromium and chromium-driver (the dashboard's browser test)..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver >/dev/null; \
	fi

# The Fetch Service crawler end to end (partitioned, ZooKeeper as the control plane only):
# ZooKeeper, a generated 10,000-page site, 2 masters, 4 fetchers, kill -9 of the active master
# at 40% and of a fetcher at 60%, every page checked against the site; output in ./out/demo/.
demo: zookeeper install
	$(PY) -m examples.fetch_service.demo

# Katta-like search: index built as a job, 2 masters, 4 search nodes, 8 shards x 2 replicas,
# a query load while a node is killed with kill -9, another frozen with SIGSTOP, and the active
# master killed with kill -9; prints the worst query latency per fault.
demo-katta: zookeeper install
	$(PY) -m examples.katta_like.demo

# Message broker after YMB: 3 servers, 2 controllers, 100 topics, producers and subscribers,
# kill -9 of the busiest primary and of the active controller; nothing acknowledged is lost.
demo-broker: zookeeper install
	$(PY) -m examples.message_broker.demo

# The same crawler at crawl scale: a 200,000-page generated site, 4 fetchers
# (7-12 minutes on 2 cores); output in ./out/crawl/.
demo-crawl-large: zookeeper install
	$(PY) -m examples.fetch_service.scale.run --pages 200000

# The long fault run: 3-node ZooKeeper, worker processes on a queue and a lock, a fault every
# 12 s (kill -9 worker, ZooKeeper leader, follower) for 120 s; history checked, timeline
# plotted to out/chaos/timeline.png. Options: .venv/bin/python -m framework.testing.chaos -h
chaos: zookeeper install
	$(PY) -m pip install -q -e '.[chaos]'
	$(PY) -m framework.testing.chaos

lint: install
	$(PY) -m ruff check framework tests bench examples
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy

# The runtime benchmark's peers (Dramatiq, Celery, RQ) need the `bench` extra and redis-server.
bench: zookeeper redis-server install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/bridge.py
	$(PY) bench/primitives.py
	$(PY) bench/runtime.py

# Where the runtime's time goes: py-spy samples a worker and the master under the 4 workers x
# 4 slots load of bench/runtime.py; prints the top frames, writes flame graphs (svg) to
# /tmp/framework-profile (about 20 s).  py-spy reads other processes: root or CAP_SYS_PTRACE.
# Options: .venv/bin/python -m bench.profile -h (--workload submit-many: the master submitting)
profile: zookeeper install
	$(PY) -m bench.profile

# The crawl benchmark: the partitioned crawler vs one plain process (about 20 minutes; --quick).
bench-crawl: zookeeper install
	$(PY) bench/crawl.py

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: Python 3.11 or newer is needed (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,examples]'
	touch $(STAMP)

# Debian's zookeeper package provides the server jars (Java is a dependency of it).
zookeeper:
	@if [ -n "$$FRAMEWORK_ZK_HOSTS" ] || [ -n "$$ZOOKEEPER_HOME" ] || [ -f $(ZK_JAR) ]; then \
	  exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Installing Debian's zookeeper package..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper >/dev/null; \
	else \
	  echo "error: ZooKeeper is not installed. Run 'sudo apt-get install zookeeper'," \
	       "or set ZOOKEEPER_HOME to an unpacked Apache ZooKeeper," \
	       "or FRAMEWORK_ZK_HOSTS to a running ensemble."; \
	  exit 1; \
	fi

# Debian's redis-server, for the peers in `make bench` (bench/peers.py starts its own server).
redis-server:
	@if command -v redis-server >/dev/null; then \
	  exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Installing Debian's redis-server package..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	else \
	  echo "error: redis-server is not installed. Run 'sudo apt-get install redis-server'."; \
	  exit 1; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
