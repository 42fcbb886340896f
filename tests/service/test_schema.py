"""The API against its own OpenAPI document, fuzzed by schemathesis against a real server process
with every role: an admin, a submitter, a worker and a reader token, and no token (reads closed).

Bounded: a fixed seed, :data:`EXAMPLES` per operation and role (the coverage phase adds its own
boundary cases: about 2,300 requests a role, 30 to 40 s each on 2 busy cores, about 3 minutes
in all). Every run must find no 5xx, every response must conform to its documented schema,
status, media type and headers, and every 405 must name the path's methods in ``Allow``. The
admin may create tokens and revoke any but its own.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.credentials import ADMIN, ADMIN_SECRET
from tests.service.processes import environment, log_tail, start_server, stop
from tiletune.service.app import create_app
from tiletune.service.migrate import upgrade
from tiletune.service.settings import Settings

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "allow_header_conformance",
    )
)
SEED = 7
#: Examples per operation for each role (the admin reaches the most code).
EXAMPLES = {"admin": 10, "submitter": 5, "worker": 5, "reader": 5, "no token": 5}
TIMEOUT_S = 240


def _fuzz(url: str, authorization: str | None, examples: int) -> subprocess.CompletedProcess[str]:
    command = [
        SCHEMATHESIS, "run", f"{url}/openapi.json",
        "--checks", CHECKS, "--max-examples", str(examples), "--seed", str(SEED),
        "--phases", "examples,coverage,fuzzing", "--workers", "1",
    ]  # fmt: skip
    if authorization is not None:
        command += ["--header", f"Authorization:{authorization}"]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), check=False
    )


def test_the_api_holds_to_its_openapi_document_under_fuzzing_with_every_role(tmp_path: Path) -> None:
    server = start_server(tmp_path, env={"TILETUNE_OPEN_READS": "false"})
    try:
        authorizations: dict[str, str | None] = {"admin": ADMIN["Authorization"], "no token": None}
        with httpx.Client(base_url=server.url, headers=ADMIN) as http:
            for role in ("submitter", "worker", "reader"):
                made = http.post("/v1/tokens", json={"role": role, "name": f"fuzzed {role}"})
                authorizations[role] = f"Bearer {made.json()['token']}"
        failures = []
        for role, authorization in authorizations.items():
            result = _fuzz(server.url, authorization, EXAMPLES[role])
            if result.returncode != 0 or " passed" not in result.stdout:
                failures.append(f"--- {role}:\n{result.stdout[-6000:]}{result.stderr[-2000:]}")
        server_log = log_tail(server.log_path, 60)
    finally:
        stop(server.process)
    assert not failures, "\n".join(failures) + server_log


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    with TestClient(create_app(Settings(db_url=url, admin_token=ADMIN_SECRET), reaper=False)) as client:
        yield client


def test_a_405_names_every_method_of_its_path_with_the_error_body(app: TestClient) -> None:
    for path, allowed in (
        ("/v1/sweeps", "GET, POST"),
        ("/v1/tokens", "GET, POST"),
        ("/v1/configs/import", "POST"),  # not the GET of /v1/configs/{kernel}, which also matches
        ("/v1/jobs/7", "GET"),
        ("/metrics", "GET"),
    ):
        refused = app.request("DELETE", path, headers=ADMIN)
        assert refused.status_code == 405, path
        assert refused.headers["allow"] == allowed, path
        assert refused.json() == {
            "code": "method_not_allowed",
            "message": "Method Not Allowed",
            "field": None,
        }


def test_every_error_answer_is_documented_as_a_json_error_body(app: TestClient) -> None:
    document = app.get("/openapi.json").json()
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert answer["content"] == error_body, (method, path, status)
            assert "Allow" in operation["responses"]["405"]["headers"], (method, path)
    unauthorized = app.get("/metrics", headers={"Authorization": "Bearer tt_unknown"})
    assert unauthorized.status_code == 401
    assert unauthorized.headers["content-type"] == "application/json"
    assert unauthorized.json()["code"] == "unauthorized"
