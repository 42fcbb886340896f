"""A real tiletune server for the client's tests: the app under uvicorn on a thread, on SQLite.

The sync client talks to it over real HTTP; the async client also through
httpx's ASGI transport (``app``). ``chip`` is registered as a worker would,
and ``tune`` stores a best config as a finished job would (an imported
bundle entry with its provenance).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.bundles import sealed
from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.client.chip import software_fingerprint
from tiletune.kernels import get_declaration
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

CHIP = "cpu/Client Test Chip (AVX2)/2c"


@dataclass
class LiveServer:
    """A served app: its URL and the app object."""

    url: str
    app: FastAPI

    def tune(self, kernel: str, shape: dict[str, int], config: dict[str, int], **fields: Any) -> None:
        """Store ``config`` as the best of (kernel, shape, float32, CHIP) with provenance, at the
        kernel's version here (the server refuses another)."""
        shape_key = ",".join(f"{k}={v}" for k, v in shape.items())
        entry = {
            "kernel": kernel,
            "kernel_version": get_declaration(kernel).version,
            "shape": shape,
            "shape_key": shape_key,
            "dtype": "float32",
            "chip": CHIP,
            "config": config,
            "median_ms": 1.0,
            "default_ms": 3.0,
            "software": software_fingerprint(),
            "promoted_at": datetime.now(UTC).isoformat(),
            **fields,
        }
        httpx.post(f"{self.url}/v1/configs/import", json=sealed(entry), headers=ADMIN).raise_for_status()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    upgrade(url)
    settings = Settings(
        db_url=url, lookup_cache_s=0, miss_queue_threshold=3, admin_token=ADMIN_SECRET, open_reads=True
    )
    app = create_app(settings, reaper=False)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not served.started and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = {
        "name": "test",
        "chip": {"name": CHIP, "kind": "cpu", "local_memory_bytes": 1 << 20},
        "backends": ["torch"],
        "software": software_fingerprint(),
    }
    httpx.post(f"{base}/v1/workers", json=worker, headers=ADMIN).raise_for_status()
    yield LiveServer(base, app)
    served.should_exit = True
    thread.join(timeout=10)
