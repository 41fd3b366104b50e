from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from approvals.audit.chain import audit_chain_extend, audit_chain_verify
from approvals.models import Tenant


class Command(BaseCommand):
    help = (
        "Walk each tenant's audit hash chain (after chaining what is new) and name the first"
        " event that was edited, deleted or inserted. Exits 1 if one was, 0 otherwise."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", metavar="SLUG", help="Only this tenant's chain.")

    def handle(self, *args: Any, **options: Any) -> None:
        tenants = Tenant.objects.order_by("slug")
        if options["tenant"] is not None:
            tenants = tenants.filter(slug=options["tenant"])
            if not tenants.exists():
                raise CommandError(f"No tenant {options['tenant']!r}.", returncode=2)
        failed = False
        for tenant in tenants:
            try:
                audit_chain_extend(tenant_id=tenant.pk)
            except DatabaseError as exc:
                # A forged chain can refuse to be extended (its chain_seq taken already);
                # the walk below says what is wrong with it.
                self.stderr.write(f"{tenant.slug}: the chain cannot be extended: {exc}")
            report = audit_chain_verify(tenant=tenant)
            if report.problem is not None:
                failed = True
                problem = report.problem
                self.stderr.write(f"{tenant.slug}: {problem.kind.upper()}: {problem.message}")
                continue
            pending = f", {report.unchained} newer not yet chained" if report.unchained else ""
            if report.chained:
                self.stdout.write(
                    f"{tenant.slug}: ok, {report.chained:,} events chained (chain_seq 1 to"
                    f" {report.chained}), head {report.head_hash[:16]}…{pending}"
                )
            else:
                self.stdout.write(f"{tenant.slug}: ok, no events chained{pending}")
        if failed:
            sys.exit(1)
