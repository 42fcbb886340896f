"""The one switch, ``TILETUNE_TUNE=1``: a real script tunes the keys its model meets into a bundle
file (trials isolated in a real child process), a second process pinned to the file gets every key
exactly with no tuning, a second tuning run tunes nothing, and bad settings are refused by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.client.disk import read_bundle
from tiletune.kernels.device import get_device
from tiletune.kernels.registry import kernels_for
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings
from tiletune.tuner.measure.registration import registration
from tiletune.tuner.measure.tuning_source import (
    FILE_ENV,
    TIME_ENV,
    TRIALS_ENV,
    TUNE_ENV,
    TuningSettings,
    TuningSettingsError,
    TuningSource,
    switch_is_on,
)

ROOT = Path(__file__).resolve().parents[2]

#: A script without a ``__main__`` guard (as many training scripts are): a trial process that ran
#: it again would append a second line to the marker file.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import tiletune
    from tiletune.kernels.ops.source import current_source

    with open(os.environ["MARKER"], "a") as marker:
        marker.write("ran\\n")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.RMSNorm(64, eps=1e-6))
    tiletune.patch(model)
    with torch.no_grad():
        model(torch.randn(8, 32))
    source = current_source()
    answers = {}
    for entry in json.load(open(sys.argv[1]))["configs"] if os.path.exists(sys.argv[1]) else []:
        answer = source.get(entry["kernel"], entry["shape"], dtype=entry["dtype"])
        answers[entry["kernel"] + " " + entry["shape_key"]] = answer.match
    print(json.dumps({"source": type(source).__name__, "answers": answers}))
    """
)


def run_python(arguments: list[str], folder: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    """``python *arguments`` in ``folder``, with ``environment`` over a clean tiletune environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    env |= {"PYTHONPATH": str(ROOT), **environment}
    return subprocess.run(
        [sys.executable, *arguments],
        check=False,
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_script(tmp_path: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    """The guardless script, given the bundle's path, with ``environment``."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    bundle = str(tmp_path / "tuned.json")
    return run_python([str(script), bundle], tmp_path, MARKER=str(tmp_path / "marker"), **environment)


def tuned_lines(stderr: str) -> list[str]:
    """The per-key progress lines of a run."""
    return [line for line in stderr.splitlines() if line.startswith("tiletune: tuned ")]


def test_the_switch_tunes_each_key_once_and_a_pinned_run_gets_them_exactly(tmp_path: Path) -> None:
    bundle = tmp_path / "tuned.json"
    tuning = {TUNE_ENV: "1", TRIALS_ENV: "2", FILE_ENV: str(bundle)}
    first = run_script(tmp_path, **tuning)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "marker").read_text() == "ran\n"  # the trial process never ran the script
    lines = tuned_lines(first.stderr)
    kernels = sorted(line.split()[2] for line in lines)
    assert kernels == ["matmul", "rms_norm"], first.stderr[-3000:]
    assert all("2 trials" in line and "torch's op" in line for line in lines)
    written = read_bundle(bundle)
    assert written.checksum == written.content_checksum()
    assert sorted(entry.kernel for entry in written.configs) == ["matmul", "rms_norm"]
    assert {info.name for info in written.kernels} == {"matmul", "rms_norm"}
    assert {entry.chip for entry in written.configs} == {written.chip}
    assert set(json.loads(first.stdout)["answers"].values()) == {"exact"}

    pinned = run_script(tmp_path, TILETUNE_PIN=str(bundle))
    assert pinned.returncode == 0, pinned.stderr[-3000:]
    assert tuned_lines(pinned.stderr) == []
    answers = json.loads(pinned.stdout)["answers"]
    assert len(answers) == 2
    assert set(answers.values()) == {"exact"}

    again = run_script(tmp_path, **tuning)
    assert again.returncode == 0, again.stderr[-3000:]
    assert tuned_lines(again.stderr) == []  # every key was in the file
    assert read_bundle(bundle).configs == written.configs
    assert_a_server_imports(bundle, tmp_path)


def assert_a_server_imports(bundle: Path, folder: Path) -> None:
    """The file as ``tiletune configs import`` sends it, to the real app on SQLite whose fleet has
    this machine's chip (a worker of it registered): every entry taken, each key then an exact
    answer of the server with the entry's config."""
    written = read_bundle(bundle)
    url = f"sqlite:///{folder / 'server.db'}"
    upgrade(url)
    with TestClient(
        create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False), headers=ADMIN
    ) as app:
        device = get_device("auto")
        worker = registration("w", device.chip, kernels_for(device.kind))
        assert app.post("/v1/workers", json=worker.model_dump(mode="json")).status_code == 201
        body, kind = bundle.read_bytes(), {"Content-Type": "application/json"}
        imported = app.post("/v1/configs/import", content=body, headers=kind)
        assert imported.status_code == 200, imported.text
        assert imported.json()["changed"] == len(written.configs)
        for entry in written.configs:
            shape = ",".join(f"{k}={v}" for k, v in entry.shape.items())
            params = {"shape": shape, "chip": entry.chip, "dtype": entry.dtype}
            answer = app.get(f"/v1/configs/{entry.kernel}", params=params).json()
            assert (answer["match"], answer["config"]) == ("exact", entry.config)


