"""The kill switch from a shell.

``--fingerprint`` revokes one approval, in any tenant; ``--tenant`` revokes the tenant's
revocable approvals that the filters select (``--tool``, ``--approver``, ``--runtime-key``,
``--issued-before``), all of them without filters. ``--dry-run`` prints what would be
revoked and changes nothing. A mistyped filter is an error, never "nothing to revoke".
An approval that cannot be revoked any more (consumed, expired, already revoked) is named
on standard error with why: a consumed one with its command and the command's effect state.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet
from django.utils import timezone

from approvals.models import Approval, RuntimeKey, Tenant, ToolContract
from approvals.reviews.revocation import (
    RevocationFilter,
    approval_revoke_refusal,
    approvals_revocable_of,
    approvals_revoke,
)
from approvals.reviews.selectors import approvals_with_fingerprint
from approvals.web.money import money_lines

ACTOR = "cli:revoke_approvals"
FILTERS = ("approver", "tool", "runtime_key", "issued_before")


def _issued_before(value: str) -> datetime:
    """An ISO 8601 time; without an offset it is UTC, as the console shows times."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise CommandError(
            f"--issued-before {value!r} is not an ISO 8601 time, e.g. 2025-03-01T02:30:00Z."
        ) from None
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


def _utc(moment: datetime | None) -> str:
    return f"{timezone.localtime(moment, UTC):%Y-%m-%dT%H:%M:%SZ}" if moment else "-"


def describe(approval: Approval) -> str:
    """One line per approval: what an admin checks before revoking it."""
    amounts = ", ".join(line.text for line in money_lines(approval.proposal.arguments)) or "-"
    key = approval.occurrence.runtime_key
    return "  ".join(
        [
            approval.fingerprint or "(not picked up)",
            approval.tenant.slug,
            approval.tool_name,
            f"approver={approval.approver.get_username()}",
            f"key={key.name if key else '-'}",
            f"issued={_utc(approval.issued_at)}",
            f"expires={_utc(approval.expires_at)}",
            f"amount={amounts}",
            f"occurrence={approval.occurrence_id}",
        ]
    )


class Command(BaseCommand):
    help = (
        "The kill switch: revoke every still-issued approval that matches. "
        "--dry-run prints the count and the list and revokes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--fingerprint", help="Revoke the approval with this fingerprint.")
        target.add_argument("--tenant", metavar="SLUG", help="Revoke the tenant's approvals.")
        parser.add_argument("--approver", metavar="USERNAME", help="Only approvals by this user.")
        parser.add_argument("--tool", metavar="NAME", help="Only approvals for this tool.")
        parser.add_argument(
            "--runtime-key",
            metavar="NAME",
            help="Only approvals of occurrences this runtime key (by name) proposed.",
        )
        parser.add_argument(
            "--issued-before",
            metavar="ISO",
            help="Only approvals issued before this time (ISO 8601; UTC without an offset).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be revoked; revoke nothing."
        )
        parser.add_argument("--reason", help="Why (recorded with each revocation); required.")

    def handle(self, *args: Any, **options: Any) -> None:
        reason = (options["reason"] or "").strip()
        if not reason and not options["dry_run"]:
            raise CommandError("Say why the approvals are revoked (--reason).")
        fingerprint = options["fingerprint"]
        if fingerprint is not None:
            approvals = self._by_fingerprint(options)
        else:
            approvals = self._by_filters(options)
        if options["dry_run"]:
            count = self._dry_run(approvals)
        else:
            count = approvals_revoke(approvals=approvals, actor=ACTOR, reason=reason)
            self.stdout.write(f"Revoked {count} approval(s).")
        if fingerprint is not None and count == 0:
            self._why_not(approvals, fingerprint.strip())

    def _by_fingerprint(self, options: dict[str, Any]) -> QuerySet[Approval]:
        # An empty fingerprint would match every approval whose token is not picked up.
        if not options["fingerprint"].strip():
            raise CommandError("--fingerprint is empty.")
        if any(options[name] for name in FILTERS):
            raise CommandError(
                "--approver, --tool, --runtime-key and --issued-before go with --tenant, "
                "not --fingerprint."
            )
        return approvals_with_fingerprint(options["fingerprint"].strip())

    def _by_filters(self, options: dict[str, Any]) -> QuerySet[Approval]:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        # A mistyped filter must not pass for "nothing to revoke" during an incident.
        users = get_user_model().objects
        if options["approver"] and not users.filter(username=options["approver"]).exists():
            raise CommandError(f"No user {options['approver']!r}.")
        if options["tool"] and not ToolContract.objects.filter(name=options["tool"]).exists():
            raise CommandError(f"No tool contract {options['tool']!r}.")
        key_id = None
        if options["runtime_key"]:
            key = RuntimeKey.objects.filter(tenant=tenant, name=options["runtime_key"]).first()
            if key is None:
                raise CommandError(f"No runtime key {options['runtime_key']!r} in {tenant.slug}.")
            key_id = key.pk
        filters = RevocationFilter(
            tool=options["tool"] or "",
            approver=options["approver"] or "",
            runtime_key_id=key_id,
            issued_before=_issued_before(options["issued_before"])
            if options["issued_before"]
            else None,
        )
        return filters.apply(Approval.objects.filter(tenant=tenant))

    def _dry_run(self, approvals: QuerySet[Approval]) -> int:
        revocable = list(
            approvals_revocable_of(approvals)
            .select_related("tenant", "approver", "proposal", "occurrence__runtime_key")
            .order_by("issued_at", "pk")
        )
        self.stdout.write(f"Would revoke {len(revocable)} approval(s) (dry run: nothing changed).")
        for approval in revocable:
            self.stdout.write(describe(approval))
        return len(revocable)

    def _why_not(self, approvals: QuerySet[Approval], fingerprint: str) -> None:
        found = list(approvals.order_by("pk"))
        if not found:
            self.stderr.write(f"No approval has the fingerprint {fingerprint!r}.")
        for approval in found:
            why = approval_revoke_refusal(approval)
            if why:
                self.stderr.write(why)
