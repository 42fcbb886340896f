"""The server never imports torch: it plans with the kernels' torch-free declarations.

- In this venv (which has torch), the server's app, its planning of a sweep's space, its lookups
  and its kernel list leave torch out of ``sys.modules``, and they work with torch made
  unimportable.
- The server's own install (``.venv-server``: ``pip install -e ".[server]"``, made by
  ``make setup``) holds no torch, and its ``tiletune server`` takes a sweep that a worker of this
  venv (with torch) runs to its end: every end-to-end test runs its server from there
  (:data:`tests.service.processes.SERVER_TILETUNE`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

from tests.credentials import ADMIN, ADMIN_TOKEN

from .processes import SERVER_TILETUNE, SERVER_VENV, start_server, start_worker, stop

#: The server's work in one process, with torch made unimportable (``sys.modules[name] = None``):
#: a 64-core worker registers, a sweep of a native kernel is queued for its chip, and the default
#: a lookup answers is planned for 64 cores.
SERVER_WORK = """
    import sys
    sys.modules["torch"] = None  # as on a server install: importing torch raises ImportError

    from fastapi.testclient import TestClient

    from tiletune.kernels import all_declarations
    from tiletune.service.app import create_app
    from tiletune.service.migrate import upgrade
    from tiletune.service.settings import Settings

    url = f"sqlite:///{sys.argv[1]}"
    upgrade(url)
    assert {"add", "native_matmul", "triton_fused_attention"} <= set(all_declarations())
    settings = Settings(db_url=url, admin_token=sys.argv[2])
    headers = {"Authorization": f"Bearer {sys.argv[2]}"}
    chip = {"name": "cpu/Declared Chip/64c", "kind": "cpu", "local_memory_bytes": 1 << 20, "cores": 64}
    with TestClient(create_app(settings), headers=headers) as client:
        worker = {"name": "w", "chip": chip, "backends": ["native", "torch"], "software": {"torch": "2.13.0"}}
        registered = client.post("/v1/workers", json=worker)
        assert registered.status_code == 201, registered.text
        sweep = {"kernel": "native_add", "shapes": [{"n": 1 << 22}], "dtypes": ["float32"], "trials": 8}
        created = client.post("/v1/sweeps", json=sweep)
        assert created.status_code == 201, created.text
        params = {"chip": chip["name"], "dtype": "float32", "shape": "n=4194304", "match": "default"}
        answer = client.get("/v1/configs/native_add", params=params)
        assert answer.status_code == 200, answer.text
        assert answer.json()["config"]["block_dim"] == 64, answer.text
    assert not [name for name, module in sys.modules.items() if name.startswith("torch") and module]
    print("ok")
"""


def test_the_server_plans_and_answers_with_torch_unimportable(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SERVER_WORK), str(tmp_path / "t.db"), ADMIN_TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_the_server_install_has_no_torch() -> None:
    python = SERVER_VENV / "bin" / "python"
    code = "import importlib.util as u; print([m for m in ('torch', 'fastapi', 'optuna') if u.find_spec(m)])"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "['fastapi', 'optuna']"


def test_a_server_without_torch_runs_a_sweep_that_a_cpu_worker_measures(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    worker = start_worker(server.url, tmp_path / "worker.log")
    sweep = {"kernel": "add", "shapes": [{"n": 4096}], "dtypes": ["float32"], "trials": 6}
    try:
        with httpx.Client(base_url=server.url, headers=ADMIN, timeout=30) as http:
            http.post("/v1/sweeps", json=sweep).raise_for_status()
            deadline = time.monotonic() + 240
            jobs: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                jobs = http.get("/v1/jobs").json()
                if jobs and all(job["state"] in ("done", "failed") for job in jobs):
                    break
                time.sleep(1)
    finally:
        stop(worker)
        stop(server.process)

    assert server.process.args[0] == SERVER_TILETUNE  # type: ignore[index]
    assert [job["state"] for job in jobs] == ["done"], server.log()
    assert jobs[0]["progress"]["completed"] == 6