@pytest.mark.parametrize(
    ("environment", "field"),
    [
        ({TUNE_ENV: "maybe"}, TUNE_ENV),
        ({TUNE_ENV: "1", TRIALS_ENV: "0"}, TRIALS_ENV),
        ({TUNE_ENV: "1", TRIALS_ENV: "many"}, TRIALS_ENV),
        ({TUNE_ENV: "1", TIME_ENV: "-3"}, TIME_ENV),
        ({TUNE_ENV: "1", TIME_ENV: "soon"}, TIME_ENV),
    ],
)
def test_a_bad_setting_is_refused_by_name(environment: dict[str, str], field: str) -> None:
    def read() -> None:
        if switch_is_on(environment):
            TuningSettings.from_env(environment)

    with pytest.raises(TuningSettingsError) as refused:
        read()
    assert refused.value.field == field


def test_the_switch_reads_on_and_off() -> None:
    assert [switch_is_on({TUNE_ENV: v}) for v in ("1", " True ", "yes", "on")] == [True] * 4
    assert [switch_is_on({TUNE_ENV: v}) for v in ("", "0", "false", "off")] == [False] * 4
    assert not switch_is_on({})
    defaults = TuningSettings.from_env({TUNE_ENV: "1"})
    assert (defaults.path, defaults.trials, defaults.time_s) == (Path("tiletune_configs.json"), 16, None)


def test_a_file_of_another_chip_or_not_a_bundle_is_refused_and_kept(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    text = json.dumps({"format": "tiletune.configs/1", "chip": "npu/Ascend910B/24c", "configs": []})
    other.write_text(text)
    with pytest.raises(TuningSettingsError, match="npu/Ascend910B") as refused:
        TuningSource(TuningSettings(path=other))
    assert refused.value.field == FILE_ENV
    assert other.read_text() == text
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(TuningSettingsError, match="not a tiletune bundle"):
        TuningSource(TuningSettings(path=broken))
    assert broken.read_text() == "{not json"


def test_tune_a_model_from_python_tunes_its_steps_keys_and_pins_the_process(tmp_path: Path) -> None:
    """``tiletune.tune``: the inference and training steps' keys (the backward's included), then the
    process pinned to the file (exact answers, nothing tuned again); an unpatched model is refused."""
    script = textwrap.dedent(
        """
        import json, sys
        import torch
        import tiletune
        from tiletune.kernels.ops.source import current_source

        model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.RMSNorm(32, eps=1e-6))
        try:
            tiletune.tune(model, torch.randn(4, 16), trials=2, path=sys.argv[1])
        except ValueError as error:
            refused = str(error)
        tiletune.patch(model)
        tuned = tiletune.tune(model, torch.randn(4, 16), trials=2, path=sys.argv[1])
        source = current_source()
        entries = json.load(open(sys.argv[1]))["configs"]
        matches = [source.get(e["kernel"], e["shape"], dtype=e["dtype"]).match for e in entries]
        print(json.dumps({"refused": refused, "tuned": sorted(t.kernel for t in tuned), "matches": matches,
                          "source": type(source).__name__, "weight_grad": model[0].weight.grad is None}))
        """
    )
    # the switch on too: tiletune.tune's pin (an argument) beats it, so the process is pinned
    done = run_python(["-c", script, str(tmp_path / "model.json")], tmp_path, TILETUNE_TUNE="1")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert "patch it first" in result["refused"]
    assert result["tuned"] == ["matmul", "matmul", "matmul", "rms_norm", "rms_norm_backward"]
    assert set(result["matches"]) == {"exact"}
    assert len(result["matches"]) == 5
    assert result["source"] == "ConfigClient"
    assert result["weight_grad"]  # the training step wrote no gradient


def test_a_run_killed_after_its_first_key_keeps_that_key(tmp_path: Path) -> None:
    """Each key is written when it is tuned: a run killed (SIGKILL, no cleanup) just after its first
    progress line leaves a sealed bundle holding that key; the next run tunes only the others."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    bundle = tmp_path / "tuned.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    env |= {"PYTHONPATH": str(ROOT), "MARKER": str(tmp_path / "marker")}
    env |= {TUNE_ENV: "1", TRIALS_ENV: "2", FILE_ENV: str(bundle)}
    command = [sys.executable, str(script), str(bundle)]
    with subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as run:
        assert run.stderr is not None
        first = next(line for line in run.stderr if line.startswith("tiletune: tuned "))
        run.kill()
    kept = read_bundle(bundle)
    assert kept.checksum == kept.content_checksum()
    assert [entry.kernel for entry in kept.configs] == [first.split()[2]]
    rest = run_script(tmp_path, TILETUNE_TUNE="1", TILETUNE_TUNE_TRIALS="2", TILETUNE_TUNE_FILE=str(bundle))
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert len(tuned_lines(rest.stderr)) == 1
    assert len(read_bundle(bundle).configs) == 2
