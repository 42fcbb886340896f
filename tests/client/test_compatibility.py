"""Compatibility of the wire: requests strict, responses open to fields a newer server adds.

A "newer server" here is the real app behind a transport that adds fields to every JSON
object it answers; the client and the worker of this release must keep working against it.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from tests.credentials import ADMIN, ADMIN_TOKEN
from tiletune.client import ConfigClient, wire
from tiletune.client.api import ServiceApi
from tiletune.kernels import client_settings
from tiletune.tuner.measure.bench import BenchSettings
from tiletune.tuner.measure.worker import Worker

from .conftest import CHIP, LiveServer

ADD_CONFIG = {"tile_size": 4096, "buffer_num": 2, "pipeline_depth": 2}
QUICK = BenchSettings(warmup_runs=1, min_samples=3, max_samples=5, budget_s=0.01)


def _models() -> list[type[BaseModel]]:
    return [
        model
        for _, model in inspect.getmembers(wire, inspect.isclass)
        if issubclass(model, BaseModel)
        and model.__module__ == wire.__name__
        and not model.__name__.startswith("_")
    ]


def test_every_wire_model_is_a_request_or_a_response() -> None:
    requests = [m.__name__ for m in _models() if issubclass(m, wire._Request)]
    responses = [m.__name__ for m in _models() if issubclass(m, wire._Response)]

    assert sorted(requests + responses) == sorted(m.__name__ for m in _models())
    assert all(m.model_config.get("extra") == "forbid" for m in _models() if m.__name__ in requests)
    assert all(m.model_config.get("extra") == "ignore" for m in _models() if m.__name__ in responses)
    assert all(not name.endswith("Public") for name in requests)
    assert all(not name.endswith("Create") for name in responses)


def test_a_request_with_an_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="tirals"):
        wire.SweepCreate.model_validate({"kernel": "add", "shapes": [{"n": 64}], "tirals": 3})


def test_a_response_with_fields_it_does_not_know_parses() -> None:
    answer = {
        "kernel": "add",
        "shape": {"n": 64},
        "dtype": "float32",
        "chip": CHIP,
        "config": ADD_CONFIG,
        "match": "exact",
        "confidence": 0.93,
        "best": {
            "kernel": "add",
            "kernel_version": 1,
            "shape": {"n": 64},
            "shape_key": "n=64",
            "dtype": "float32",
            "chip": CHIP,
            "config": ADD_CONFIG,
            "median_ms": 1.0,
            "promoted_at": "2026-12-01T00:00:00Z",
            "energy_mj": 4.2,
        },
    }

    parsed = wire.LookupPublic.model_validate_json(json.dumps(answer))

    assert parsed.match == "exact"
    assert parsed.best is not None
    assert parsed.best.median_ms == 1.0


#: Fields whose values are maps of names (dims, knobs, versions, counts) or lists of them.
MAPS = {
    "shape",
    "config",
    "default_config",
    "best_config",
    "validate_configs",
    "software",
    "counts",
    "knob_values",
    "clamp_to",
    "dim_defaults",
}


def _with_new_fields(document: Any) -> Any:
    """``document`` with a field added to every JSON document in it, as a newer server might."""
    if isinstance(document, dict):
        fields = {k: v if k in MAPS else _with_new_fields(v) for k, v in document.items()}
        return {**fields, "added_by_a_newer_server": [1, "x"]}
    if isinstance(document, list):
        return [_with_new_fields(item) for item in document]
    return document


class NewerServer(httpx.BaseTransport):
    """The real server over real HTTP, its JSON answers carrying fields this release does not know."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        response.read()
        if not response.headers.get("content-type", "").startswith("application/json"):
            return response
        body = json.dumps(_with_new_fields(response.json())).encode()
        rewritten = ("content-length", "content-encoding")  # the new body is plain JSON of a new length
        headers = {k: v for k, v in response.headers.items() if k.lower() not in rewritten}
        return httpx.Response(response.status_code, headers=headers, content=body)


def test_the_client_keeps_its_answers_against_a_newer_server(server: LiveServer, tmp_path: Path) -> None:
    server.tune("add", {"n": 65536}, ADD_CONFIG)
    settings = client_settings(cache_dir=tmp_path / "cache", timeout_s=5.0, miss_flush_s=3600.0)
    with ConfigClient(
        server.url, CHIP, token=ADMIN_TOKEN, settings=settings, transport=NewerServer()
    ) as client:
        exact = client.get("add", {"n": 65536})
        assert (exact.match, dict(exact.config)) == ("exact", ADD_CONFIG)
        assert client.get("add", {"n": 131072}).match == "nearest"
        assert client.prefetch() == 1
        assert client.flush_misses()


def test_a_worker_finishes_its_job_against_a_newer_server(server: LiveServer) -> None:
    with ServiceApi(server.url, ADMIN_TOKEN) as api:
        sweep = api.submit(wire.SweepCreate(kernel="add", shapes=[{"n": 4096}], trials=3))
    worker = Worker(
        httpx.Client(base_url=server.url, transport=NewerServer(), headers=ADMIN),
        backend="cpu",
        bench=QUICK,
        name="old",
    )
    with worker:
        assert worker.run(once=True) == 1
    with ServiceApi(server.url) as api:
        assert [job.state for job in api.sweep(sweep.id).jobs] == [wire.JobState.DONE]
