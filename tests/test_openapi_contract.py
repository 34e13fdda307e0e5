"""/v1/openapi.json against a real instance: schemathesis finds no 5xx and no answer the document does not describe.

Schemathesis reads the document the instance serves, generates valid and invalid requests for
every operation (an acme API key on each), and checks every answer: no server error, a status,
content type, headers and body the document lists, invalid input refused with a 4xx, and a call
without the key refused. Its stateful phase chains calls (create a channel, then add a member to it)
through the links it infers. Bounded: deterministic generation and a few examples per operation,
about ten seconds. `positive_data_acceptance` is left out: a well-formed but unknown channel id is a
404, as the contract says.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import Tenant, http

pytestmark = [pytest.mark.live, pytest.mark.heavy]

# Per operation and phase; with the coverage and stateful phases, about 700 test cases.
MAX_EXAMPLES = 25
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
    "response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method,ignored_auth"
)


def schemathesis(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )


def test_every_operation_answers_as_its_document_says(live_instances, acme: Tenant, tmp_path):
    (instance,) = live_instances(1)
    status, document = http("GET", f"{instance.http_url}/v1/openapi.json")
    assert status == 200
    assert document["openapi"] == "3.1.0"
    assert "/v1/channels/{channel_id}/members/{user_id}" in document["paths"]

    run = schemathesis(
        "run",
        f"{instance.http_url}/v1/openapi.json",
        "--url",
        instance.http_url,
        "--header",
        f"Authorization: Bearer {acme.api_key}",
        "--checks",
        CHECKS,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--workers",
        "1",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(tmp_path / "events.ndjson"),
        cwd=tmp_path,
    )

    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    # Every operation was exercised (schemathesis leaves out the document it was given).
    documented = {f"{method.upper()} {path}" for path, methods in document["paths"].items() for method in methods}
    tested = set(re.findall(r'"label":\s*"([A-Z]+ /[^"]*)"', (tmp_path / "events.ndjson").read_text()))
    assert tested == documented - {"GET /v1/openapi.json"}
