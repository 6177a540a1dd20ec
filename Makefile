# Quick start: `make demo` and `make test`. Everything else is for developers.
.PHONY: setup demo test test-all bench clean lint format docs

VENV := .venv
PY := $(VENV)/bin/python
SEED ?=
DEMO_SCENARIO ?= game-day
SIM_TESTS := tests/test_apns_sim.py tests/test_fcm_sim.py tests/test_sim_faults.py
# The documentation site (mkdocs.yml) into site/. --strict fails on any warning: a broken link or
# anchor, a page missing from the nav. Never add -q: it silences the warnings, and so passes.
# Material 9.x prints its end-of-life notice (May 2027) on every build; NO_MKDOCS_2_WARNING mutes it.
DOCS_BUILD := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

setup:
	@scripts/setup.sh

demo: setup
	@$(PY) -m harness run $(DEMO_SCENARIO) $(if $(SEED),--seed $(SEED),)

lint: setup
	@$(VENV)/bin/ruff check harness emulators reference_impl chaos locustfiles benchmarks systems tests docs/hooks.py
	@$(VENV)/bin/ruff format --check harness emulators reference_impl chaos locustfiles benchmarks systems tests docs/hooks.py

format: setup
	@$(VENV)/bin/ruff format harness emulators reference_impl chaos locustfiles benchmarks systems tests docs/hooks.py
	@$(VENV)/bin/ruff check --fix harness emulators reference_impl chaos locustfiles benchmarks systems tests docs/hooks.py

docs: setup
	@$(DOCS_BUILD)

# Timing-sensitive tests (marker `timing`) run alone; the other tests two files at a time (each
# file's servers on free ports); whole scenario runs mostly wait on their fault timeline (two at
# a time kept 1.1 of the 2 cores busy), so three at a time fit this 2-core machine. Those marked
# `alone` catch their defect by bounds the load widens (three at a time hid it in 3 of 3 tries).
test: setup lint
	@$(DOCS_BUILD)
	@$(PY) -m pytest -m "timing and not slow and not wholerun" -q
	@$(PY) -m pytest -m "not timing and not slow and not wholerun" -q -n 2 --dist loadfile
	@$(PY) -m pytest -m "wholerun and not slow and not alone" -q -n 3 --durations=12
	@$(PY) -m pytest -m "wholerun and alone and not slow" -q

# test-all also runs moto's own SQS and SNS test suites against our endpoints (fetched from PyPI at a
# pinned moto version into .cache/moto-sqs/ the first time; about 20 s after that).
test-all: setup lint
	@$(PY) -m pytest -m "timing and not wholerun" -q
	@$(PY) -m pytest -m "not timing and not wholerun" -q -n 2 --dist loadfile
	@$(PY) -m pytest -m "wholerun" -q -n 2
	@# the provider simulators' tests again, against two processes on one port (each server)
	@SIM_TEST_PROCESSES=2 $(PY) -m pytest -q $(SIM_TESTS)
	@SIM_TEST_PROCESSES=2 SIM_TEST_SERVER=granian $(PY) -m pytest -q $(SIM_TESTS)
	@$(PY) tests/moto_sqs/run.py
	@$(PY) tests/moto_sns/run.py

bench:
	@SETUP_BENCH=1 scripts/setup.sh
	@mkdir -p reports/bench
	@for b in benchmarks/bench_*.py; do \
		name=$$(basename $$b .py); name=$${name#bench_}; \
		echo "== $$name"; $(PY) $$b --out reports/bench/$$name.json || exit 1; \
	done

clean:
	@-[ -x $(PY) ] && $(PY) -m harness stack down || true
	rm -rf .stack .pytest_cache .ruff_cache .cache reports/*/ *.egg-info
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -not -path './node_modules/*' -exec rm -rf {} +
