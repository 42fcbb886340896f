"""One server for the dashboard's tests, its store filled by real tuning, and one browser.

:func:`fleet` (once for this package's tests) starts ``tiletune server`` on SQLite with reads closed (pages
need a token: the tests sign in as a person would) and demand tuning off (the misses page's
button is what queues misses), then fills the store by real tuning:

- :data:`REPLAY_KERNEL` at variants 1–:data:`VARIANTS` on the replay chip, tuned by two
  replay-device worker processes (:data:`TRIALS` trials each);
- ``softmax`` at two shapes on this machine's CPU, tuned by one CPU worker process;
- misses reported by a reader's client for variants nobody tuned.

Workers are stopped once the store is filled. A test that tunes more (a live job, the misses
button) runs on a server of its own (:func:`serving` with ``tuned=False``), so the fleet's store
stays what every other test expects. Tokens of each role are made through the API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser

from tests.credentials import ADMIN_TOKEN
from tests.service.processes import ServerProcess, spawn, start_server, start_worker, stop
from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV, variant_sweep

from .browser import chromium

BUNDLED = Path(__file__).parents[1] / "data" / "replay"
REPLAY_KERNEL = "replay_pnpoly_RTX_3090"
REPLAY_CHIP = "replay/recorded"
VARIANTS = 6
TRIALS = 24
#: Variants clients asked for that nobody tuned (the misses page lists them).
MISSED_VARIANTS = (11, 12, 13)
SOFTMAX_SHAPES = ({"rows": 64, "cols": 256}, {"rows": 256, "cols": 1024})
SERVER_ENV = {
    REPLAY_KERNELS_ENV: str(BUNDLED),
    "TILETUNE_OPEN_READS": "false",
    "TILETUNE_MISS_QUEUE_THRESHOLD": "0",
}
FILL_TIMEOUT_S = 240.0


@dataclass
class Fleet:
    """The dashboard tests' server, its folder and a token of each role."""

    server: ServerProcess
    folder: Path
    tokens: dict[str, str]
    workers: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The server's origin."""
        return self.server.url

    def http(self, role: str = "admin") -> httpx.Client:
        """An API client with the token of ``role``."""
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def start_replay_worker(self, name: str, args: Sequence[str] = ()) -> Any:
        """A replay-device worker process (stopped at the session's end at the latest)."""
        worker = spawn(
            ["worker", "--server", self.url, "--backend", "replay", "--name", name, *args],
            self.folder / f"{name}.log",
            SERVER_ENV,
        )
        self.workers.append(worker)
        return worker

    def wait_for_jobs(
        self, states: Mapping[int, str] | None = None, timeout_s: float = FILL_TIMEOUT_S
    ) -> None:
        """Until no job is queued, running or validating (or each job of ``states`` is in its state)."""
        deadline = time.monotonic() + timeout_s
        with self.http() as http:
            while time.monotonic() < deadline:
                jobs = http.get("/v1/jobs", params={"limit": 1000}).json()
                if states is None:
                    if all(job["state"] not in ("queued", "running", "validating") for job in jobs):
                        return
                elif all(job["state"] == states.get(job["id"], job["state"]) for job in jobs):
                    return
                time.sleep(0.5)
        raise TimeoutError(f"jobs did not settle within {timeout_s:g} s:\n{self.server.log()}")


def _make_tokens(fleet: Fleet) -> None:
    with fleet.http() as http:
        for role in ("reader", "submitter", "worker"):
            created = http.post("/v1/tokens", json={"role": role, "name": f"dashboard-{role}"})
            assert created.status_code in (200, 201), created.text
            fleet.tokens[role] = created.json()["token"]


def _tune(fleet: Fleet) -> None:
    with fleet.http() as http:
        sweep = variant_sweep(REPLAY_KERNEL, VARIANTS, trials=TRIALS, chip=REPLAY_CHIP, seed=3)
        assert http.post("/v1/sweeps", json=sweep).status_code == 201
        softmax = {"kernel": "softmax", "shapes": list(SOFTMAX_SHAPES), "dtypes": ["float32"], "trials": 8}
        assert http.post("/v1/sweeps", json=softmax).status_code == 201
    replay = [fleet.start_replay_worker(f"fill-replay-{n}", ["--batch", "4"]) for n in (1, 2)]
    cpu = start_worker(fleet.url, fleet.folder / "fill-cpu.log", args=["--name", "fill-cpu"], env=SERVER_ENV)
    try:
        fleet.wait_for_jobs()
    finally:
        for worker in (*replay, cpu):
            stop(worker)


def _report_misses(fleet: Fleet) -> None:
    with fleet.http("reader") as http:
        misses = [
            {
                "kernel": REPLAY_KERNEL,
                "shape": {"variant": variant},
                "dtype": "float32",
                "chip": REPLAY_CHIP,
                "match": "nearest",
                "count": variant - 10,
            }
            for variant in MISSED_VARIANTS
        ]
        answer = http.post("/v1/misses", json={"misses": misses})
        assert answer.status_code == 200, answer.text


@contextmanager
def serving(folder: Path, tuned: bool) -> Iterator[Fleet]:
    """A server configured as the session's fleet, with tokens and misses; tuned as it is if ``tuned``.

    An untuned one (no best config, no worker registered) is for a test that tunes: the session's
    fleet must not gain keys, since other pages' tests compare what it holds.
    """
    server = start_server(folder, env=SERVER_ENV)
    fleet = Fleet(server, folder, {"admin": ADMIN_TOKEN})
    try:
        _make_tokens(fleet)
        if tuned:
            _tune(fleet)
        _report_misses(fleet)
        yield fleet
    finally:
        for worker in fleet.workers:
            stop(worker)
        stop(server.process)


@pytest.fixture(scope="package")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The filled server (see the module docstring)."""
    with serving(tmp_path_factory.mktemp("dashboard"), tuned=True) as filled:
        yield filled


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Headless Chromium for this package's tests.

    Package-scoped, not session-scoped: while Playwright's sync API runs, its event loop is the
    thread's running loop, and later tests' ``asyncio.run`` would refuse to start.
    """
    with chromium() as launched:
        yield launched
