"""The operator's commands against real ``tiletune server`` processes: ``sweeps``, ``jobs``,
``workers``, ``configs export|import``, ``--token-file``, ``completion`` and the exit statuses in
``--help``.

Two servers (SQLite, each with this machine's CPU chip registered) serve the module: the first
holds the data (sweeps submitted to chips no worker has, so their jobs stay queued; best configs
imported as a sealed bundle), the second starts empty and receives the exported bundle. A
worker's lease and trials are made through the worker protocol itself, in the test that needs
them (leases last 4 s on these servers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bundles import SOFTWARE, sealed
from tests.credentials import ADMIN, ADMIN_TOKEN
from tests.service.cli_runner import Cli
from tests.service.processes import ServerProcess, run_cli, serving_this_chip
from tiletune.client.wire import (
    ConfigBundle,
    JobPublic,
    ListedWorkerPublic,
    LookupPublic,
    SweepPublic,
    SweepSummaryPublic,
    TrialPublic,
)
from tiletune.kernels.device import get_device
from tiletune.service.cli import main

CHIP = get_device("cpu").chip.name
ADD = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
#: The shapes of the best configs the first server holds.
TUNED = [4096, 8192, 16384]


def _entry(n: int) -> dict[str, Any]:
    return {
        "kernel": "add",
        "kernel_version": 1,
        "shape": {"n": n},
        "shape_key": f"n={n}",
        "dtype": "float32",
        "chip": CHIP,
        "config": ADD,
        "median_ms": 0.5 + n / 65536,
        "promoted_at": datetime.now(UTC).isoformat(),
        "software": SOFTWARE,
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server with the data: best configs of :data:`TUNED` on this machine's chip."""
    with serving_this_chip(tmp_path_factory.mktemp("source")) as process:
        answer = httpx.post(
            f"{process.url}/v1/configs/import", json=sealed(*map(_entry, TUNED)), headers=ADMIN
        )
        assert answer.status_code == 200, answer.text
        yield process


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A second server on a fresh database (this machine's chip registered, nothing tuned)."""
    with serving_this_chip(tmp_path_factory.mktemp("target")) as process:
        yield process


@pytest.fixture(autouse=True)
def suite_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs send the suite's admin token and name their server themselves."""
    for name in ("TILETUNE_SERVER", "TILETUNE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TILETUNE_TOKEN", ADMIN_TOKEN)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


def _submit(cli: Cli, url: str, chip: str, *shapes: str, kernel: str = "add") -> SweepPublic:
    args = ["submit", "--server", url, "--kernel", kernel, "--dtype", "float32", "--chip", chip]
    return SweepPublic.model_validate(cli.json(*args, *(f"--shape={shape}" for shape in shapes)))


# -- sweeps ---------------------------------------------------------------------------------------------


def test_sweeps_list_show_and_cancel(source: ServerProcess, cli: Cli) -> None:
    kept = _submit(cli, source.url, "test/sweeps-chip", "n=1024", "n=2048")
    cancelled = _submit(cli, source.url, "test/sweeps-chip", "n=3072")
    url = ["--server", source.url]

    listed = [SweepSummaryPublic.model_validate(s) for s in cli.json("sweeps", "list", *url)["sweeps"]]
    shown = SweepPublic.model_validate(cli.json("sweeps", "show", str(kept.id), *url))
    after_cancel = SweepPublic.model_validate(cli.json("sweeps", "cancel", str(cancelled.id), *url))
    finished = cli.json("sweeps", "list", "--state", "finished", *url)["sweeps"]
    running = [s["id"] for s in cli.json("sweeps", "list", "--state", "running", *url)["sweeps"]]
    one = cli.json("sweeps", "list", "--state", "running", "--limit", "1", *url)["sweeps"]
    status, table, err = cli("sweeps", "list", *url)

    assert [s.id for s in listed][:2] == [cancelled.id, kept.id]  # newest first
    assert (listed[1].job_count, listed[1].counts) == (2, {"queued": 2})
    assert [job.id for job in shown.jobs] == [job.id for job in kept.jobs]
    assert after_cancel.state == "finished"
    assert {job.state for job in after_cancel.jobs} == {"cancelled"}
    assert cancelled.id in [s["id"] for s in finished]
    assert kept.id not in [s["id"] for s in finished]
    assert kept.id in running
    assert cancelled.id not in running
    assert [s["state"] for s in one] == ["running"]
    assert status == 0, err
    assert table.splitlines()[0].split()[:4] == ["sweep", "name", "state", "kernels"]
    assert any(line.split()[:3] == [str(cancelled.id), "-", "finished"] for line in table.splitlines())


def test_sweeps_show_text_and_an_unknown_sweep(source: ServerProcess, cli: Cli) -> None:
    sweep = _submit(cli, source.url, "test/sweeps-chip", "n=5120")

    status, out, err = cli("sweeps", "show", str(sweep.id), "--server", source.url)
    missing_status, _, missing_err = cli("sweeps", "show", "999999", "--server", source.url)

    assert status == 0, err
    assert out.startswith(f"sweep {sweep.id} (add): running; jobs: queued 1")
    assert missing_status == 2
    assert "404" in missing_err


# -- jobs -----------------------------------------------------------------------------------------------


def test_jobs_list_filters(source: ServerProcess, cli: Cli) -> None:
    adds = _submit(cli, source.url, "test/jobs-chip", "n=1024", "n=2048")
    softmax = _submit(cli, source.url, "test/jobs-chip", "rows=8,cols=64", kernel="softmax")
    url = ["--server", source.url]

    of_sweep = cli.json("jobs", "list", "--sweep", str(adds.id), *url)["jobs"]
    by_kernel = cli.json("jobs", "list", "--kernel", "softmax", "--limit", "1", *url)["jobs"]
    queued = cli.json("jobs", "list", "--state", "queued", "--limit", "3", *url)["jobs"]
    none = cli.json("jobs", "list", "--sweep", str(adds.id), "--state", "done", *url)["jobs"]
    status, table, err = cli("jobs", "list", "--sweep", str(softmax.id), *url)

    assert [job["id"] for job in of_sweep] == sorted((job.id for job in adds.jobs), reverse=True)
    assert [JobPublic.model_validate(job).id for job in by_kernel] == [softmax.jobs[0].id]
    assert len(queued) == 3
    assert {job["state"] for job in queued} == {"queued"}
    assert none == []
    assert status == 0, err
    header, row = table.splitlines()
    assert header.split()[:7] == ["job", "sweep", "kernel", "shape", "dtype", "chip", "state"]
    assert row.split()[:7] == [
        str(softmax.jobs[0].id), str(softmax.id), "softmax", "rows=8,cols=64", "float32", "test/jobs-chip",
        "queued",
    ]  # fmt: skip


def test_jobs_cancel_and_show(source: ServerProcess, cli: Cli) -> None:
    sweep = _submit(cli, source.url, "test/jobs-chip", "n=3072", "n=4096")  # keys no other test queued
    first, second = sweep.jobs
    url = ["--server", source.url]

    cancelled = JobPublic.model_validate(cli.json("jobs", "cancel", str(first.id), *url))
    again_status, again_out, again_err = cli("jobs", "cancel", str(first.id), *url)
    shown = JobPublic.model_validate(cli.json("jobs", "show", str(first.id), *url))
    other = cli.json("sweeps", "show", str(sweep.id), *url)["jobs"][1]
    status, text, err = cli("jobs", "show", str(second.id), *url)

    assert cancelled.state == shown.state == "cancelled"
    assert other["state"] == "queued"  # only the one job
    assert again_status == 0, again_err
    assert f"job {first.id} had already ended (cancelled)" in again_err
    assert again_out.startswith(f"job {first.id} of sweep {sweep.id}: add v1 n=3072 float32")
    assert status == 0, err
    assert "state:    queued" in text
    assert "budget:   40 trials, tpe" in text


# -- workers and a job's trials -------------------------------------------------------------------------

WORKER_CHIP_NAME = "test/fleet-worker-chip"
WORKER_CHIP = {"name": WORKER_CHIP_NAME, "kind": "cpu", "local_memory_bytes": 1 << 20}


def test_workers_list_and_job_trials(source: ServerProcess, cli: Cli) -> None:
    sweep = _submit(cli, source.url, WORKER_CHIP_NAME, "n=65536")
    (job,) = sweep.jobs
    with httpx.Client(base_url=source.url, headers=ADMIN) as http:
        worker = http.post(
            "/v1/workers", json={"name": "fleet-test-worker", "chip": WORKER_CHIP, "backends": ["torch"]}
        ).json()
        lease = http.post("/v1/leases", json={"worker_id": worker["id"]}).json()
        asked = http.post("/v1/lease/ask", params={"n": 2}, headers={"X-Lease-Token": lease["token"]})
        assert asked.status_code == 200, asked.text
        url = ["--server", source.url]

        listed = cli.json("workers", "list", "--seen-within", "60", *url)["workers"]
        status, table, err = cli("workers", "list", *url)
        shown = cli.json("jobs", "show", str(job.id), "--trials", *url)
        text_status, text, text_err = cli("jobs", "show", str(job.id), "--trials", *url)

    workers = [ListedWorkerPublic.model_validate(entry) for entry in listed]
    assert workers[0].id == worker["id"]  # the most recently seen first
    assert (workers[0].chip, workers[0].backends, workers[0].leased_jobs) == (
        WORKER_CHIP_NAME,
        ["torch"],
        [job.id],
    )
    assert "test-registration" in [entry.name for entry in workers]  # the fixture's registration
    assert status == 0, err
    assert table.splitlines()[0].split()[:4] == ["worker", "name", "chip", "backends"]
    (row,) = [line.split() for line in table.splitlines() if line.startswith(f"{worker['id']} ")]
    assert row[:5] == [str(worker["id"]), "fleet-test-worker", WORKER_CHIP_NAME, "torch", str(job.id)]
    trials = [TrialPublic.model_validate(trial) for trial in shown["trials"]]
    assert shown["id"] == job.id
    assert shown["state"] == "running"
    assert len(trials) >= 1
    assert {trial.state for trial in trials} == {"asked"}
    assert text_status == 0, text_err
    assert "trial  number  phase" in text


def test_workers_list_refuses_a_bad_limit_before_sending(cli: Cli) -> None:
    status, out, err = cli("workers", "list", "--limit", "0", "--server", "http://127.0.0.1:9")

    assert status == 2
    assert "limit: must be" in err
    assert out == ""


# -- configs export / import ----------------------------------------------------------------------------


def _lookup(url: str, n: int) -> LookupPublic:
    params = {"shape": f"n={n}", "dtype": "float32", "chip": CHIP, "match": "exact"}
    answer = httpx.get(f"{url}/v1/configs/add", params=params)
    assert answer.status_code == 200, answer.text
    return LookupPublic.model_validate(answer.json())


def _exported(url: str) -> list[dict[str, Any]]:
    bundle = ConfigBundle.model_validate(httpx.get(f"{url}/v1/configs", params={"chip": CHIP}).json())
    return [entry.model_dump(mode="json") for entry in bundle.configs]


def test_export_then_import_into_a_fresh_server(
    source: ServerProcess, target: ServerProcess, cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "out" / "bundle.json"

    summary = cli.json("configs", "export", "--chip", CHIP, "-o", str(path), "--server", source.url)
    status, stdout_bundle, err = cli(
        "configs", "export", "--chip", CHIP, "--kernel", "add", "-o", "-", "--server", source.url
    )
    imported = cli.json("configs", "import", str(path), "--server", target.url)
    again_status, again, again_err = cli("configs", "import", str(path), "--server", target.url)

    bundle = ConfigBundle.model_validate_json(path.read_bytes())
    assert (summary["configs"], summary["chip"], summary["checksum"]) == (3, CHIP, bundle.checksum)
    assert bundle.checksum == bundle.content_checksum()
    assert sorted(entry.shape_key for entry in bundle.configs) == sorted(f"n={n}" for n in TUNED)
    assert not list(path.parent.glob(".*.tmp"))  # written atomically: no temporary file left
    assert status == 0, err
    assert ConfigBundle.model_validate_json(stdout_bundle).checksum == bundle.checksum
    assert imported == {"path": str(path), "chip": CHIP, "configs": 3, "changed": 3}
    for n in TUNED:
        there, here = _lookup(source.url, n), _lookup(target.url, n)
        assert here.best is not None
        assert there.best is not None
        assert (here.config, here.match, here.best.median_ms) == (there.config, "exact", there.best.median_ms)
    assert again_status == 0, again_err
    assert again.strip() == f"imported {path}: 3 config(s), 0 changed"


def test_a_tampered_bundle_is_refused_and_nothing_is_imported(
    source: ServerProcess, target: ServerProcess, cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "bundle.json"
    assert cli("configs", "export", "--chip", CHIP, "-o", str(path), "--server", source.url)[0] == 0
    document = json.loads(path.read_text())
    document["configs"].append({**_entry(32768), "median_ms": 0.01})  # not in the checksum
    path.write_text(json.dumps(document))
    before = _exported(target.url)

    status, out, err = cli("configs", "import", str(path), "--server", target.url)

    assert status == 2
    assert "error: checksum:" in err
    assert "does not match" in err
    assert out == ""
    assert _exported(target.url) == before
    assert (
        httpx.get(
            f"{target.url}/v1/configs/add", params={"shape": "n=32768", "chip": CHIP, "match": "exact"}
        ).status_code
        == 404
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [('{"hello": 1}', "error: file: "), ("not json", "is not a config bundle"), (None, "cannot read")],
    ids=["not-a-bundle", "not-json", "missing"],
)
def test_import_of_a_file_that_is_no_bundle_exits_2(
    content: str | None, expected: str, cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "file.json"
    if content is not None:
        path.write_text(content)

    status, _, err = cli("configs", "import", str(path), "--server", "http://127.0.0.1:9")  # never reached

    assert status == 2
    assert expected in err
    assert "error: file:" in err


# -- tokens from a file ---------------------------------------------------------------------------------


def test_token_file_and_its_precedence(
    source: ServerProcess, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = tmp_path / "admin.token", tmp_path / "bad.token"
    good.write_text(f"\n  {ADMIN_TOKEN}  \n")
    bad.write_text("tt_not-a-token-of-this-server-0123456789abcdef\n")
    monkeypatch.delenv("TILETUNE_TOKEN")
    listing = ["token", "list", "--server", source.url]  # an admin's command: reads are open here

    anonymous = cli(*listing)[0]
    from_file = cli(*listing, "--token-file", str(good))[0]
    file_over_flag = cli(*listing, "--token-file", str(good), "--token", "tt_wrong")[0]
    monkeypatch.setenv("TILETUNE_TOKEN_FILE", str(good))
    monkeypatch.setenv("TILETUNE_TOKEN", "tt_wrong")
    env_file_over_env_token = cli(*listing)[0]
    flag_over_env_file = cli(*listing, "--token", "tt_wrong")[0]
    flag_file_over_env_file = cli(*listing, "--token-file", str(bad))[0]

    assert anonymous == 2
    assert (from_file, file_over_flag, env_file_over_env_token) == (0, 0, 0)
    assert (flag_over_env_file, flag_file_over_env_file) == (2, 2)


@pytest.mark.parametrize("content", [None, "", "  \n", "two words"], ids=["missing", "empty", "blank", "two"])
def test_a_bad_token_file_exits_2_naming_it(content: str | None, cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)

    status, out, err = cli("sweeps", "list", "--token-file", str(path), "--server", "http://127.0.0.1:9")

    assert status == 2
    assert "error: token-file: " in err
    assert out == ""


def test_the_console_script_takes_the_token_file_from_the_environment(
    source: ServerProcess, tmp_path: Path
) -> None:
    path = tmp_path / "admin.token"
    path.write_text(ADMIN_TOKEN)
    environment = {"TILETUNE_TOKEN": "", "TILETUNE_TOKEN_FILE": str(path)}

    found = run_cli("token", "list", "--server", source.url, "--json", env=environment)

    assert found.returncode == 0, found.stderr
    assert "tokens" in json.loads(found.stdout)


def test_the_worker_takes_the_shared_token_file_option(
    source: ServerProcess, cli: Cli, tmp_path: Path
) -> None:
    status, _, err = cli(
        "worker", "--server", source.url, "--token-file", str(tmp_path / "nowhere"), "--once"
    )

    assert status == 2
    assert "error: token-file: cannot read" in err


# -- completion and help --------------------------------------------------------------------------------


def _complete(script: str, *words: str) -> list[str]:
    """What the bash script offers after ``words`` (the last one being completed)."""
    driver = 'COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _tiletune; printf "%s\\n" "${COMPREPLY[@]}"'
    result = subprocess.run(
        ["bash", "-c", f"{script}\n{driver}", "bash", "tiletune", *words],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return result.stdout.split()


def test_bash_completion_is_valid_bash_and_completes_the_commands(cli: Cli, tmp_path: Path) -> None:
    status, script, err = cli("completion", "bash")
    path = tmp_path / "tiletune.bash"
    path.write_text(script)

    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)

    assert status == 0, err
    assert checked.returncode == 0, checked.stderr
    assert {"sweeps", "jobs", "workers", "configs", "completion", "submit"} <= set(_complete(script, ""))
    assert _complete(script, "sweeps", "") == ["list", "show", "cancel", "-h", "--help"]
    assert _complete(script, "jobs", "list", "--state", "c") == ["cancelled"]
    assert "--token-file" in _complete(script, "configs", "export", "--t")
    assert _complete(script, "configs", "import", "") == []  # file names (complete -o default)


def test_zsh_completion_names_the_commands(cli: Cli, tmp_path: Path) -> None:
    status, script, err = cli("completion", "zsh")

    assert status == 0, err
    assert "compdef _tiletune tiletune" in script
    assert "compadd -- list show cancel -h --help" in script
    if shutil.which("zsh"):
        path = tmp_path / "tiletune.zsh"
        path.write_text(script)
        checked = subprocess.run(["zsh", "-n", str(path)], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr


def test_help_lists_the_exit_statuses_once_and_subcommands_point_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["jobs", "cancel", "--help"])
    sub = capsys.readouterr().out

    statuses = top.split("exit status:")[1]
    assert [line.split()[0] for line in statuses.splitlines() if line[:3].strip()] == ["0", "1", "2", "130"]
    assert "bad input" in statuses
    assert "interrupted" in statuses
    assert "Exit statuses: see `tiletune --help`." in sub
    assert "visible to every user of this machine (ps)" in " ".join(sub.split())
