"""The payments adapter: refunds through a payments API that dedupes by ``Idempotency-Key``
and can be asked whether a refund exists for a key (the contract is ``effect_queryable``).

The API (the demo's sandbox, ``demo.sandbox``, speaks it) documents these answers as
refused before execution: 400, 402, 409, 422 (for good) and 429, 503 (for now).
"""

from __future__ import annotations

from typing import Any

import httpx

from reconciliation.adapters.base import (
    Call,
    Committed,
    Interrupted,
    NotFound,
    QueryResult,
    Rejected,
    Result,
    Unknown,
    challenges_of,
    http_client,
    transport_failure,
)

_REFUSED = {400, 402, 409, 422}
_REFUSED_FOR_NOW = {429, 503}


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{response.status_code} {error.get('code', '')}: {error.get('message', '')}"
    except (ValueError, AttributeError):
        return f"{response.status_code} {response.reason_phrase}"


class PaymentsAdapter:
    name = "payments"
    can_query = True
    can_compensate = True

    def __init__(self, *, base_url: str, api_key: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key

    def _headers(self, call: Call) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.api_key}",
            "Idempotency-Key": call.idempotency_key,
        }

    def _classify(self, response: httpx.Response) -> Result:
        if response.status_code in (200, 201):
            body: dict[str, Any] = response.json()
            return Committed(receipt=str(body.get("id", "")), detail=str(body.get("status", "")))
        if response.status_code == 401:
            return Interrupted(challenges_of(response), _error_text(response))
        if response.status_code in _REFUSED:
            return Rejected(_error_text(response))
        if response.status_code in _REFUSED_FOR_NOW:
            return Rejected(_error_text(response), retryable=True)
        return Unknown(f"unexpected answer {_error_text(response)}")

    def execute(self, call: Call) -> Result:
        args = call.arguments
        body = {
            "payment_id": args["payment_id"],
            "amount_minor": args["amount_minor"],
            "currency": args["currency"],
            "reason": args.get("reason", ""),
        }
        try:
            response = http_client().post(
                f"{self.base_url}/v1/refunds", json=body, headers=self._headers(call)
            )
        except httpx.HTTPError as exc:
            return transport_failure(exc)
        return self._classify(response)

    def query_effect(self, call: Call) -> QueryResult:
        try:
            response = http_client().get(
                f"{self.base_url}/v1/refunds",
                params={"idempotency_key": call.idempotency_key},
                headers=self._headers(call),
            )
        except httpx.HTTPError as exc:
            return Unknown(f"the effect query failed: {type(exc).__name__}: {exc}")
        if response.status_code == 404:
            return NotFound(f"no refund under {call.idempotency_key}")
        result = self._classify(response)
        if isinstance(result, Rejected):
            return Unknown(f"the effect query was refused: {result.reason}")
        return result

    def compensate(self, call: Call, receipt: str) -> Result:
        try:
            response = http_client().post(
                f"{self.base_url}/v1/refunds/{receipt}/reversal", headers=self._headers(call)
            )
        except httpx.HTTPError as exc:
            return transport_failure(exc)
        if response.status_code in (200, 201):
            body: dict[str, Any] = response.json()
            return Committed(receipt=str(body.get("reversal_id", "")), detail="reversed")
        return self._classify(response)
