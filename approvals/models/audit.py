"""The audit trail: append-only events (the console's own and other producers'), their
ingestion batches and duplicate deliveries, and each tenant's hash chain."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

import rfc8785
from django.db import models
from django.db.models import Q

from approvals import vocabulary
from approvals.models.occurrences import Occurrence
from approvals.models.tenancy import RuntimeKey, Tenant

# The prev_hash of the first event of every tenant's chain.
AUDIT_CHAIN_GENESIS = "0" * 64


class AuditIngestion(models.Model):
    """One batch of producer events POSTed to ``/api/v1/audit/events``, as it was received.

    Every line of the batch is either a new ``AuditEvent`` (whose ``ingestion`` is this row)
    or an ``AuditDuplicateDelivery`` of an event stored before. Append-only like the events:
    on PostgreSQL a trigger refuses UPDATE and DELETE.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="audit_ingestions")
    runtime_key = models.ForeignKey(
        RuntimeKey,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="audit_ingestions",
    )
    received = models.PositiveIntegerField(help_text="Lines in the batch.")
    new = models.PositiveIntegerField(help_text="Lines stored as new events.")
    duplicates = models.PositiveIntegerField(help_text="Lines whose producer event was stored.")
    trace_id = models.CharField(max_length=64, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(received=models.F("new") + models.F("duplicates")),
                name="audit_ingestion_counts_add_up",
            ),
        ]

    def __str__(self) -> str:
        return f"ingestion {self.pk}: {self.new} new, {self.duplicates} duplicates"


# The events an investigation's verdict rests on: approved claims and committed effects.
# Queries name them with this very condition, which the audit_decisive_* indexes share.
DECISIVE_EVENTS = Q(decision=vocabulary.ClaimDecision.APPROVED) | Q(
    kind=vocabulary.AuditKind.EFFECT_COMMITTED
)


