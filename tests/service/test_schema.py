"""The API against its own OpenAPI document, fuzzed by schemathesis against a real server process.

Bounded (a fixed seed, 40 examples per operation, well under 3 minutes): no 5xx, every response
conforms to its documented schema, every status it returns is documented. The admin token
lets the fuzzer past authentication (it may create tokens and revoke any but its own).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.credentials import ADMIN
from tests.service.processes import environment, log_tail, start_server, stop

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance"
SEED = 7
EXAMPLES = 40
TIMEOUT_S = 240


def test_the_api_holds_to_its_openapi_document_under_fuzzing(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        command = [
            SCHEMATHESIS, "run", f"{server.url}/openapi.json",
            "--header", f"Authorization:{ADMIN['Authorization']}",
            "--checks", CHECKS, "--max-examples", str(EXAMPLES), "--seed", str(SEED),
            "--phases", "examples,coverage,fuzzing", "--workers", "1",
        ]  # fmt: skip
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), check=False
        )
        server_log = log_tail(server.log_path, 60)
    finally:
        stop(server.process)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:] + server_log
    assert " passed" in result.stdout
