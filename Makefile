# One entry point for developers and CI (.ci/run calls the same targets).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# Two installs, each remembered by a stamp: the server extra (what `make demo` needs) and the dev
# extra on top (what `make test` needs). Either order works; neither reinstalls what the other did.
SERVER_STAMP := $(VENV)/.servo-server
DEV_STAMP := $(VENV)/.servo-dev
RUST_SOURCES := $(shell find rust -name '*.rs') Cargo.toml
# openpi's own client drives the openpi front door in the tests, unchanged. Its metadata caps numpy
# below 2 (and pulls dm-tree and pillow for modules the tests do not use): as a dev extra it would
# move the whole suite, mypy included, to numpy 1.26. Its code needs websockets and msgpack (dev).
OPENPI_CLIENT := openpi-client==0.1.2

# LeRobot >= 0.5 needs Python >= 3.12: python3.12 from PATH, else the newest 3.12 pyenv has.
PYTHON312 ?= $(shell python3.12 -c 'import sys' 2>/dev/null && command -v python3.12 || \
	{ v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$$' | tail -1); \
	  test -n "$$v" && echo "$$(pyenv root)/versions/$$v/bin/python3.12"; })
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_PY := $(LEROBOT_VENV)/bin/python
LEROBOT_STAMP := $(LEROBOT_VENV)/.servo-installed

.PHONY: setup demo test test-slow test-hog test-deploy test-observability observability-tools test-lerobot fuzz lint docs wheels bench gpu-check study clean image image-tools test-image
# gpu-check runs where servo is already installed (no network there): this repo's .venv if it
# exists, else the python3 on PATH.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)

comma := ,
# `$(call stage,what,command)`: one line before a setup step, its seconds after it.
stage = @echo "==> $(1)"; start=$$(date +%s); $(2) || exit 1; echo "    done in $$(( $$(date +%s) - start )) s"

$(SERVER_STAMP): pyproject.toml $(RUST_SOURCES)
	$(call stage,virtual environment $(VENV),test -x $(PY) || $(PYTHON) -m venv $(VENV))
	$(call stage,pip up to date,$(PY) -m pip install --quiet --upgrade pip)
	@# venvs made before the rename to servo-robotics hold a `servo` dist owning the same scripts
	@$(PY) -m pip uninstall --quiet --yes servo 2>/dev/null || true
	$(call stage,dependencies: torch with its CUDA libraries (about 3 GB to download and most of the 5.5 GB\
		installed; pip shows each download)$(comma) numpy$(comma) zenoh …,$(PY) -m pip install --progress-bar on $(SERVER_REQUIREMENTS))
	$(call stage,servo-robotics[server]: the Rust core$(comma) a release build with LTO (about a minute of CPU),\
		$(PY) -m pip install -e '.[server]')
	@touch $(SERVER_STAMP)
	@echo "==> $(VENV) holds $$(du -sh $(VENV) | cut -f1)"

# pyproject.toml's requirement lists (`p` is its [project] table): dependencies installed as steps
# of their own, so each step's time shows, and the dev extra without building servo again.
requirements = $(shell $(PYTHON) -c "import shlex, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project'];\
	print(shlex.join($(1)))")
SERVER_REQUIREMENTS = $(call requirements,p['dependencies'] + p['optional-dependencies']['server'])
# The dev extra names the docs extra as servo-robotics[docs]: pip would look for servo on PyPI, so
# the docs extra's own requirements are installed in its place.
DEV_REQUIREMENTS = $(call requirements,[r for r in p['optional-dependencies']['dev'] if not r.startswith('servo-robotics[')] + p['optional-dependencies']['docs'])
$(DEV_STAMP): $(SERVER_STAMP)
	$(call stage,the dev extra (test and lint tools: about 1.5 GB more),$(PY) -m pip install --quiet $(DEV_REQUIREMENTS))
	$(call stage,$(OPENPI_CLIENT),$(PY) -m pip install --quiet --no-deps $(OPENPI_CLIENT))
	@touch $(DEV_STAMP)

## setup: create .venv and install servo (Rust extension in release mode) with server + dev extras
setup: $(DEV_STAMP)

## demo: install the server extra only, start servo-serve and drive the simulated arm with servo-edge for 15 s (DEMO_ARGS='--port N --health-port N' when 7447 or 9100 is taken)
demo: $(SERVER_STAMP)
	$(PY) examples/demo.py --duration 15 $(DEMO_ARGS)

## test: Rust tests, the Python suite, and every benchmark once as a smoke test
test: setup
	cargo test --quiet
	$(PY) -m pytest -q -m "not slow and not observability and not deploy and not image"
	$(PY) -m pytest -q benches --benchmark-disable

## test-deploy: a deployment's real processes: servo-fleet up, systemd's notify protocol (about 2 min)
test-deploy: setup
	$(PY) -m pytest -q -m deploy

# Debian's headless Chromium + its WebDriver, and Prometheus with promtool: what the observability
# tests drive. Installed only when missing (apt-get needs root, as in CI).
OBSERVABILITY_TOOLS := chromium:chromium chromedriver:chromium-driver prometheus:prometheus promtool:prometheus

## observability-tools: apt-get install chromium, chromium-driver and prometheus when missing (idempotent)
observability-tools:
	@missing=$$(for pair in $(OBSERVABILITY_TOOLS); do \
		command -v $${pair%%:*} >/dev/null || echo $${pair#*:}; done | sort -u | tr '\n' ' '); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

## test-observability: servo-monitor in headless Chromium, alert rules with promtool, the Grafana dashboard against a real Prometheus
test-observability: setup observability-tools
	$(PY) -m pytest -q -m observability

# ---------------------------------------------------------------------------- container images
# podman (or CONTAINER=docker) builds deploy/container/Containerfile from the repository root.
CONTAINER ?= podman
IMAGE_BASE ?= docker.io/library/debian:bookworm-slim
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Where TLS is re-signed by a proxy, pip is told its CA bundle: the build gets it as a secret.
IMAGE_CA ?= $(or $(PIP_CERT),$(shell $(PYTHON) -m pip config get global.cert 2>/dev/null))
IMAGE_ARGS ?=
IMAGE_BUILD = $(CONTAINER) build -f deploy/container/Containerfile --build-arg BASE=$(IMAGE_BASE) \
	$(if $(IMAGE_CA),--secret id=ca$(comma)src=$(IMAGE_CA)) $(IMAGE_ARGS)
## image: the policy-server image (servo-server, torch from PyPI) and the edge image (servo-edge, no torch)
image:
	$(call stage,servo-server:$(IMAGE_TAG) (builds the wheel; torch is most of the time and size),$(IMAGE_BUILD) --target server -t servo-server:$(IMAGE_TAG) .)
	$(call stage,servo-edge:$(IMAGE_TAG),$(IMAGE_BUILD) --target edge -t servo-edge:$(IMAGE_TAG) .)
	@$(CONTAINER) images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'servo-(server|edge):$(IMAGE_TAG) '

# What the image test drives: podman, runc (the runtime used here) and debootstrap (its base image).
IMAGE_TOOLS := podman:podman runc:runc debootstrap:debootstrap

## image-tools: apt-get install podman, runc and debootstrap when missing (idempotent)
image-tools:
	@missing=$$(for pair in $(IMAGE_TOOLS); do \
		command -v $${pair%%:*} >/dev/null || [ -x /usr/sbin/$${pair%%:*} ] || echo $${pair#*:}; done | sort -u | tr '\n' ' '); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

## test-image: build both images (`make image`, on a debootstrap base), run the server image, drive a sim robot through it
test-image: setup image-tools
	SERVO_TEST_NETWORK=host $(PY) -m pytest -q -s -m image

$(LEROBOT_STAMP): pyproject.toml $(RUST_SOURCES)
	test -x $(LEROBOT_PY) || $(PYTHON312) -m venv $(LEROBOT_VENV)
	$(LEROBOT_PY) -m pip install --quiet --upgrade pip
	$(LEROBOT_PY) -m pip install --quiet -e '.[server,dev,lerobot]'
	touch $(LEROBOT_STAMP)

## test-lerobot: tests/lerobot (LeRobot checkpoints served, datasets) in its own Python 3.12 venv
test-lerobot:
	@if [ -z "$(PYTHON312)" ]; then \
		echo "test-lerobot: SKIPPED: no Python 3.12 (python3.12 on PATH or in pyenv); LeRobot >= 0.5 needs it"; \
		exit 0; \
	fi; \
	$(MAKE) --no-print-directory $(LEROBOT_STAMP) && $(LEROBOT_PY) -m pytest -q tests/lerobot

## gpu-check: on a CUDA machine, served throughput vs bare forward, latency at N = 1, 4, 16 and the GPU
## paths in use, as one table (< 4 min; installs nothing, loopback only, a watchdog ends it at 230 s)
gpu-check:
	$(GPU_PY) -m benches.gpu_check

# Busy loops beside test-slow and test-hog (conftest.py): the suite must hold on a loaded machine.
SERVO_TEST_HOG ?= 8

## test-slow: the chaos / soak tests left out of `make test`, beside $(SERVO_TEST_HOG) busy loops
test-slow: setup
	SERVO_TEST_HOG=$(SERVO_TEST_HOG) $(PY) -m pytest -q -m slow

## test-hog: the Python suite of `make test`, beside $(SERVO_TEST_HOG) busy loops
test-hog: setup
	SERVO_TEST_HOG=$(SERVO_TEST_HOG) $(PY) -m pytest -q -m "not slow and not observability and not deploy and not image"

## fuzz: 10^6 coverage-guided inputs across every decoder; prints RSS before/after (FUZZ_RUNS=N to change)
fuzz: setup
	mkdir -p .fuzz
	$(PY) -m tests.fuzz.fuzz_decoders --runs $(or $(FUZZ_RUNS),1000000) -artifact_prefix=.fuzz/

lint: setup
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy
	$(PY) -m mypy.stubtest servo._core

## docs: the documentation site (MkDocs, --strict: no broken link, anchor or reference) into site/, then
## its checks (search finds the pages users look for, every public name has a reference entry)
# The docs extra comes with dev (setup). The API, CLI and configuration references are generated from
# the code at build time (docs/_gen/hooks.py), so the build imports servo.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
	SERVO_DOCS_SITE=site $(PY) -m pytest -q tests/docs/test_site.py

## wheels: abi3 wheels tagged manylinux_2_28 for x86_64 and aarch64 and the sdist in dist/, checked
# zig links against a glibc 2.28 sysroot, so no manylinux container is needed; both targets
# cross-compile from any Linux host. Each build is a fresh fat-LTO release build (~35 s of CPU).
WHEEL_TARGETS := x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu
WHEEL_TOOLS := maturin==1.16.0 ziglang==0.17.1 auditwheel==6.8.2
wheels: setup
	$(PY) -m pip install --quiet $(WHEEL_TOOLS)
	rm -f dist/servo_robotics-*
	$(VENV)/bin/maturin sdist --out dist
	for target in $(WHEEL_TARGETS); do \
		rustup target list --installed | grep -qx $$target || rustup target add $$target || exit 1; \
		CARGO_ZIGBUILD_PYTHON_PATH=$(abspath $(PY)) $(VENV)/bin/maturin build --quiet --target $$target \
			--zig --compatibility manylinux_2_28 --out dist || exit 1; \
	done
	$(PY) .ci/check_wheels.py dist

## bench: measure for real; JSON under benches/results/
bench: setup
	mkdir -p benches/results
	$(PY) -m pytest benches --benchmark-enable --benchmark-only --benchmark-json=benches/results/benchmarks.json

## study: regenerate the smoothness-under-latency table and plot
study: setup
	$(PY) -m benches.smoothness

clean:
	rm -rf $(VENV) $(LEROBOT_VENV) target dist site .fuzz .pytest_cache .ruff_cache .mypy_cache
