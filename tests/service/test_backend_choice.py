"""Which backend a job runs: chosen at its first lease from what the leasing worker offers, on
SQLite and PostgreSQL through the real app (the test plays the workers).

A sweep that names no backend makes jobs that show ``*`` until leased; the first lease picks the
worker's preferred implementation of the kernel (``native`` on a CPU that offers it, else the
kernel's first) and the job keeps it. A job naming a backend is leased only to a worker offering
it. A worker that reports no backends per kernel (an older one) runs ``torch``.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from .test_protocol import CHIP, client, lease, submit  # noqa: F401  (client: the fixture)

GPU = {"name": "cuda/Test GPU", "kind": "cuda", "local_memory_bytes": 48 << 10}


def register(
    api: TestClient,
    name: str,
    backends: list[str],
    kernel_backends: dict[str, list[str]] | None = None,
    chip: dict[str, Any] | None = None,
) -> int:
    body: dict[str, Any] = {"name": name, "chip": chip or CHIP, "backends": backends}
    if kernel_backends is not None:
        body["kernel_backends"] = kernel_backends
    response = api.post("/v1/workers", json=body)
    assert response.status_code == 201, response.text
    worker_id: int = response.json()["id"]
    return worker_id


def job(api: TestClient, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
    return found


def test_a_job_naming_no_backend_runs_native_on_a_cpu_worker_that_offers_it(
    client: TestClient,  # noqa: F811
) -> None:
    sweep = submit(client)
    job_id = sweep["jobs"][0]["id"]
    assert sweep["jobs"][0]["backend"] == "*"
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["jobs"][0]["backend"] == "*"
    worker = register(client, "cpu", ["native", "torch"], {"add": ["torch", "native"]})
    leased = lease(client, worker)
    assert leased is not None
    assert (leased["job"]["id"], leased["job"]["backend"]) == (job_id, "native")
    assert job(client, job_id)["backend"] == "native"


def test_an_older_worker_reporting_no_backends_per_kernel_runs_torch(client: TestClient) -> None:  # noqa: F811
    job_id = submit(client)["jobs"][0]["id"]
    worker = register(client, "old", ["native", "torch"])
    leased = lease(client, worker)
    assert leased is not None
    assert leased["job"]["backend"] == "torch"
    assert job(client, job_id)["backend"] == "torch"


def test_a_worker_off_cpu_runs_the_kernels_first_backend(client: TestClient) -> None:  # noqa: F811
    submit(client, chips=[GPU["name"]])
    worker = register(client, "gpu", ["torch", "native"], {"add": ["torch", "native"]}, chip=GPU)
    leased = lease(client, worker)
    assert leased is not None
    assert leased["job"]["backend"] == "torch"


def test_a_job_naming_native_is_leased_only_to_a_worker_offering_it(client: TestClient) -> None:  # noqa: F811
    job_id = submit(client, backend="native")["jobs"][0]["id"]
    assert job(client, job_id)["backend"] == "native"
    without = register(client, "portable", ["torch"], {"add": ["torch"]})
    older = register(client, "old", ["torch"])
    elsewhere = register(client, "other-kernel", ["native", "torch"], {"softmax": ["torch", "native"]})
    assert lease(client, without) is None
    assert lease(client, older) is None
    assert lease(client, elsewhere) is None
    assert job(client, job_id)["state"] == "queued"
    native = register(client, "native", ["native", "torch"], {"add": ["torch", "native"]})
    leased = lease(client, native)
    assert leased is not None
    assert (leased["job"]["id"], leased["job"]["backend"]) == (job_id, "native")


def test_a_job_keeps_the_backend_its_first_lease_chose(client: TestClient) -> None:  # noqa: F811
    job_id = submit(client, workers_per_job=3)["jobs"][0]["id"]
    first = register(client, "native", ["native", "torch"], {"add": ["torch", "native"]})
    assert lease(client, first) is not None
    without = register(client, "portable", ["torch"], {"add": ["torch"]})
    assert lease(client, without) is None, "the job runs native now: a worker without it passes it by"
    second = register(client, "native-2", ["native", "torch"], {"add": ["native", "torch"]})
    leased = lease(client, second)
    assert leased is not None
    assert (leased["job"]["id"], leased["job"]["backend"]) == (job_id, "native")


def test_a_sweep_may_name_any_backend_its_kernels_declare_and_no_other(client: TestClient) -> None:  # noqa: F811
    for kernel, backend in [("add", "torch"), ("add", "native"), ("triton_add", "triton")]:
        body = {"kernel": kernel, "shapes": [{"n": 4096}], "backend": backend}
        assert client.post("/v1/sweeps", json=body).status_code == 201, (kernel, backend)
    refused = client.post("/v1/sweeps", json={"kernel": "add", "shapes": [{"n": 4096}], "backend": "triton"})
    assert refused.status_code == 422
    assert refused.json()["field"] == "backend"
    assert "'torch', 'native'" in refused.json()["message"]


def test_a_worker_may_not_report_a_kernel_without_backends(client: TestClient) -> None:  # noqa: F811
    body = {"name": "w", "chip": CHIP, "backends": ["torch"], "kernel_backends": {"add": []}}
    response = client.post("/v1/workers", json=body)
    assert response.status_code == 422, response.text
    assert "kernel_backends" in response.text
