"""The ``tiletune`` command's service side: ``server``, ``submit``, ``lookup``, against real processes.

A module-wide ``tiletune server`` subprocess (SQLite in a temporary folder) answers the
quick tests; the end-to-end test runs its own server and two ``tiletune worker``
processes through two sweeps (see :mod:`tests.service.processes` for the helpers).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.credentials import ADMIN_TOKEN
from tests.service.cli_runner import Cli
from tests.service.processes import (
    FAST_LEASES,
    START_TIMEOUT_S,
    ServerProcess,
    free_port,
    kill,
    log_tail,
    run_cli,
    serving_this_chip,
    spawn,
    start_server,
    start_worker,
    stop,
    wait_for_health,
)
from tiletune.client.calls import ServerRefusedError
from tiletune.client.wire import BestConfigPublic, ConfigBundle, JobPublic, LookupPublic, SweepPublic
from tiletune.kernels.declaration import parse_dims
from tiletune.kernels.device import get_device
from tiletune.service.cli import main
from tiletune.service.cli.options import service_api

CHIP = get_device("cpu").chip.name
#: Sweeps of the quick tests target a chip no worker has, so their jobs stay queued.
IDLE_CHIP = "test/idle-chip"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``tiletune server`` for the quick tests, with this machine's CPU chip registered."""
    with serving_this_chip(tmp_path_factory.mktemp("cli-server")) as process:
        yield process


