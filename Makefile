# tiletune: `make setup` once, then `make run` (local tuning demo) or `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The server's own venv: `pip install ".[server]"`, no torch (the tests run a server from it).
SERVER_VENV ?= .venv-server
TORCH_PIN := torch==2.13.0

.PHONY: setup relink run test lint typecheck unit docs bench-replay bench-quality clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned first so no dependency range can pull another build.
setup: $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(BIN)/pip install --quiet $(TORCH_PIN) -e ".[dev]" --config-settings editable_mode=strict
	# The native CPU kernels: compiled once (ninja from PyPI, the machine's g++) into a cache keyed by
	# sources, torch and CPU; a no-op when built. Importing tiletune.kernels never compiles.
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m tiletune.kernels.native.build
	# The server's install, as a deployment makes it: the [server] extra, which holds no torch.
	test -x $(SERVER_VENV)/bin/python || $(PYTHON) -m venv $(SERVER_VENV)
	$(SERVER_VENV)/bin/pip install --quiet -e ".[server]"
	! $(SERVER_VENV)/bin/python -c "import torch" 2>/dev/null
	# wrk, the load generator of benchmarks/http_load.py (Debian's package): installed when missing, as root.
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q wrk || { apt-get update -q && apt-get install -y -q wrk; }; }; } || \
		echo "wrk is missing (apt-get install wrk as root): benchmarks/http_load.py needs it"
	# Chromium (Debian's package), the browser the dashboard's tests drive through Playwright.
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; }; } || \
		{ echo "chromium is missing (apt-get install chromium as root): the dashboard's tests need it"; exit 1; }

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

bench-replay: setup
	$(BIN)/python benchmarks/search_replay.py

bench-quality: setup
	$(BIN)/python benchmarks/tuning_quality.py --quick

clean:
	rm -rf $(VENV) $(SERVER_VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache site
