from __future__ import annotations

from tests.conftest import Runtime


def test_propose_approve_pickup_claim_then_replay(
    runtime: Runtime, approved: str, token: str
) -> None:
    first = runtime.claim(token, "exec-a")
    second = runtime.claim(token, "exec-b")
    assert first.status_code == 200
    assert first.json()["decision"] == "approved"
    assert second.status_code == 403
    assert {k: second.json()[k] for k in ("decision", "reason")} == {
        "decision": "replayed",
        "reason": "consumed_by_other_execution",
    }
    assert second.json()["error"]["code"] == "replayed"
