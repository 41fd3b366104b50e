"""POST /api/v1/audit/events: other producers' events in NDJSON batches, each producer
event stored once, every later delivery of it recorded as a duplicate delivery."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from approvals.audit.export import audit_duplicate_deliveries
from approvals.models import AuditDuplicateDelivery, AuditEvent, AuditIngestion, Tenant
from tests.approvals.test_api import error_of, ndjson
from tests.conftest import Runtime

PATH = "/api/v1/audit/events"


def producer_event(**fields: Any) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "kind": "approval_decision",
        "fingerprint": "0123456789abcdef",
        "decision": "approved",
        "execution_id": "exec-1",
        "message_id": "msg-1",
        "command_id": str(uuid.uuid4()),
        "source_time": "2024-05-01T10:20:30.123456Z",
        **fields,
    }


def body_of(*lines: Any) -> bytes:
    return b"".join(
        (line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines
    )


def post(runtime: Runtime, body: bytes, content_type: str = "application/x-ndjson") -> Any:
    return runtime.client.post(PATH, body, content_type=content_type)


# --- batches ---------------------------------------------------------------------------


def test_a_batch_is_stored_and_counted(runtime: Runtime) -> None:
    first, second = producer_event(), producer_event(decision="replayed", command_id=None)

    response = post(runtime, body_of(first, second))

    assert response.status_code == 200, response.content
    answer = response.json()
    ingestion = AuditIngestion.objects.get()
    assert answer == {"received": 2, "new": 2, "duplicates": 0, "ingestion_id": ingestion.pk}
    events = list(AuditEvent.objects.order_by("id"))
    assert [str(e.event_id) for e in events] == [first["event_id"], second["event_id"]]
    stored = events[0]
    assert stored.tenant == runtime.key.tenant
    assert stored.ingestion == ingestion
    assert stored.kind == "approval_decision"
    assert stored.token_fingerprint == "0123456789abcdef"
    assert stored.decision == "approved"
    assert stored.execution_id == "exec-1"
    assert stored.message_id == "msg-1"
    assert str(stored.command_id) == first["command_id"]
    assert stored.source_time == datetime(2024, 5, 1, 10, 20, 30, 123456, tzinfo=UTC)
    assert events[1].command_id is None
    assert ingestion.runtime_key == runtime.key
    assert (ingestion.received, ingestion.new, ingestion.duplicates) == (2, 2, 0)


def test_optional_fields_and_an_occurrence_of_the_tenant(runtime: Runtime) -> None:
    occurrence_id = runtime.propose().json()["occurrence_id"]
    line = producer_event(reason_code="consumed_by_other_execution", occurrence_id=occurrence_id)

    response = post(runtime, body_of(line))

    assert response.status_code == 200, response.content
    stored = AuditEvent.objects.get(event_id=line["event_id"])
    assert str(stored.occurrence_id) == occurrence_id
    assert stored.reason_code == "consumed_by_other_execution"


def test_the_same_producer_event_twice_in_one_batch_is_stored_once(runtime: Runtime) -> None:
    event = producer_event()
    other = producer_event()

    response = post(runtime, body_of(event, other, event))

    assert response.json()["received"] == 3
    assert response.json()["new"] == 2
    assert response.json()["duplicates"] == 1
    assert AuditEvent.objects.filter(event_id=event["event_id"]).count() == 1
    duplicate = AuditDuplicateDelivery.objects.get()
    assert duplicate.line == 3
    assert duplicate.original == AuditEvent.objects.get(event_id=event["event_id"])
    assert duplicate.ingestion_id == response.json()["ingestion_id"]
    assert duplicate.same_payload


def test_a_redelivery_in_a_later_batch_is_a_duplicate_with_its_ingestion_and_time(
    runtime: Runtime,
) -> None:
    event = producer_event()
    first = post(runtime, body_of(event)).json()

    second = post(runtime, body_of(producer_event(), event)).json()
    third = post(runtime, body_of(event)).json()

    assert second["new"] == 1 and second["duplicates"] == 1
    assert third == {
        "received": 1,
        "new": 0,
        "duplicates": 1,
        "ingestion_id": third["ingestion_id"],
    }
    assert len({first["ingestion_id"], second["ingestion_id"], third["ingestion_id"]}) == 3
    stored = AuditEvent.objects.get(event_id=event["event_id"])
    assert stored.ingestion_id == first["ingestion_id"]
    deliveries = list(audit_duplicate_deliveries(runtime.key.tenant, event["event_id"]))
    assert [d.ingestion_id for d in deliveries] == [second["ingestion_id"], third["ingestion_id"]]
    assert [d.line for d in deliveries] == [2, 1]
    assert all(d.original == stored for d in deliveries)
    assert all(d.ingestion.received_at >= stored.ingested_at for d in deliveries)
    # Said what the stored event says: the stored event is its content, nothing kept twice.
    assert deliveries[0].payload is None and deliveries[0].same_payload


def test_a_redelivery_that_says_something_else_is_marked(runtime: Runtime) -> None:
    event = producer_event()
    post(runtime, body_of(event))

    post(runtime, body_of({**event, "decision": "replayed"}))

    duplicate = AuditDuplicateDelivery.objects.get()
    assert not duplicate.same_payload
    assert duplicate.payload is not None and duplicate.payload["decision"] == "replayed"
    assert AuditEvent.objects.get().decision == "approved"


def test_an_offset_in_the_source_time_is_the_same_instant(runtime: Runtime) -> None:
    event = producer_event(source_time="2024-05-01T12:20:30.123456+02:00")
    post(runtime, body_of(event))

    post(runtime, body_of({**event, "source_time": "2024-05-01T10:20:30.123456Z"}))

    assert AuditDuplicateDelivery.objects.get().same_payload


def test_duplicates_are_per_tenant(runtime: Runtime, other_runtime: Runtime) -> None:
    event = producer_event()

    mine = post(runtime, body_of(event)).json()
    theirs = post(other_runtime, body_of(event)).json()

    assert mine["new"] == theirs["new"] == 1
    assert AuditEvent.objects.filter(event_id=event["event_id"]).count() == 2
    assert not audit_duplicate_deliveries(other_runtime.key.tenant).exists()


def test_the_duplicate_selector_lists_a_tenants_duplicates(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    a, b = producer_event(), producer_event()
    post(runtime, body_of(a, b, a, b, a))
    post(other_runtime, body_of(a, a))

    mine = audit_duplicate_deliveries(runtime.key.tenant)

    # One row per event and batch: its first line there, and how many lines carried it.
    assert [(str(d.event_id), d.line, d.copies) for d in mine] == [
        (a["event_id"], 3, 2),
        (b["event_id"], 4, 1),
    ]
    assert audit_duplicate_deliveries(runtime.key.tenant, uuid.uuid4()).count() == 0


def test_an_event_the_console_wrote_itself_is_not_stored_again(runtime: Runtime) -> None:
    runtime.propose()
    own = AuditEvent.objects.get()

    answer = post(runtime, body_of(producer_event(event_id=str(own.event_id)))).json()

    assert answer["duplicates"] == 1
    assert AuditEvent.objects.count() == 1
    assert AuditDuplicateDelivery.objects.get().original == own


def test_ingested_events_are_exported_and_chained(runtime: Runtime) -> None:
    event = producer_event()
    ingestion_id = post(runtime, body_of(event, event)).json()["ingestion_id"]

    [line] = ndjson(runtime.get(PATH))

    assert line["event_id"] == event["event_id"]
    assert line["ingestion_id"] == ingestion_id
    assert line["chain_seq"] == 1
    assert line["source_time"] == "2024-05-01T10:20:30.123456+00:00"


def test_a_batch_larger_than_the_apis_other_bodies_is_accepted(runtime: Runtime) -> None:
    lines = [producer_event(execution_id="x" * 200) for _ in range(400)]
    body = body_of(*lines)
    assert 64 * 1024 < len(body) < 1024 * 1024

    response = post(runtime, body)

    assert response.status_code == 200, response.content
    assert response.json()["new"] == 400


def test_crlf_lines_and_blank_lines_are_read(runtime: Runtime) -> None:
    a, b = producer_event(), producer_event()
    body = json.dumps(a).encode() + b"\r\n\r\n" + json.dumps(b).encode()

    response = post(runtime, body)

    assert response.json()["new"] == 2


# --- refusals: nothing of the batch is written --------------------------------------------


def _refused(runtime: Runtime, body: bytes, status: int = 422) -> dict[str, Any]:
    response = post(runtime, body)
    assert response.status_code == status, response.content
    assert not AuditEvent.objects.exists()
    assert not AuditIngestion.objects.exists()
    assert not AuditDuplicateDelivery.objects.exists()
    return error_of(response)


@pytest.mark.parametrize(
    ("bad", "field", "code"),
    [
        (b"{not json", "line", "invalid_json"),
        (b"[1, 2]", "line", "wrong_type"),
        (b'{"event_id": "a", "event_id": "b"}', "event_id", "duplicate_key"),
        (json.dumps({**producer_event(), "extra": 1}).encode(), "extra", "unknown_field"),
        (
            json.dumps({k: v for k, v in producer_event().items() if k != "kind"}).encode(),
            "kind",
            "missing_field",
        ),
        (json.dumps(producer_event(event_id=None)).encode(), "event_id", "missing_field"),
        (json.dumps(producer_event(event_id="not-a-uuid")).encode(), "event_id", "invalid_uuid"),
        (json.dumps(producer_event(command_id="12")).encode(), "command_id", "invalid_uuid"),
        (json.dumps(producer_event(kind="has space")).encode(), "kind", "invalid_kind"),
        (json.dumps(producer_event(kind=7)).encode(), "kind", "wrong_type"),
        (
            json.dumps(producer_event(source_time="yesterday")).encode(),
            "source_time",
            "invalid_time",
        ),
        (
            json.dumps(producer_event(source_time="2024-05-01T10:20:30")).encode(),
            "source_time",
            "invalid_time",
        ),
        (json.dumps(producer_event(execution_id="x" * 201)).encode(), "execution_id", "too_long"),
        (
            json.dumps(producer_event(fingerprint="0123456789abcdef0")).encode(),
            "fingerprint",
            "too_long",
        ),
        (json.dumps(producer_event(decision={"a": 1})).encode(), "decision", "wrong_type"),
        (b'{"kind": NaN}', "kind", "non_finite_number"),
        (b"\xff\xfe", "line", "invalid_encoding"),
        (
            json.dumps(producer_event(execution_id="run apv_" + "A" * 43)).encode(),
            "execution_id",
            "raw_token",
        ),
        (
            json.dumps(producer_event(message_id="rk_" + "b" * 43)).encode(),
            "message_id",
            "raw_token",
        ),
    ],
)
def test_a_bad_line_refuses_the_batch_naming_its_line(
    runtime: Runtime, bad: bytes, field: str, code: str
) -> None:
    body = body_of(producer_event(), producer_event(), bad, producer_event())

    error = _refused(runtime, body)

    assert error["code"] == code
    assert error["message"].startswith("line 3: ")
    assert error["details"] == [
        {"line": 3, "field": field, "code": code, "message": error["details"][0]["message"]}
    ]


def test_every_bad_line_is_named(runtime: Runtime) -> None:
    body = body_of(b"{", producer_event(), producer_event(kind=""), b"[]")

    error = _refused(runtime, body)

    assert [(d["line"], d["field"], d["code"]) for d in error["details"]] == [
        (1, "line", "invalid_json"),
        (3, "kind", "missing_field"),
        (4, "line", "wrong_type"),
    ]


def test_an_occurrence_of_another_tenant_refuses_the_batch(
    runtime: Runtime, other_runtime: Runtime
) -> None:
    theirs = other_runtime.propose().json()["occurrence_id"]
    body = body_of(producer_event(), producer_event(occurrence_id=theirs))

    response = post(runtime, body)

    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "unknown_occurrence"
    assert error["details"][0]["line"] == 2
    assert error["details"][0]["field"] == "occurrence_id"
    assert not AuditEvent.objects.filter(tenant=runtime.key.tenant).exists()
    assert not AuditIngestion.objects.exists()


def test_a_refused_batch_leaves_earlier_events_and_counts_alone(runtime: Runtime) -> None:
    event = producer_event()
    post(runtime, body_of(event))

    response = post(runtime, body_of(event, b"{"))

    assert response.status_code == 422
    assert AuditIngestion.objects.count() == 1
    assert not AuditDuplicateDelivery.objects.exists()


def test_a_body_over_one_mib_is_413(runtime: Runtime) -> None:
    line = json.dumps(producer_event(execution_id="x" * 200)).encode()
    body = body_of(*[line] * (1024 * 1024 // len(line) + 1))

    error = _refused(runtime, body, 413)

    assert error["code"] == "payload_too_large"


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "text/plain", "application/x-ndjson; charset=latin-1"],
)
def test_another_content_type_is_415(runtime: Runtime, content_type: str) -> None:
    response = post(runtime, body_of(producer_event()), content_type)

    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"
    assert not AuditEvent.objects.exists()


def test_charset_utf8_is_accepted(runtime: Runtime) -> None:
    response = post(runtime, body_of(producer_event()), "application/x-ndjson; charset=utf-8")

    assert response.status_code == 200


@pytest.mark.parametrize("body", [b"", b"\n\n  \n"])
def test_an_empty_batch_is_400(runtime: Runtime, body: bytes) -> None:
    error = _refused(runtime, body, 400)

    assert error["code"] == "empty_body"


@pytest.mark.parametrize("authorization", [None, "Bearer rk_not-a-real-key"])
def test_ingestion_needs_a_runtime_key(tenant: Tenant, authorization: str | None) -> None:
    extra: dict[str, Any] = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}

    response = Client().post(
        PATH, body_of(producer_event()), content_type="application/x-ndjson", **extra
    )

    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthenticated"
    assert not AuditEvent.objects.exists()


# The document describes the tool contracts, read from the database.
@pytest.mark.django_db
def test_the_schema_documents_ingestion(client: Any) -> None:
    schema = client.get("/api/v1/openapi.json").json()

    operation = schema["paths"]["/api/v1/audit/events"]["post"]
    assert "application/x-ndjson" in operation["requestBody"]["content"]
    assert {"200", "413", "415", "422"} <= set(operation["responses"])
