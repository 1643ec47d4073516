# One entry point for developers and CI (.ci/run calls the same targets).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.servo-installed
RUST_SOURCES := $(shell find rust -name '*.rs') Cargo.toml

.PHONY: setup demo test test-slow lint bench study clean

$(STAMP): pyproject.toml $(RUST_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,dev]'
	touch $(STAMP)

## setup: create .venv and install servo (Rust extension in release mode) with server + dev extras
setup: $(STAMP)

## demo: start servo-serve and drive the simulated arm with servo-edge for 15 s
demo: setup
	$(PY) examples/demo.py --duration 15

## test: Rust tests, the Python suite, and every benchmark once as a smoke test
test: setup
	cargo test --quiet
	$(PY) -m pytest -q -m "not slow"
	$(PY) -m pytest -q benches --benchmark-disable

## test-slow: the chaos / soak tests left out of `make test`
test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy
	$(PY) -m mypy.stubtest servo._core

## bench: measure for real; JSON under benches/results/
bench: setup
	mkdir -p benches/results
	$(PY) -m pytest benches --benchmark-enable --benchmark-only --benchmark-json=benches/results/benchmarks.json

## study: regenerate the smoothness-under-latency table and plot
study: setup
	$(PY) -m benches.smoothness

clean:
	rm -rf $(VENV) target .pytest_cache .ruff_cache .mypy_cache
