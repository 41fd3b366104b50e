from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse
from django.utils import timezone

from approvals.access.runtime_keys import runtime_key_create
from approvals.models import Membership, ReviewerGroup, RoutingRule, Tenant, ToolContract
from approvals.reviews.proposals import occurrence_propose
from approvals.routing.changes import reviewer_group_save, routing_rule_save

DEMO_USERS = [
    ("reviewer", "reviewer-demo", [Membership.Role.REVIEWER]),
    ("reviewer2", "reviewer2-demo", [Membership.Role.REVIEWER]),
    ("operator", "operator-demo", [Membership.Role.OPERATOR]),
    ("admin", "admin-demo", [Membership.Role.ADMIN, Membership.Role.REVIEWER]),
]

DEMO_PROPOSALS: list[dict[str, Any]] = [
    {
        "tool": "issue_refund",
        "arguments": {
            "payment_id": "pay_8Hq2LmX",
            "amount_minor": 8000,
            "currency": "EUR",
            "reason": "Order 1042 arrived damaged",
        },
        "run_id": "run-support-1042",
        "reason": "Customer sent photos of the damaged parcel; policy allows a full refund.",
        "requested_by": "alice",
        "client_ref": "demo-refund-1042",
    },
    {
        "tool": "issue_refund",
        "arguments": {
            "payment_id": "pay_Zt91kPq",
            "amount_minor": 129900,
            "currency": "USD",
            "reason": "Duplicate charge on annual plan",
        },
        "run_id": "run-billing-77",
        "reason": "The annual plan was charged twice on the same day.",
        "requested_by": "bob",
        "client_ref": "demo-refund-77",
    },
    {
        "tool": "send_message",
        "arguments": {
            "to": "dana@example.com",
            "subject": "Your refund is on its way",
            "body": (
                "Hi Dana,\n\nWe refunded EUR 80.00 to your card. It takes 3-5 days to appear.\n"
            ),
        },
        "run_id": "run-support-1042",
        "reason": "Tell the customer about the refund.",
        "requested_by": "alice",
        "client_ref": "demo-message-1042",
    },
    {
        "tool": "close_ticket",
        "arguments": {"ticket_id": "T-1042"},
        "run_id": "run-support-1042",
        "reason": "The refund is done; nothing else to do on this ticket.",
        "requested_by": "alice",
        "client_ref": "demo-close-1042",
    },
    {
        "tool": "lookup_order",
        "arguments": {"order_id": "1042"},
        "run_id": "run-support-1042",
        "reason": "Check the order before refunding.",
        "requested_by": "alice",
        "client_ref": "demo-lookup-1042",
    },
]

# Five small refunds of one run, alike but for the payment and the amount: a newcomer ticks
# them in the inbox (filtered by this run) and decides them together at /reviews/bulk/,
# which marks where they differ. Each under EUR 500.00, so one reviewer approves them.
DEMO_BULK_RUN = "run-goodwill-0312"
DEMO_BULK_REFUNDS: list[dict[str, Any]] = [
    {
        "tool": "issue_refund",
        "arguments": {
            "payment_id": payment_id,
            "amount_minor": amount,
            "currency": "EUR",
            "reason": "Late delivery: goodwill credit",
        },
        "run_id": DEMO_BULK_RUN,
        "reason": f"The courier delivered order {order} two days late; policy credits 10%.",
        "requested_by": "alice",
        "client_ref": f"demo-goodwill-{order}",
    }
    for order, payment_id, amount in (
        ("2101", "pay_Gw2101a", 1250),
        ("2102", "pay_Gw2102b", 990),
        ("2103", "pay_Gw2103c", 2400),
        ("2104", "pay_Gw2104d", 1250),
        ("2105", "pay_Gw2105e", 1875),
    )
]


# A demo-only contract with short deadlines, so that a newcomer sees a request escalated
# after 2 minutes and timed out after 5 (the sweep runs under bin/demo's beat).
DEMO_DEADLINE_CONTRACT: dict[str, Any] = {
    "name": "close_ticket",
    "description": "Close a support ticket (demo). Undecided, it is escalated after 2 "
    "minutes and times out after 5.",
    "json_schema": {
        "type": "object",
        "properties": {"ticket_id": {"type": "string", "minLength": 1, "maxLength": 40}},
        "required": ["ticket_id"],
        "additionalProperties": False,
    },
    "risk": ToolContract.Risk.LOW,
    "review_deadline": timedelta(minutes=2),
    "final_deadline": timedelta(minutes=5),
}


