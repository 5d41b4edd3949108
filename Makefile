# ragwatch: `make help` lists the targets. Everything runs from a local venv (.venv).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= agent,stream,embedded,dev
TEST_WORKERS ?= 4
# a file each at a time, in the order tests/conftest.py gives (busy and waiting files mixed)
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
comma := ,

.DEFAULT_GOAL := help
.PHONY: help setup redis chromium alertmanager prometheus demo test unit durations lint typecheck bench soak clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

redis: ## install redis-server from Debian packages if it is missing (needs root)
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

chromium: ## install Debian's chromium (the live page's browser test) if it is missing (needs root)
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

alertmanager: ## install Debian's prometheus-alertmanager (the Alertmanager sink's test) if it is missing (needs root)
	@command -v prometheus-alertmanager >/dev/null 2>&1 || { \
	  echo "installing prometheus-alertmanager (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager >/dev/null; }

prometheus: $(STAMP) ## put Debian's prometheus and promtool (the /metrics and dashboard tests) beside the venv's python if missing (needs apt)
	@test -x $(VENV)/bin/promtool -a -x $(VENV)/bin/prometheus || { \
	  echo "installing prometheus and promtool (apt-get download prometheus)"; \
	  d=$$(mktemp -d) && cd $$d && { apt-get download -qq prometheus 2>/dev/null \
	    || { apt-get update -qq && apt-get download -qq prometheus 2>/dev/null; }; } \
	  && dpkg-deb -x prometheus_*.deb x && cp x/usr/bin/promtool x/usr/bin/prometheus $(CURDIR)/$(VENV)/bin/ \
	  && cd / && rm -rf $$d; }

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[$(EXTRAS)]'
	@touch $@

setup: redis $(STAMP) ## create .venv and install ragwatch with all extras

demo: setup ## replay the GPU memory-leak incident end to end (exit 0 = alert delivered)
	$(VENV)/bin/ragwatch demo

# four pytest-xdist workers on 2 cores (a file each at a time, busy and waiting files mixed:
# tests/conftest.py; each starts its own broker and Redis, and the integration files mostly
# wait on them: 636 s for this part against 696 s on three, measured), then the tests that
# measure a worker's speed, alone
test: setup chromium alertmanager prometheus lint ## lint, type-check and run the whole test suite (unit, contract, integration, doctests)
	$(PY) -m pytest $(XDIST) -m "not serial"
	$(PY) -m pytest -m serial

unit: setup prometheus ## only the fast tests (no broker, no Redis)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not integration"

durations: setup chromium alertmanager prometheus ## run the suite as make test does and record each file's time (tests/durations.json: the order make test hands files out in)
	$(PY) -m pytest $(XDIST) -m "not serial" --write-durations tests/durations.json
	$(PY) -m pytest -m serial --write-durations tests/durations.json

typecheck: setup
	@rm -rf build/typecheck && mkdir -p build/typecheck/ragwatch
	@for f in ragwatch/*; do ln -s "$$PWD/$$f" build/typecheck/ragwatch/; done
	@for d in agents streams detectors; do ln -s "$$PWD/$$d" build/typecheck/ragwatch/$$d; done
	MYPYPATH=build/typecheck $(VENV)/bin/mypy -p ragwatch

lint: setup typecheck ## ruff + mypy (strict)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup ## run the benchmarks, write bench/results/*.json
	$(PY) bench/pipeline.py
	$(PY) bench/banks.py
	$(PY) bench/columnar.py
	$(PY) bench/requests.py
	$(PY) bench/agents.py
	$(PY) bench/throughput.py
	$(PY) bench/latency.py
	$(PY) bench/quality.py
	$(PY) bench/space.py --draws 200
	RAGWATCH_FUZZ_EXAMPLES=2000 $(PY) -m pytest -q tests/unit/test_fuzz_pipelines.py

soak: setup ## 10 minutes of scenario all with random worker kills (bench/soak.py)
	$(PY) bench/soak.py

clean: ## remove the venv, build and cache folders
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache .hypothesis .ragwatch
