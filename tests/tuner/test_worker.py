"""The worker process without a server: CLI errors, backoff, stopping, outcomes, light imports.

Tests against the real server app (``tiletune.service.app.create_app``) come with the server:
they pass Starlette's ``TestClient(app)`` as the worker's ``httpx.Client``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import pytest
import torch

from tiletune.client.api import Backoff
from tiletune.kernels import get_kernel
from tiletune.kernels.device import CpuDevice
from tiletune.kernels.replay.recorded import REPLAY_DIR_ENV
from tiletune.kernels.replay.recorded import REPLAY_DIR_ENV as REPLAY_MODULE_ENV
from tiletune.service.cli import main
from tiletune.tuner.measure.bench import BenchSettings, KernelBench
from tiletune.tuner.measure.measurement import Measurement, TrialResult
from tiletune.tuner.measure.result import outcome_of, validated_results
from tiletune.tuner.measure.worker import STOP_REASON, Worker, WorkerRejectedError

#: Nothing listens on the discard port: connections are refused at once.
UNREACHABLE = "http://127.0.0.1:9"
FORBIDDEN_MODULES = ("optuna", "sqlalchemy", "fastapi", "uvicorn", "alembic")
#: The command line lives in tiletune.service.cli; nothing else of tiletune.service may load but the
#: light modules its commands share with the server (standard library only at import): logging
#: set-up, request ids and the tracing switch.
COMMAND_LINE = (
    "tiletune.service",
    "tiletune.service.cli",
    "tiletune.service.logs",
    "tiletune.service.request_ids",
    "tiletune.service.tracing",
)
QUICK = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)


class StopAfter:
    """A fake sleep: records the delays asked for and stops the worker after ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.delays: list[float] = []
        self.worker: Worker | None = None

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if len(self.delays) >= self.limit and self.worker is not None:
            self.worker.stop()


def worker_with(
    transport: httpx.BaseTransport | None, sleep: StopAfter, backoff: Backoff | None = None
) -> Worker:
    http = httpx.Client(base_url=UNREACHABLE, transport=transport, timeout=2.0)
    worker = Worker(http, backend="cpu", name="test-worker", sleep=sleep, backoff=backoff)
    sleep.worker = worker
    return worker


def answering(status: int, body: dict[str, object]) -> httpx.MockTransport:
    """A transport whose every answer is ``status`` with ``body`` (a server in one state, not a mock)."""
    return httpx.MockTransport(lambda request: httpx.Response(status, json=body))


# -- command line ----------------------------------------------------------------------------------


def test_worker_help_explains_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: tiletune worker" in out
    for option in (
        "--server",
        "TILETUNE_SERVER",
        "--token",
        "TILETUNE_TOKEN",
        "--once",
        "--backend",
        "--batch",
        "--no-isolate",
    ):
        assert option in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker"], "--server URL"),
        (["worker", "--server", "tuner:8642"], "--server must be an http:// or https:// URL"),
        (
            ["worker", "--server", "http://tuner:8642", "--batch", "0"],
            "batch: must be an integer from 1 to 64",
        ),
        (
            ["worker", "--server", "http://tuner:8642", "--batch", "65"],
            "batch: must be an integer from 1 to 64",
        ),
    ],
)
def test_bad_worker_input_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.delenv("TILETUNE_SERVER", raising=False)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


def test_unknown_device_kind_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["worker", "--server", UNREACHABLE, "--backend", "tpu"])
    assert exit_.value.code == 2
    assert "--backend" in capsys.readouterr().err


def test_cli_names_the_replay_directory_variable_of_the_replay_module() -> None:
    # cli spells the name out so that `tiletune worker` never imports replay (which imports Optuna)
    assert REPLAY_DIR_ENV == REPLAY_MODULE_ENV


# -- backoff and stopping ----------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0, jitter=0.0)
    assert [backoff.delay_s(n) for n in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff.delay_s(10_000) == 30.0


def test_jitter_only_shortens_delays() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0, jitter=0.1)
    for attempt in range(12):
        plain = min(30.0, 0.5 * 2**attempt)
        assert 0.9 * plain <= backoff.delay_s(attempt) <= plain


def test_unreachable_server_is_retried_with_growing_capped_delays_until_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleep = StopAfter(limit=9)
    worker = worker_with(None, sleep, backoff=Backoff(jitter=0.0))
    with caplog.at_level(logging.WARNING, logger="tiletune.tuner.measure.worker"):
        assert worker.run() == 0  # no exception escapes; no job was worked
    assert sleep.delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert worker.stopping
    assert worker.worker_id is None
    retries = [r.getMessage() for r in caplog.records if "server away" in r.getMessage()]
    assert len(retries) == 9
    assert "/v1/workers" in retries[0]
    assert "ConnectError" in retries[0]


def test_server_errors_5xx_are_retried_like_an_absent_server() -> None:
    sleep = StopAfter(limit=4)
    worker = worker_with(answering(503, {"code": "unavailable", "message": "restarting"}), sleep)
    assert worker.run(once=True) == 0
    assert len(sleep.delays) == 4
    assert all(later > earlier for earlier, later in zip(sleep.delays, sleep.delays[1:], strict=False))


def test_a_refused_registration_is_an_error_not_a_retry() -> None:
    sleep = StopAfter(limit=100)
    worker = worker_with(answering(401, {"code": "unauthorized", "message": "bad token"}), sleep)
    with pytest.raises(WorkerRejectedError, match="unauthorized: bad token"):
        worker.run()
    assert sleep.delays == []


