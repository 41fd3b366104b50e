"""Schemathesis against a live console: every operation of ``/api/v1/openapi.json``,
``--checks all`` (server errors, undocumented statuses, content types, headers, response
schemas, valid data refused, invalid data accepted, auth, links), at a bounded size.

A failure prints Schemathesis's report: each failing request with a curl line to replay.
``SCHEMATHESIS_MAX_EXAMPLES`` and ``SCHEMATHESIS_SEED`` widen or vary a run locally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from approvals.access import reviewer_tokens
from approvals.access.runtime_keys import runtime_key_create
from approvals.access.tenancy import tenant_create
from approvals.models import Membership
from tests.conftest import make_user

pytestmark = pytest.mark.slow  # a live server and the schemathesis CLI, for a minute and more

ROOT = Path(__file__).resolve().parents[2]
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")

# Per operation: enough for each phase (examples, coverage, fuzzing, stateful) to reach
# every status the schema lists, and a run of about a minute on two cores.
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "15"))
SEED = os.environ.get("SCHEMATHESIS_SEED", "20261201")

# The operations whose requests are valid only for data the schema cannot list: for the
# audit ingest, an `occurrence_id` of the tenant; for the callback, a host that is not
# private. For them a schema-valid request may be refused with 422 (their descriptions say
# when); every other check still holds. A proposal and a canonicalization are not among
# them: their bodies are `oneOf` the tool contracts (approvals.api.contract_openapi), so a
# schema-valid one is accepted.
CONTRACT_BOUND = (
    "approvals_api_audit_ingest",
    "approvals_api_callback_put",
)

CONFIG = """
[auth.openapi.RuntimeKeyAuth]
bearer = "{runtime_key}"

[auth.openapi.ReviewerTokenAuth]
bearer = "{reviewer_token}"
{contract_bound}
"""

OPERATION = """
[[operations]]
include-operation-id = "{operation_id}"
checks.positive_data_acceptance.expected-statuses = {statuses}
"""
# The default (2xx, 3xx, 401, 403, 404, 409, 429, 5xx) without 3xx and 5xx, with 422.
CONTRACT_BOUND_STATUSES = ["2xx", "401", "403", "404", "409", "422", "429"]


@pytest.fixture
def unlimited_requests(settings: Any) -> None:
    # Schemathesis sends thousands of requests with one key; the budget is tested elsewhere.
    settings.API_RATE_LIMIT = 10**9
    settings.API_AUDITED_REFUSALS_PER_WINDOW = 10**9


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_nothing_wrong(
    live_server: Any, unlimited_requests: None, tmp_path: Path
) -> None:
    tenant = tenant_create(slug="acme", name="Acme")
    _, runtime_key = runtime_key_create(tenant=tenant, name="schemathesis")
    reviewer = make_user("rita", tenant, Membership.Role.REVIEWER)
    _, reviewer_token = reviewer_tokens.reviewer_token_issue(
        user=reviewer, tenant=tenant, name="schemathesis", lifetime_days=7
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        CONFIG.format(
            runtime_key=runtime_key,
            reviewer_token=reviewer_token,
            contract_bound="".join(
                OPERATION.format(operation_id=o, statuses=json.dumps(CONTRACT_BOUND_STATUSES))
                for o in CONTRACT_BOUND
            ),
        )
    )

    result = subprocess.run(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "run",
            f"{live_server.url}/api/v1/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            SEED,
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )

    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-20_000:]
    # Every operation was exercised, none skipped for want of a serializer or auth.
    assert "Tested: " in report, report[-5_000:]
