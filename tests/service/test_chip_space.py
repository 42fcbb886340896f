"""The server plans a job for the chip it is for: the cores its workers report, never the server's.

Through the real app on SQLite and PostgreSQL. The native kernels' ``block_dim`` runs up to the
chip's cores (``DeviceLimits.cores``): a chip whose worker reports 64 cores gets a 64-core space
and default, one reporting 2 a 2-core one, whatever this machine's thread count.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tiletune.client.space import pow2_up_to

from .test_protocol import ask, client, lease  # noqa: F401  (client: the fixture)

#: A shape of many tiles: every block_dim up to 64 has tiles to spread over.
SHAPE = {"n": 1 << 22}


def register_cores(api: TestClient, cores: int | None, name: str = "w", chip_name: str = "") -> int:
    chip_name = chip_name or f"cpu/Test Chip/{cores}c"
    chip: dict[str, Any] = {"name": chip_name, "kind": "cpu", "local_memory_bytes": 1 << 20}
    if cores is not None:
        chip["cores"] = cores
    body = {"name": name, "chip": chip, "backends": ["native", "torch"], "software": {"torch": "2.13.0"}}
    response = api.post("/v1/workers", json=body)
    assert response.status_code == 201, response.text
    worker_id: int = response.json()["id"]
    return worker_id


def asked_block_dims(api: TestClient, worker: int) -> list[int]:
    """The ``block_dim`` of the configs the job's search asks first (its default first)."""
    body = {"kernel": "native_add", "shapes": [SHAPE], "dtypes": ["float32"], "trials": 40, "seed": 1}
    response = api.post("/v1/sweeps", json=body)
    assert response.status_code == 201, response.text
    leased = lease(api, worker)
    assert leased is not None
    tasks = ask(api, leased["token"], 40)["tasks"]
    assert tasks
    return [task["config"]["block_dim"] for task in tasks]


@pytest.mark.parametrize("cores", [64, 2, 6])
def test_a_job_is_planned_with_the_cores_its_chip_reports(client: TestClient, cores: int) -> None:  # noqa: F811
    worker = register_cores(client, cores)
    block_dims = asked_block_dims(client, worker)
    assert block_dims[0] == cores  # the default spreads the tiles over every core of the chip
    assert set(block_dims) <= set(pow2_up_to(cores))
    assert len(set(block_dims)) > 1

    chip = f"cpu/Test Chip/{cores}c"
    params = {"chip": chip, "dtype": "float32", "shape": f"n={SHAPE['n']}", "match": "default"}
    answer = client.get("/v1/configs/native_add", params=params).json()
    assert answer["config"]["block_dim"] == cores
    assert answer["knob_values"]["block_dim"] == list(pow2_up_to(cores))
    bundle = client.get("/v1/configs", params={"chip": chip, "kernel": "native_add"}).json()
    assert bundle["kernels"][0]["knob_values"]["block_dim"] == list(pow2_up_to(cores))


def test_cores_a_chip_had_not_reported_are_recorded_and_kept(client: TestClient) -> None:  # noqa: F811
    """A worker that reports no cores (an older one) changes nothing; the first that reports them
    records them for the chip, even with a worker token (no limit of the chip changes)."""
    chip = "cpu/Test Chip/upgraded"
    register_cores(client, None, name="old", chip_name=chip)
    register_cores(client, 64, name="new", chip_name=chip)
    older = register_cores(client, None, name="older", chip_name=chip)
    assert asked_block_dims(client, older)[0] == 64


def test_a_chip_may_not_report_a_count_of_cores_out_of_bounds(client: TestClient) -> None:  # noqa: F811
    for cores in (0, -1, 1 << 17, "8", True):
        chip = {"name": "cpu/Odd/8c", "kind": "cpu", "local_memory_bytes": 1 << 20, "cores": cores}
        body = {"name": "w", "chip": chip, "backends": ["native"], "software": {"torch": "2.13.0"}}
        response = client.post("/v1/workers", json=body)
        assert response.status_code == 422, response.text
        assert "cores" in response.text