class AuditEvent(models.Model):
    """Append-only evidence. ``event_id`` is the producer's; ``id`` is the ingestion's.

    The console stores one producer event once per tenant: a producer event delivered again
    through ``POST /api/v1/audit/events`` becomes an ``AuditDuplicateDelivery`` pointing at
    this row, not a second event. ``event_id`` carries no unique index of its own (rows the
    console wrote before ingestion existed may repeat one); events that came through
    ingestion are unique per tenant by constraint.

    **Tamper evidence.** Each tenant's events form a hash chain: ``chain_seq`` (1, 2, ...
    per tenant), ``hash`` (SHA-256 of ``chain_form``, RFC 8785) and ``prev_hash`` (the hash
    of the event before it in the chain). They are NULL when the event is written, off
    the claim's hot path, and set once by ``approvals.audit.chain.audit_chain_extend``; the
    append-only trigger allows exactly that one UPDATE and nothing else.
    """

    event_id = models.UUIDField(default=uuid.uuid4, db_index=True)
    kind = models.CharField(max_length=64)
    # Indexed by (tenant, id) and (occurrence, id) below: a single-column index of each
    # would only be more work for every insert (the claim's) and for chaining.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="audit_events", db_index=False
    )
    occurrence = models.ForeignKey(
        Occurrence,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="audit_events",
        db_index=False,
    )
    actor = models.CharField(max_length=150, blank=True)
    token_fingerprint = models.CharField(max_length=16, blank=True)
    decision = models.CharField(max_length=32, blank=True)
    reason_code = models.CharField(max_length=64, blank=True)
    execution_id = models.CharField(max_length=200, blank=True)
    message_id = models.CharField(max_length=200, blank=True)
    command_id = models.UUIDField(null=True, blank=True)
    trace_id = models.CharField(max_length=64, blank=True)
    source_time = models.DateTimeField()
    ingested_at = models.DateTimeField(auto_now_add=True)
    data = models.JSONField(default=dict, blank=True)
    # The batch that delivered the event when another producer sent it; NULL for the
    # console's own events, which is why its index (below) leaves NULL out: the claim's
    # insert maintains no index for it.
    ingestion = models.ForeignKey(
        AuditIngestion,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="events",
        db_index=False,
    )
    # NULL (not "") until chained: the trigger lets only NULL chain columns be set.
    chain_seq = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    hash = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    prev_hash = models.CharField(  # noqa: DJ001
        max_length=64, null=True, blank=True, editable=False
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["tenant", "id"]),
            models.Index(fields=["occurrence", "id"]),
            # What the chain extension still has to do: small, since it is done every
            # few seconds.
            models.Index(
                fields=["tenant", "id"], condition=Q(chain_seq__isnull=True), name="audit_unchained"
            ),
            models.Index(
                fields=["ingestion"], condition=Q(ingestion__isnull=False), name="audit_ingested"
            ),
            # The export's and investigators' filters by token and by execution.
            models.Index(
                fields=["tenant", "token_fingerprint", "id"],
                condition=~Q(token_fingerprint=""),
                name="audit_tenant_fingerprint",
            ),
            models.Index(
                fields=["tenant", "execution_id", "id"],
                condition=~Q(execution_id=""),
                name="audit_tenant_execution",
            ),
            # A review page's effect line: a command's newest effect events, found without
            # walking an occurrence's whole history (thousands of refused replays, say).
            models.Index(
                fields=["command_id", "id"],
                condition=Q(kind__in=vocabulary.EFFECT_KINDS),
                name="audit_command_effects",
            ),
            # An investigation's decisive events (what its verdict rests on), one index per
            # way its chain names an event, so that a chain of thousands of refused
            # replays is not read to find its one approved claim. Few rows: one or two per
            # approval.
            models.Index(
                fields=["tenant", "token_fingerprint"],
                condition=DECISIVE_EVENTS,
                name="audit_decisive_fingerprint",
            ),
            models.Index(
                fields=["tenant", "execution_id"],
                condition=DECISIVE_EVENTS,
                name="audit_decisive_execution",
            ),
            models.Index(
                fields=["occurrence"], condition=DECISIVE_EVENTS, name="audit_decisive_occurrence"
            ),
            models.Index(
                fields=["command_id"], condition=DECISIVE_EVENTS, name="audit_decisive_command"
            ),
            # Other producers' events that name a command, newest first (an investigation
            # by command id): the console's own events carry their occurrence, so only
            # ingested ones are indexed, and the claim's insert maintains nothing for it.
            models.Index(
                fields=["command_id", "id"],
                condition=Q(ingestion__isnull=False),
                name="audit_ingested_command",
            ),
            # Review health (approvals.reviews.health): reviewers' decisions, escalations
            # and timeouts by time, the console's own only. A few rows per request.
            models.Index(
                fields=["source_time"],
                condition=Q(
                    kind__in=[
                        vocabulary.AuditKind.APPROVAL_ISSUED,
                        vocabulary.AuditKind.OCCURRENCE_REJECTED,
                        vocabulary.AuditKind.OCCURRENCE_ESCALATED,
                        vocabulary.AuditKind.OCCURRENCE_TIMED_OUT,
                    ],
                    ingestion__isnull=True,
                ),
                name="audit_review_health",
            ),
        ]
        constraints = [
            # A fork of the chain (two events with one chain_seq) cannot be stored.
            models.UniqueConstraint(
                fields=["tenant", "chain_seq"],
                condition=Q(chain_seq__isnull=False),
                name="audit_chain_seq_unique",
            ),
            models.CheckConstraint(
                condition=(
                    Q(chain_seq__isnull=True) & Q(hash__isnull=True) & Q(prev_hash__isnull=True)
                )
                | (Q(chain_seq__isnull=False) & Q(hash__isnull=False) & Q(prev_hash__isnull=False)),
                name="audit_chain_columns_together",
            ),
            models.UniqueConstraint(
                fields=["tenant", "event_id"],
                condition=Q(ingestion__isnull=False),
                name="audit_ingested_event_once",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id}"

    def chain_form(self, *, chain_seq: int, prev_hash: str) -> dict[str, Any]:
        """What the chain hashes: every field of the event, its place in the chain and the
        hash of the event before it, as JSON values that read the same on every database.

        Left out: ``hash`` itself. Including ``chain_seq`` and ``prev_hash`` is what makes
        it a chain: rewriting one event means rewriting every later one."""
        return {
            "actor": self.actor,
            "chain_seq": chain_seq,
            "command_id": str(self.command_id) if self.command_id else None,
            "data": self.data,
            "decision": self.decision,
            "event_id": str(self.event_id),
            "execution_id": self.execution_id,
            "id": self.pk,
            "ingested_at": _utc_text(self.ingested_at),
            "ingestion_id": self.ingestion_id,
            "kind": self.kind,
            "message_id": self.message_id,
            "occurrence_id": str(self.occurrence_id) if self.occurrence_id else None,
            "prev_hash": prev_hash,
            "reason_code": self.reason_code,
            "source_time": _utc_text(self.source_time),
            "tenant_id": self.tenant_id,
            "token_fingerprint": self.token_fingerprint,
            "trace_id": self.trace_id,
        }

    def chain_hash(self, *, chain_seq: int, prev_hash: str) -> str:
        """SHA-256 (hex) of the RFC 8785 form of ``chain_form``."""
        form = self.chain_form(chain_seq=chain_seq, prev_hash=prev_hash)
        try:
            canonical = chain_canonical(form)
        except (rfc8785.IntegerDomainError, rfc8785.FloatDomainError):
            # ``data`` holds a number JSON cannot carry exactly (stored by the console's
            # own code, never from a request): hash its sorted JSON text instead.
            form["data"] = {"$json": json.dumps(self.data, sort_keys=True, ensure_ascii=False)}
            canonical = chain_canonical(form)
        return hashlib.sha256(canonical).hexdigest()


def chain_canonical(form: dict[str, Any]) -> bytes:
    """``rfc8785.dumps(form)`` for a ``chain_form``, four times faster (it runs once per
    event when the chain is extended and again when it is verified).

    The form's keys are fixed ASCII names, which RFC 8785 sorts as Python does; its values
    other than ``data`` are strings, integers and null, whose RFC 8785 text is exactly what
    ``json.dumps(value, ensure_ascii=False)`` writes (the same escapes, lowercase hex,
    nothing else escaped). ``data`` goes through ``rfc8785`` itself. The tests compare the two."""
    parts = []
    for key in sorted(form):
        value = form[key]
        if key == "data":
            text = rfc8785.dumps(value).decode("utf-8") if value else "{}"
        elif isinstance(value, str):
            text = encode_basestring(value)
        elif value is None:
            text = "null"
        elif isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > _MAX_SAFE_INTEGER:
                raise rfc8785.IntegerDomainError(value)
            text = str(value)
        else:
            return rfc8785.dumps(form)
        parts.append(f'"{key}":{text}')
    return ("{" + ",".join(parts) + "}").encode("utf-8")


_MAX_SAFE_INTEGER = 2**53 - 1


def _utc_text(moment: datetime) -> str:
    return stored_time_text(moment) or moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stored_time_text(moment: datetime) -> str:
    """PostgreSQL's text of a stored time Python cannot hold (before year 1 or after 9999 in
    UTC; ``config.postgresql.base.UnrepresentableTime``), or "" for any other time. The
    chain hashes and the export writes this text, never the stand-in Python was given."""
    return getattr(moment, "stored", "")


class AuditDuplicateDelivery(models.Model):
    """A producer event delivered again after the console had stored it.

    The event is stored once (``original``, with the ingestion and time of its first
    delivery); each batch that brings it again adds a row here, with that batch
    (``ingestion``: its id and ``received_at``), the first line in it that carried the
    event and how many lines did (``copies``), so that an investigator can tell a
    duplicated audit delivery (one producer event id, several deliveries) from a replay
    (several events). Append-only.

    What it keeps is bounded (``approvals.audit.ingest``): lines of one batch that say the
    same thing are one row; a line that says what the stored event says keeps no payload
    (the stored event is its content); a line that says something else keeps the line as
    sent, up to ``DUPLICATE_PAYLOADS_KEPT`` such lines per stored event, after which only
    their count and first line are kept (``same_payload`` false, ``payload`` null).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    ingestion = models.ForeignKey(
        AuditIngestion, on_delete=models.PROTECT, related_name="duplicate_deliveries"
    )
    original = models.ForeignKey(
        AuditEvent, on_delete=models.PROTECT, related_name="duplicate_deliveries"
    )
    event_id = models.UUIDField(help_text="The producer's event id, the original's too.")
    line = models.PositiveIntegerField(
        help_text="Line number in the batch, from 1: the first of ``copies``."
    )
    copies = models.PositiveIntegerField(
        default=1,
        help_text="Lines of the batch that delivered the event again and said what this one says.",
    )
    payload = models.JSONField(
        null=True,
        help_text="The line as delivered, when it says something else than the stored event "
        "(and the event had fewer such lines kept than the bound); else null.",
    )
    same_payload = models.BooleanField(
        help_text="Whether the line says what the stored event says."
    )

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["tenant", "event_id"], name="audit_duplicate_event")]
        constraints = [
            models.CheckConstraint(
                condition=Q(copies__gte=1), name="audit_duplicate_copies_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"duplicate delivery of {self.event_id} in ingestion {self.ingestion_id}"


class AuditChainHead(models.Model):
    """The newest link of a tenant's audit chain.

    Its row lock (``SELECT ... FOR UPDATE``) is what serializes extending the chain, so two
    writers can never give out one ``chain_seq`` twice. ``chained_through`` is an event id:
    every event of the tenant with an id up to it is chained.
    """

    tenant = models.OneToOneField(
        Tenant, on_delete=models.PROTECT, primary_key=True, related_name="audit_chain_head"
    )
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64, default=AUDIT_CHAIN_GENESIS)
    chained_through = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"audit chain of {self.tenant_id} at {self.seq}"
