"""A sweep with ``with_backward`` queues each forward key's backward keys beside it.

The real app on SQLite and PostgreSQL: ``softmax``, ``rms_norm`` and ``fused_attention`` bring their
backward kernels at the same shape; ``matmul`` brings two matmul keys on the transposed shapes
(``da = g @ b^T``, ``db = a^T @ g``); ``add`` brings none. A key already in the sweep is not queued
twice, the job limit counts the backward jobs, and a sweep without the flag is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tiletune.kernels.declarations import all_declarations
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

ATTENTION = {"batch": 1, "heads": 4, "kv_heads": 2, "seq_q": 64, "seq_kv": 64, "head_dim": 16, "causal": 1}


@pytest.fixture
def app(database_url: str) -> Iterator[TestClient]:
    upgrade(database_url)
    settings = Settings(db_url=database_url, admin_token=ADMIN_SECRET, max_jobs_per_sweep=6)
    with TestClient(create_app(settings, reaper=False), headers=ADMIN) as client:
        yield client


def submitted_keys(app: TestClient, document: dict[str, Any]) -> list[tuple[str, str]]:
    response = app.post("/v1/sweeps", json=document)
    assert response.status_code == 201, response.text
    return sorted((job["kernel"], job["shape_key"]) for job in response.json()["jobs"])


def test_each_kernel_brings_its_backward_keys(app: TestClient) -> None:
    keys = submitted_keys(
        app,
        {
            "kernels": [
                {"kernel": "softmax", "shapes": [{"rows": 8, "cols": 96}]},
                {"kernel": "fused_attention", "shapes": [ATTENTION]},
                {"kernel": "add", "shapes": [{"n": 100}]},
            ],
            "with_backward": True,
        },
    )
    attention_key = "batch=1,heads=4,kv_heads=2,seq_q=64,seq_kv=64,head_dim=16,causal=1,mask=0"
    assert keys == sorted(
        [
            ("softmax", "rows=8,cols=96"),
            ("softmax_backward", "rows=8,cols=96"),
            ("fused_attention", attention_key),
            ("fused_attention_backward", attention_key),
            ("add", "n=100"),
        ]
    )


def test_matmul_brings_its_two_transposed_matmuls_once_each(app: TestClient) -> None:
    first, second = {"m": 32, "n": 48, "k": 16}, {"m": 32, "n": 16, "k": 48, "b_transposed": 1}
    keys = submitted_keys(app, {"kernel": "matmul", "shapes": [first, second], "with_backward": True})
    # first's da = g @ b^T is the second shape, and the second's da is the first: each queued once.
    assert keys == sorted(
        [
            ("matmul", "m=32,n=48,k=16,a_transposed=0,b_transposed=0"),
            ("matmul", "m=32,n=16,k=48,a_transposed=0,b_transposed=1"),
            ("matmul", "m=16,n=48,k=32,a_transposed=1,b_transposed=0"),  # first's db = a^T @ g
            ("matmul", "m=48,n=16,k=32,a_transposed=1,b_transposed=0"),  # second's db
        ]
    )


def test_the_job_limit_counts_the_backward_jobs_and_nothing_is_written(app: TestClient) -> None:
    shapes = [{"rows": 4, "cols": 32 + index} for index in range(4)]  # 4 jobs, 8 with their backwards
    refused = app.post("/v1/sweeps", json={"kernel": "rms_norm", "shapes": shapes, "with_backward": True})
    assert refused.status_code == 422, refused.text
    assert "8 jobs" in refused.text
    assert app.get("/v1/jobs").json() == []
    plain = submitted_keys(app, {"kernel": "rms_norm", "shapes": shapes})
    assert {kernel for kernel, _ in plain} == {"rms_norm"}


def test_every_declared_backward_key_is_a_kernel_of_its_own_with_none_of_its_own() -> None:
    declared = all_declarations()
    for declaration in declared.values():
        dims = {dim.name: 1 if dim.choices is None else dim.choices[-1] for dim in declaration.dims}
        shape = declaration.parse_shape(dims)
        for name, key in declaration.backward_keys(shape):
            backward = declared[name]
            assert backward.parse_shape(key) == key, (declaration.name, name)
            assert name == declaration.name or backward.backward_keys(key) == [], name
    assert declared["softmax"].backward_kernel == "softmax_backward"
    assert declared["native_fused_attention"].backward_kernel == "native_fused_attention_backward"
    assert declared["add"].backward_keys({"n": 8}) == []