def test_stop_before_run_returns_at_once() -> None:
    sleep = StopAfter(limit=100)
    worker = worker_with(None, sleep)
    worker.stop()
    assert worker.run() == 0
    assert sleep.delays == []


def test_sigterm_stops_the_worker_command_cleanly() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TILETUNE_SERVER", "TILETUNE_TOKEN")}
    command = [
        sys.executable,
        "-m",
        "tiletune.service.cli",
        "worker",
        "--server",
        UNREACHABLE,
        "--backend",
        "cpu",
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    lines = _read_until(process.stderr.readline, "server away", deadline_s=60)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, lines
    rest = process.stderr.read()
    assert "received SIGTERM" in rest
    assert "stopped after 0 job(s)" in rest


def _read_until(readline: Callable[[], str], text: str, deadline_s: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = readline()
        lines.append(line)
        if text in line or not line:
            break
    assert any(text in line for line in lines), lines
    return lines


# -- what the worker reports -------------------------------------------------------------------------


def test_registration_describes_this_chip_and_its_kernels() -> None:
    worker = worker_with(None, StopAfter(limit=1))
    body = worker.registration()
    assert body.name == "test-worker"
    assert body.chip.kind == "cpu"
    assert body.chip.name.startswith("cpu/")
    assert body.chip.local_memory_bytes > 0
    assert body.chip.cores == torch.get_num_threads()  # what its native kernels spread over
    assert "torch" in body.backends
    assert {"add", "matmul", "fused_attention"} <= set(body.kernels)
    assert body.software["torch"]
    # what it runs of each kernel, in the kernel's order: the server leases it jobs by these
    assert body.kernel_backends is not None
    assert set(body.kernel_backends) == set(body.kernels)
    assert body.kernel_backends["add"] == list(get_kernel("add").backends())
    assert body.kernel_backends["add"][0] == "torch"


def test_bench_results_map_to_trial_outcomes() -> None:
    config = {"tile_size": 64}
    measured = outcome_of(7, TrialResult(config, measurement=Measurement.from_samples([2.0, 1.0, 3.0])))
    assert measured.trial_id == 7
    assert measured.measurement is not None
    assert measured.measurement.median_ms == 2.0
    assert measured.invalid is None
    assert measured.error is None
    invalid = outcome_of(8, TrialResult(config, invalid="working set too large"))
    assert (invalid.measurement, invalid.invalid, invalid.error) == (None, "working set too large", None)
    error = outcome_of(9, TrialResult(config, error="wrong result"))
    assert (error.measurement, error.invalid, error.error) == (None, None, "wrong result")
    zero = outcome_of(10, TrialResult(config, measurement=Measurement.from_samples([0.0])))
    assert zero.measurement is None
    assert zero.error is not None


def test_validation_measures_good_configs_and_explains_the_others() -> None:
    spec = get_kernel("add")
    shape = spec.parse_shape({"n": 4096})
    bench = KernelBench(spec, shape, "float32", CpuDevice(), settings=QUICK)
    good = {"tile_size": 1024, "buffer_num": 2, "pipeline_depth": 2}
    other = {"tile_size": 4096, "buffer_num": 1, "pipeline_depth": 1}
    outside = {"tile_size": 3, "buffer_num": 1, "pipeline_depth": 1}
    results = validated_results(bench, [good, outside, other])
    assert [r.config for r in results] == [good, outside, other]
    assert results[0].measurement is not None
    assert results[2].measurement is not None
    assert results[0].measurement.samples == results[2].measurement.samples  # one interleaved run
    assert results[1].measurement is None
    assert results[1].error is not None
    assert "tile_size" in results[1].error


def test_stop_reason_is_the_documented_one() -> None:
    assert STOP_REASON == "worker stopping"


# -- imports -------------------------------------------------------------------------------------------


def _modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if k != "TILETUNE_SERVER"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    )
    modules: list[str] = json.loads(result.stdout.splitlines()[-1])
    return modules


@pytest.mark.parametrize(
    "code",
    [
        "import tiletune.tuner.measure.worker",
        # the whole `tiletune worker` command, up to its input check
        "from tiletune.service.cli import main\nassert main(['worker']) == 2",
    ],
)
def test_the_worker_imports_no_optuna_database_or_server(code: str) -> None:
    loaded = _modules_after(code)
    heavy = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_MODULES)]
    heavy += [
        m
        for m in loaded
        if m.startswith("tiletune.service")
        and m not in COMMAND_LINE
        and not m.startswith(COMMAND_LINE[1] + ".")
    ]
    assert heavy == []


#: What the search half may never load: it runs in the server, which plans without the kernels.
SEARCH_FORBIDDEN = ("torch", "tiletune.kernels", "tiletune.tuner.measure", "tiletune.service")


def test_the_search_half_imports_no_torch_kernels_or_measurement() -> None:
    loaded = _modules_after(
        "import importlib, pkgutil\nimport tiletune.tuner.search as half\n"
        "for m in pkgutil.iter_modules(half.__path__):\n"
        "    importlib.import_module(f'{half.__name__}.{m.name}')"
    )
    assert {"tiletune.tuner.search.search", "tiletune.tuner.search.finalists", "optuna"} <= set(loaded)
    heavy = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in SEARCH_FORBIDDEN)]
    assert heavy == []