@pytest.fixture(autouse=True)
def no_server_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs see only the server URL a test gives, and the suite's admin token."""
    monkeypatch.delenv("TILETUNE_SERVER", raising=False)
    monkeypatch.setenv("TILETUNE_TOKEN", ADMIN_TOKEN)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Runs the command line in this process (the console script itself runs in the e2e test)."""
    return Cli(capsys)


def submit_json(*args: str) -> SweepPublic:
    """``tiletune submit ARGS --json`` through the console script, which must succeed: its sweep."""
    result = run_cli("submit", *args, "--json")
    assert result.returncode == 0, result.stderr
    return SweepPublic.model_validate_json(result.stdout)


# -- submit ---------------------------------------------------------------------------------------


def test_submit_with_flags_queues_one_job_per_shape_and_dtype(server: ServerProcess, cli: Cli) -> None:
    sweep = cli.sweep(
        "--server", server.url, "--kernel", "add", "--shape", "n=4096", "--shape", "n=8192",
        "--dtype", "float32", "--dtype", "float16", "--chip", IDLE_CHIP, "--trials", "3",
        "--strategy", "random", "--patience", "4", "--max-time", "30",
    )  # fmt: skip

    assert {job.kernel for job in sweep.jobs} == {"add"}
    assert sorted((job.shape_key, job.dtype) for job in sweep.jobs) == [
        ("n=4096", "float16"), ("n=4096", "float32"), ("n=8192", "float16"), ("n=8192", "float32"),
    ]  # fmt: skip
    assert {(job.state, job.chip, job.trials, job.strategy) for job in sweep.jobs} == {
        ("queued", IDLE_CHIP, 3, "random")
    }
    assert {(job.patience, job.max_time_s) for job in sweep.jobs} == {(4, 30.0)}
    stored = _sweep(server.url, sweep.id)
    assert [job.id for job in stored.jobs] == [job.id for job in sweep.jobs]


def test_submit_prints_a_table_without_json(server: ServerProcess, cli: Cli) -> None:
    status, out, err = cli(
        "submit", "--server", server.url, "--kernel", "softmax", "--shape", "rows=8,cols=64",
        "--dtype", "float32", "--chip", IDLE_CHIP,
    )  # fmt: skip

    assert status == 0, err
    heading, header, row = out.splitlines()
    assert heading.startswith("sweep ")
    assert f"(softmax): running; jobs: queued 1; chip: {IDLE_CHIP}" in heading
    assert header.split()[:5] == ["job", "shape", "dtype", "state", "trials"]
    assert row.split()[1:5] == ["rows=8,cols=64", "float32", "queued", "0/40"]


def test_submit_file_with_server_from_environment(
    server: ServerProcess, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(
        json.dumps(
            {
                "kernel": "softmax",
                "shapes": [{"rows": 64, "cols": 256}, {"rows": 128, "cols": 512}],
                "dtypes": ["float32"],
                "chips": [IDLE_CHIP],
                "trials": 2,
                "name": "from-file",
            }
        )
    )

    monkeypatch.setenv("TILETUNE_SERVER", server.url)

    sweep = cli.sweep(str(path), "--trials", "5", "--patience", "3")

    assert sweep.name == "from-file"
    assert [job.shape_key for job in sweep.jobs] == ["rows=64,cols=256", "rows=128,cols=512"]
    assert {(job.trials, job.patience) for job in sweep.jobs} == {(5, 3)}  # the flags override the file


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--kernel", "no_such_kernel", "--shape", "n=64", "--dtype", "float32"],
            ["kernel", "no_such_kernel"],
        ),
        (["--kernel", "softmax", "--shape", "rows=64", "--dtype", "float32"], ["shapes[0]", "cols"]),
        (["--kernel", "add", "--shape", "n=64", "--dtype", "float64"], ["dtype", "float64"]),
    ],
    ids=["unknown-kernel", "missing-dim", "unknown-dtype"],
)
def test_submit_refused_by_the_server_exits_2_naming_the_field(
    server: ServerProcess, args: list[str], expected: list[str], cli: Cli
) -> None:
    before = httpx.get(f"{server.url}/v1/sweeps").json()

    status, out, err = cli("submit", "--server", server.url, *args)

    assert status == 2, err
    assert all(text in err for text in expected), err
    assert "(422 invalid)" in err
    assert out == ""
    assert httpx.get(f"{server.url}/v1/sweeps").json() == before


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"kernel": "add", "shapes": [{"n": 64}], "trials": 0}, "trials"),
        ({"kernel": "add", "shapes": [{"n": 64}], "tirals": 3}, "tirals"),
        ({"kernel": "add"}, "shapes"),
    ],
)
def test_submit_bad_file_exits_2_before_sending(
    tmp_path: Path, document: dict[str, object], field: str, cli: Cli
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))

    status, _, err = cli("submit", str(path), "--server", "http://127.0.0.1:9")  # never reached

    assert status == 2
    assert f"{path}: {field}" in err


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [("--patience", "0", "patience"), ("--max-time", "-1", "max_time_s"), ("--trials", "0", "trials")],
)
def test_submit_bad_budget_flag_exits_2_naming_the_field(flag: str, value: str, field: str, cli: Cli) -> None:
    args = ("--kernel", "add", "--shape", "n=64", "--dtype", "float32", flag, value)

    status, out, err = cli("submit", *args, "--server", "http://127.0.0.1:9")  # never reached

    assert status == 2
    assert f"error: {field}: " in err, err
    assert out == ""


def test_submit_file_and_kernel_flags_do_not_mix(tmp_path: Path, cli: Cli) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"kernel": "add", "shapes": [{"n": 64}]}))

    status, _, err = cli("submit", str(path), "--kernel", "add", "--server", "http://127.0.0.1:9")

    assert status == 2
    assert "either FILE or --kernel" in err


def test_submit_wait_gives_up_after_timeout(server: ServerProcess, cli: Cli) -> None:
    status, out, err = cli(
        "submit", "--server", server.url, "--kernel", "add", "--shape", "n=1024", "--dtype", "float32",
        "--chip", IDLE_CHIP, "--wait", "--timeout", "1",
    )  # fmt: skip

    assert status == 1
    assert "not finished after 1 s" in err
    assert out == ""


# -- lookup ---------------------------------------------------------------------------------------


def test_lookup_untuned_shape_answers_the_default(server: ServerProcess) -> None:
    # Through the console script: the chip defaults to this machine's CPU chip name.
    result = run_cli(
        "lookup", "add", "--shape", "n=12345", "--dtype", "float32", "--server", server.url, "--json"
    )

    assert result.returncode == 0, result.stderr
    answer = LookupPublic.model_validate_json(result.stdout)
    assert (answer.kernel, answer.shape, answer.chip, answer.match) == ("add", {"n": 12345}, CHIP, "default")
    assert answer.best is None
    assert set(answer.config) == {"tile_size", "buffer_num", "pipeline_depth"}


def test_lookup_text_and_exact_miss(server: ServerProcess, cli: Cli) -> None:
    key = ["add", "--shape", "n=12345", "--dtype", "float32", "--server", server.url]

    text_status, text, text_err = cli("lookup", *key)
    exact_status, _, exact_err = cli("lookup", *key, "--match", "exact")

    assert text_status == 0, text_err
    assert "match:    default" in text
    assert "built-in default" in text
    assert exact_status == 2
    assert "[field: shape] (404 not_found)" in exact_err


# -- server URL, token, reachability ----------------------------------------------------------------

CLIENT_COMMANDS = [
    ["submit", "--kernel", "add", "--shape", "n=64", "--dtype", "float32"],
    ["lookup", "add", "--shape", "n=64", "--dtype", "float32"],
]


@pytest.mark.parametrize("args", CLIENT_COMMANDS, ids=["submit", "lookup"])
def test_missing_server_exits_2_naming_the_option(args: list[str], cli: Cli) -> None:
    status, _, err = cli(*args)

    assert status == 2
    assert "--server URL (or $TILETUNE_SERVER) is required" in err


@pytest.mark.parametrize("args", CLIENT_COMMANDS, ids=["submit", "lookup"])
def test_unreachable_server_exits_1(args: list[str], cli: Cli) -> None:
    status, _, err = cli(*args, "--server", "http://127.0.0.1:9")  # nothing listens on the discard port

    assert status == 1
    assert "cannot reach the server at http://127.0.0.1:9" in err


def _headers_seen(args: argparse.Namespace) -> httpx.Headers:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404, json={"code": "not_found", "message": "no sweep 1", "field": "sweep_id"})

    with (
        service_api(args, httpx.MockTransport(answer)) as api,
        pytest.raises(ServerRefusedError, match="no sweep 1"),
    ):
        api.sweep(1)
    return seen[0].headers


def test_token_and_server_come_from_flags_else_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILETUNE_SERVER", "http://env-server:1")
    monkeypatch.setenv("TILETUNE_TOKEN", "env-token")

    flags = _headers_seen(argparse.Namespace(server="http://flag-server:2", token="flag-token"))
    env = _headers_seen(argparse.Namespace(server=None, token=None))

    assert (flags["host"], flags["authorization"]) == ("flag-server:2", "Bearer flag-token")
    assert (env["host"], env["authorization"]) == ("env-server:1", "Bearer env-token")


# -- the entry point ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["kernels", "tune", "bench", "worker", "server", "up", "submit", "lookup"]
)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])

    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tiletune {command}")


def test_tuner_commands_run_through_the_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kernels", "--json"]) == 0
    assert "softmax" in [kernel["name"] for kernel in json.loads(capsys.readouterr().out)["kernels"]]


def test_client_commands_import_no_server_libraries() -> None:
    code = (
        "import sys, tiletune.service.cli; "
        "print([m for m in ('fastapi', 'uvicorn', 'sqlalchemy', 'optuna', 'alembic') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"


def test_busy_port_exits_1(server: ServerProcess, tmp_path: Path) -> None:
    result = run_cli("server", "--db", f"sqlite:///{tmp_path / 'other.db'}", "--port", str(server.port))

    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{server.port}" in result.stderr
    assert not (tmp_path / "other.db").exists()


# -- end to end -------------------------------------------------------------------------------------

ADD_SHAPES = ["n=4096", "n=16384", "n=65536"]
SOFTMAX_SHAPES = ["rows=64,cols=256", "rows=128,cols=512", "rows=256,cols=256"]
E2E_TIMEOUT_S = 150.0


def _sweep(url: str, sweep_id: int) -> SweepPublic:
    return SweepPublic.model_validate(httpx.get(f"{url}/v1/sweeps/{sweep_id}").json())


def _wait_finished(url: str, sweep_id: int, deadline: float) -> SweepPublic:
    while True:
        sweep = _sweep(url, sweep_id)
        if sweep.state == "finished" or time.monotonic() > deadline:
            return sweep
        time.sleep(1.0)


def _best_in_bundle(url: str, job: JobPublic) -> BestConfigPublic:
    """The job's key in the chip's bulk export (``GET /v1/configs?chip=&kernel=``)."""
    response = httpx.get(f"{url}/v1/configs", params={"chip": CHIP, "kernel": job.kernel})
    bundle = ConfigBundle.model_validate(response.json())
    (best,) = [entry for entry in bundle.configs if entry.shape_key == job.shape_key]
    return best


def _rest_lookup(url: str, job: JobPublic) -> LookupPublic:
    params = {"shape": job.shape_key, "dtype": job.dtype, "chip": CHIP, "match": "exact"}
    return LookupPublic.model_validate(httpx.get(f"{url}/v1/configs/{job.kernel}", params=params).json())


def _cli_lookup(url: str, job: JobPublic) -> LookupPublic:
    result = run_cli(
        "lookup", job.kernel, "--shape", job.shape_key, "--dtype", job.dtype, "--match", "exact",
        "--server", url, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return LookupPublic.model_validate_json(result.stdout)


def _tune_sweep(url: str, folder: Path) -> list[JobPublic]:
    """Submit one sweep over both kernels from a FILE with ``--wait``; its jobs once finished."""
    sweep = {
        "kernels": [
            {"kernel": "add", "shapes": [parse_dims(shape) for shape in ADD_SHAPES]},
            {"kernel": "softmax", "shapes": [parse_dims(shape) for shape in SOFTMAX_SHAPES]},
        ],
        "dtypes": ["float32"],
        "trials": 6,
    }
    path = folder / "sweep.json"
    path.write_text(json.dumps(sweep))
    waited = run_cli(
        "submit", str(path), "--server", url, "--wait", "--json", "--timeout", str(E2E_TIMEOUT_S),
        timeout_s=E2E_TIMEOUT_S + 30,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    finished = SweepPublic.model_validate_json(waited.stdout)
    assert finished.kernels == ["add", "softmax"]
    return finished.jobs


@pytest.mark.slow
def test_two_workers_tune_a_sweep_over_two_kernels_and_every_best_config_is_served(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    workers = [start_worker(server.url, tmp_path / f"worker{i}.log") for i in (1, 2)]
    try:
        jobs = _tune_sweep(server.url, tmp_path)
    finally:
        statuses = [stop(worker) for worker in workers]
    try:
        assert [(job.state, job.chip) for job in jobs] == [("done", CHIP)] * 6, server.log()
        assert statuses == [0, 0], "\n".join(log_tail(tmp_path / f"worker{i}.log") for i in (1, 2))
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = list(pool.map(lambda job: _cli_lookup(server.url, job), jobs))
        for job, answer in zip(jobs, answers, strict=True):
            best = _best_in_bundle(server.url, job)
            assert (answer.match, answer.config) == ("exact", best.config)
            assert answer == _rest_lookup(server.url, job)
            assert best.job_id == job.id
            assert best.median_ms > 0
    finally:
        stop(server.process)


@pytest.mark.slow
def test_up_serves_tunes_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    db_url, port, log_path = f"sqlite:///{tmp_path / 'up.db'}", free_port(), tmp_path / "up.log"
    up = spawn(["up", "--db", db_url, "--port", str(port)], log_path, FAST_LEASES)
    url = f"http://127.0.0.1:{port}"
    add = ["--server", url, "--kernel", "add", "--dtype", "float32"]
    try:
        wait_for_health(url, up, log_path, START_TIMEOUT_S)
        done = submit_json(*add, "--shape", "n=4096", "--trials", "3", "--wait")
        long = submit_json(*add, "--shape", "n=8192", "--trials", "500")
        deadline = time.monotonic() + 60
        while _sweep(url, long.id).jobs[0].state != "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        up.send_signal(signal.SIGINT)
        assert up.wait(30) == 0, log_tail(log_path)
    finally:
        kill(up)

    assert [job.state for job in done.jobs] == ["done"]
    server = start_server(tmp_path, db_url=db_url, port=port)
    try:
        (job,) = _sweep(url, long.id).jobs
        assert (job.state, job.lease_failures) == ("queued", 0), log_tail(log_path)  # released, not expired
    finally:
        stop(server.process)


JOB_LINE = re.compile(
    r"add n=4096 float32: done, best \d+\.\d{4} ms vs default \d+\.\d{4} ms"
    r" \(\d+\.\d{2}\N{MULTIPLICATION SIGN} (faster|slower)\)"
)
SUMMARY = re.compile(
    r"sweep 1 \(add\) finished in \d+ s: done 1(; speedup over default \d+\.\d{2}\N{MULTIPLICATION SIGN})?"
)


@pytest.mark.slow
def test_up_submit_until_done_tunes_the_sweep_then_stops(tmp_path: Path) -> None:
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps({"kernel": "add", "shapes": [{"n": 4096}], "trials": 4}))
    db_url, port = f"sqlite:///{tmp_path / 'up.db'}", free_port()

    result = run_cli(
        "up", "--db", db_url, "--port", str(port), "--submit", str(sweep_file), "--until-done",
        timeout_s=180,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "submitted sweep 1: 1 job" in lines
    assert [line for line in lines if JOB_LINE.fullmatch(line)], result.stdout
    assert [line for line in lines if SUMMARY.fullmatch(line)], result.stdout
    assert "still serving" not in result.stdout
    assert "stopping after the current trial" in result.stderr  # the worker was stopped, not killed
    with pytest.raises(httpx.TransportError):  # and the server with it
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2.0)


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"kernel": "add", "shapes": [{"n": 4096}], "trials": 0}, "trials"),
        ({"kernel": "add", "shapes": [{"n": 4096}], "chips": ["test/other-chip"]}, "chips"),
    ],
    ids=["bad-trials", "chip-no-local-worker-has"],
)
def test_up_submit_bad_file_exits_2_before_starting(
    tmp_path: Path, document: dict[str, object], field: str
) -> None:
    sweep_file = tmp_path / "bad.json"
    sweep_file.write_text(json.dumps(document))
    db_path = tmp_path / "up.db"

    result = run_cli(
        "up", "--db", f"sqlite:///{db_path}", "--port", str(free_port()), "--submit", str(sweep_file),
        "--until-done", timeout_s=60,
    )  # fmt: skip

    assert result.returncode == 2, result.stderr
    assert f"tiletune up: error: {sweep_file}: {field}: " in result.stderr
    assert result.stdout == ""
    assert not db_path.exists()  # nothing migrated, nothing served


def test_up_until_done_needs_a_sweep(cli: Cli) -> None:
    status, out, err = cli("up", "--until-done")

    assert status == 2
    assert "until-done: needs --submit FILE" in err
    assert out == ""


# -- tokens ---------------------------------------------------------------------------------------


def test_token_create_list_and_revoke(server: ServerProcess, cli: Cli) -> None:
    status, out, err = cli(
        "token", "create", "--role", "reader", "--name", "ci-reader", "--server", server.url
    )
    assert status == 0, err
    secret = out.strip()
    assert secret.startswith("tt_")
    assert len(secret) >= 40
    assert "shown once" in err

    status, out, _ = cli("token", "list", "--server", server.url, "--json")
    listed = json.loads(out)["tokens"]
    made = next(token for token in listed if token["name"] == "ci-reader")
    assert status == 0
    assert made["role"] == "reader"
    assert secret not in out

    refused, _, err = cli("token", "list", "--server", server.url, "--token", secret)
    assert refused == 2
    assert "403 forbidden" in err

    status, out, _ = cli("token", "revoke", str(made["id"]), "--server", server.url)
    assert status == 0
    assert f"revoked token {made['id']}" in out
    status, _, err = cli("lookup", "add", "--shape", "n=64", "--dtype", "float32", "--server", server.url,
                         "--token", secret)  # fmt: skip
    assert status == 2
    assert "401 unauthorized" in err


def test_a_fresh_server_without_an_admin_token_shows_one_once(tmp_path: Path) -> None:
    first = start_server(tmp_path, env={"TILETUNE_ADMIN_TOKEN": ""})
    try:
        log = first.log()
        assert "the first admin token (shown once" in log
        secret = log.split("makes others):", 1)[1].split()[0]
        listed = httpx.get(f"{first.url}/v1/tokens", headers={"Authorization": f"Bearer {secret}"})
        assert listed.status_code == 200
        assert [token["role"] for token in listed.json()] == ["admin"]
    finally:
        stop(first.process)
    again = start_server(
        tmp_path, db_url=first.db_url, env={"TILETUNE_ADMIN_TOKEN": ""}, log_name="again.log"
    )
    try:
        assert "first admin token" not in again.log()
    finally:
        stop(again.process)
