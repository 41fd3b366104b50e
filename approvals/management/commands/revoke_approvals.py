from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals import services
from approvals.models import Approval, Tenant, ToolContract


class Command(BaseCommand):
    help = "The kill switch: revoke every still-issued approval that matches."

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--fingerprint", help="Revoke the approval with this fingerprint.")
        target.add_argument("--tenant", metavar="SLUG", help="Revoke the tenant's approvals.")
        parser.add_argument("--approver", metavar="USERNAME", help="Only approvals by this user.")
        parser.add_argument("--tool", metavar="NAME", help="Only approvals for this tool.")
        parser.add_argument("--reason", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["reason"].strip():
            raise CommandError("Say why the approvals are revoked (--reason).")
        approvals = Approval.objects.all()
        if options["fingerprint"] is not None:
            # An empty fingerprint would match every approval whose token is not picked up.
            if not options["fingerprint"].strip():
                raise CommandError("--fingerprint is empty.")
            if options["approver"] or options["tool"]:
                raise CommandError("--approver and --tool go with --tenant, not --fingerprint.")
            approvals = approvals.filter(fingerprint=options["fingerprint"])
        else:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
            approvals = approvals.filter(tenant=tenant)
            # A mistyped filter must not pass for "nothing to revoke" during an incident.
            if options["approver"]:
                if not get_user_model().objects.filter(username=options["approver"]).exists():
                    raise CommandError(f"No user {options['approver']!r}.")
                approvals = approvals.filter(approver__username=options["approver"])
            if options["tool"]:
                if not ToolContract.objects.filter(name=options["tool"]).exists():
                    raise CommandError(f"No tool contract {options['tool']!r}.")
                approvals = approvals.filter(tool_name=options["tool"])
        count = services.approvals_revoke(
            approvals=approvals, actor="cli:revoke_approvals", reason=options["reason"]
        )
        self.stdout.write(f"Revoked {count} approval(s).")