# Who is asked (issue 26's routing): refunds to support, those above EUR/USD 500.00 to
# finance-leads; close_ticket to support, and to finance-leads (its fallback group) once it
# is escalated after 2 minutes. finance-leads' Slack and webhook post back to the console's
# /_demo/outbox, which shows them with the e-mails.
DEMO_GROUPS = {"support": ["reviewer", "admin"], "finance-leads": ["reviewer2", "admin"]}
DEMO_RULES: list[dict[str, Any]] = [
    {"tool": "issue_refund", "name": "refunds", "groups": ["support"], "fallback": "finance-leads"},
    *(
        {
            "tool": "issue_refund",
            "name": f"large {currency} refunds",
            "groups": ["finance-leads"],
            "currency": currency,
            "amount_over_minor": 50000,
        }
        for currency in ("EUR", "USD")
    ),
    {"tool": "send_message", "name": "messages", "groups": ["support"]},
    {
        "tool": "close_ticket",
        "name": "tickets",
        "groups": ["support"],
        "fallback": "finance-leads",
    },
]


# Not a secret: the demo's catcher takes any bot token and keeps none.
DEMO_BOT_TOKEN = "xoxb-demo-0000-not-a-real-token"


def _seed_routing(tenant: Tenant, base_url: str) -> None:
    """The demo's reviewer groups and routing rules, once (a rerun keeps them)."""
    admin = get_user_model().objects.get(username="admin")
    users = dict(get_user_model().objects.values_list("username", "pk"))
    groups = {}
    for name, members in DEMO_GROUPS.items():
        existing = ReviewerGroup.objects.filter(tenant=tenant, name=name).first()
        if existing is not None:
            groups[name] = existing
            continue
        catch = f"{base_url}/_demo/outbox/catch"
        # The catcher is this console on loopback over http: only where that is allowed
        # (DEBUG, as bin/demo runs), else the group is told by e-mail alone.
        local = settings.CALLBACK_ALLOW_HTTP and settings.CALLBACK_ALLOW_PRIVATE_HOSTS
        told = name == "finance-leads" and local
        # support's Slack app posts to the catcher that plays Slack's Web API (bin/demo
        # points SLACK_API_URL at it): its decisions show as replies in their threads.
        app = name == "support" and local and settings.SLACK_API_URL.startswith(base_url)
        groups[name] = reviewer_group_save(
            tenant=tenant,
            admin=admin,
            name=name,
            member_ids=[users[m] for m in members],
            slack_webhook_url=f"{catch}/slack" if told else None,
            webhook_url=f"{catch}/webhook" if told else None,
            slack_bot_token=DEMO_BOT_TOKEN if app else None,
            slack_channel_id="CDEMOSUPPORT" if app else None,
        ).group
    for rule in DEMO_RULES:
        if RoutingRule.objects.filter(tenant=tenant, name=rule["name"]).exists():
            continue
        routing_rule_save(
            tenant=tenant,
            admin=admin,
            tool=rule["tool"],
            name=rule["name"],
            group_ids=[groups[g].pk for g in rule["groups"]],
            fallback_group_id=groups[rule["fallback"]].pk if "fallback" in rule else None,
            currency=rule.get("currency", ""),
            amount_over_minor=rule.get("amount_over_minor"),
        )


class Command(BaseCommand):
    help = (
        "Create the demo tenant, its people, a runtime key and a few pending proposals, "
        "five of them alike for bulk review."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", default="demo")
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="Where the console is served, for the sign-in link it prints.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            # Its accounts have published passwords: never on a deployment.
            raise CommandError(
                "seed_demo creates accounts with published passwords and runs only with "
                "DEBUG on (bin/demo sets DEBUG=1)."
            )
        tenant, _ = Tenant.objects.get_or_create(
            slug=options["tenant"], defaults={"name": "Demo Shop"}
        )
        User = get_user_model()
        for username, password, roles in DEMO_USERS:
            user = User.objects.filter(username=username).first()
            if user is None:
                user = User.objects.create_user(username=username, password=password)
            if username == "admin":
                user.is_staff = user.is_superuser = True
                user.save(update_fields=["is_staff", "is_superuser"])
            for role in roles:
                Membership.objects.get_or_create(user=user, tenant=tenant, role=role)
            if not user.email:
                user.email = f"{username}@demo.test"
                user.save(update_fields=["email"])

        # The raw key is only known when it is created, so every run makes a fresh one. The
        # random suffix keeps two runs within one second from colliding on the key's name.
        name = f"demo-runtime-{timezone.now():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
        key, raw = runtime_key_create(tenant=tenant, name=name)
        if not ToolContract.objects.filter(name=DEMO_DEADLINE_CONTRACT["name"]).exists():
            contract = ToolContract(**DEMO_DEADLINE_CONTRACT)
            contract.full_clean()
            contract.save()
        _seed_routing(tenant, options["base_url"].rstrip("/"))
        for proposal in [*DEMO_PROPOSALS, *DEMO_BULK_REFUNDS]:
            occurrence_propose(runtime_key=key, **proposal)

        self.stdout.write(f"Demo tenant: {tenant.slug}")
        login_url = options["base_url"].rstrip("/") + reverse("login")
        self.stdout.write(f"Sign in at {login_url} as:")
        for username, password, roles in DEMO_USERS:
            self.stdout.write(f"  {username:<10} password {password:<16} ({', '.join(roles)})")
        self.stdout.write("Runtime key for the agent API (shown only now):")
        self.stdout.write(f"  export KEY={raw}")
