# tiletune: `make setup` once, then `make run` (local tuning demo) or `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The server's own venv: server.lock, no torch (the tests run a server from it).
SERVER_VENV ?= .venv-server
# libfaketime, preloaded into a server replica whose clock a test shifts (Debian's faketime package).
FAKETIME_LIB := /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
# The lowest versions pyproject's ranges admit, for the contract tests (`make test-lowest`).
LOWEST_VENV ?= .venv-lowest
# Every install is a lock of requirements/ (made by `make lock`): exact versions with their hashes,
# the project itself installed after it without dependencies.
LOCKED := pip install --quiet --no-deps --require-hashes -r
# PyTorch's CPU build for the locks that pin it (a folder of wheels here; PyTorch's CPU index,
# https://download.pytorch.org/whl/cpu/torch/, elsewhere).
TORCH_CPU_WHEELS ?= /opt/wheels
# Extra flags for `make lock`, e.g. LOCK_FLAGS=--upgrade (else the pins of the current locks are kept).
LOCK_FLAGS ?=

.PHONY: setup lock relink run test test-lowest lint typecheck unit docs bench-replay bench-quality clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch comes from the lock (2.13.0, the CPU build): no range can pull another build.
setup: $(BIN)/python
	$(BIN)/$(LOCKED) requirements/dev.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e . --config-settings editable_mode=strict
	# The native CPU kernels: compiled once (ninja from PyPI, the machine's g++) into a cache keyed by
	# sources, torch and CPU; a no-op when built. Importing tiletune.kernels never compiles.
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m tiletune.kernels.native.build
	# The server's install, as a deployment makes it: server.lock, which holds no torch.
	test -x $(SERVER_VENV)/bin/python || $(PYTHON) -m venv $(SERVER_VENV)
	$(SERVER_VENV)/bin/$(LOCKED) requirements/server.lock
	$(SERVER_VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	! $(SERVER_VENV)/bin/python -c "import torch" 2>/dev/null
	# wrk, the load generator of benchmarks/http_load.py (Debian's package): installed when missing, as root.
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q wrk || { apt-get update -q && apt-get install -y -q wrk; }; }; } || \
		echo "wrk is missing (apt-get install wrk as root): benchmarks/http_load.py needs it"
	# libfaketime (Debian's package): the clock-skew test runs a server replica on a shifted clock.
	@test -e $(FAKETIME_LIB) || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q faketime || { apt-get update -q && apt-get install -y -q faketime; }; }; } || \
		{ echo "libfaketime is missing (apt-get install faketime as root): the clock-skew test needs it"; exit 1; }
	# Chromium (Debian's package), the browser the dashboard's tests drive through Playwright.
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; }; } || \
		{ echo "chromium is missing (apt-get install chromium as root): the dashboard's tests need it"; exit 1; }

# The locks, resolved by uv from PyPI (uv reads no pip configuration) after pyproject.toml changes.
# Each holds the build backend (requirements/build.in) for installs without build isolation, never
# the project. server: every platform (the image runs on x86_64 and aarch64); the others Linux
# x86_64, Python 3.11. worker-cuda resolves PyPI's torch (CUDA, nvidia-* wheels) from metadata only.
COMPILE_FLAGS := --generate-hashes --python-version 3.11
LINUX_X86_64 := --python-platform x86_64-manylinux_2_28
# $(call compile,ARGS): one lock, headed by the command that made it (uv's own header omits --find-links).
compile = $(BIN)/uv pip compile --quiet $(COMPILE_FLAGS) $(LOCK_FLAGS) $(1) \
	--custom-compile-command "uv pip compile $(COMPILE_FLAGS) $(strip $(1))"
lock: setup
	$(call compile,pyproject.toml requirements/build.in --extra server --universal -o requirements/server.lock)
	$(call compile,pyproject.toml requirements/build.in requirements/torch-cpu.in --extra worker \
		$(LINUX_X86_64) --find-links $(TORCH_CPU_WHEELS) -o requirements/worker-cpu.lock)
	$(call compile,pyproject.toml requirements/build.in requirements/torch-cuda.in --extra worker --extra cuda \
		$(LINUX_X86_64) -o requirements/worker-cuda.lock)
	$(call compile,pyproject.toml requirements/torch-cpu.in --extra dev \
		$(LINUX_X86_64) --find-links $(TORCH_CPU_WHEELS) -o requirements/dev.lock)

# The strict editable install is a tree of links to the sources: cheap to redo, and
# redone before checks so new modules are seen (mypy follows it; the default finder it does not).
relink: setup
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e . --config-settings editable_mode=strict

run: setup
	$(BIN)/tiletune up --submit examples/demo_sweep.json

lint: relink
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: relink
	$(BIN)/mypy -p tiletune
	$(BIN)/mypy tests benchmarks

unit: relink
	$(BIN)/pytest

# The documentation site, built strictly: a broken link, anchor or missing page fails
# (not --quiet: it hides the warnings that strict mode counts).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

test: lint typecheck docs unit

# The lower bounds, checked: a fresh venv of the server's extra and the test tools at the lowest
# versions pyproject admits (uv's lowest-direct: each direct dependency at its lower bound), no
# torch; then the contract suites a server install runs (tests/service/server_contract.py).
test-lowest: setup
	$(BIN)/uv venv --quiet --clear --python $(PYTHON) $(LOWEST_VENV)
	$(BIN)/uv pip install --quiet --python $(LOWEST_VENV)/bin/python --resolution lowest-direct -e ".[server,test]"
	! $(LOWEST_VENV)/bin/python -c "import torch" 2>/dev/null
	$(LOWEST_VENV)/bin/python -m pytest -p no:cacheprovider -q tests/service -m server_contract

bench-replay: setup
	$(BIN)/python benchmarks/search_replay.py

bench-quality: setup
	$(BIN)/python benchmarks/tuning_quality.py --quick

clean:
	rm -rf $(VENV) $(SERVER_VENV) $(LOWEST_VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache site
