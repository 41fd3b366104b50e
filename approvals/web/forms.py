"""Forms of the reviewer console. They check shape only; the services decide."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django import forms
from django.core.validators import RegexValidator

from approvals.models import Occurrence
from approvals.vocabulary import PanelState

DIGEST_VALIDATOR = RegexValidator(r"^[0-9a-f]{64}$", "Not a SHA-256 hex digest.")

STATE_ALL = "all"
# The consumed occurrences whose approval the reader gave and whose effect failed, is
# unknown or was interrupted.
STATE_WENT_WRONG = "went_wrong"
STATE_CHOICES = [
    (Occurrence.Status.PENDING_REVIEW.value, "Pending review"),
    (Occurrence.Status.APPROVED.value, "Approved"),
    (Occurrence.Status.CLAIMED.value, Occurrence.Status.CLAIMED.label),
    (Occurrence.Status.REJECTED.value, "Rejected"),
    (Occurrence.Status.REVOKED.value, "Revoked"),
    (Occurrence.Status.EXPIRED.value, "Expired"),
    (Occurrence.Status.TIMED_OUT.value, "Timed out"),
    (Occurrence.Status.AUTO_ADMITTED.value, "Auto-admitted"),
    (STATE_ALL, "All states"),
    (STATE_WENT_WRONG, "My approvals that went wrong"),
]


# What a reviewer may type for a state besides its value: the pages say "Consumed" for the
# API's "claimed", so ?state=consumed means that state (not the default it fell back to).
STATE_ALIASES = {PanelState.CONSUMED.value: Occurrence.Status.CLAIMED.value}


@dataclass(frozen=True)
class InboxNarrowing:
    """The inbox's filters beside tool and state: who asked, in which run, for how much (an
    amount range in the request's own currency's major units, ``amount_minor`` read from
    the arguments). Empty: not filtered."""

    requester: str = ""
    run: str = ""
    amount_min: Decimal | None = None
    amount_max: Decimal | None = None

    def query(self) -> dict[str, str]:
        """As the inbox's query string (links, the poll), set fields only."""
        fields = {
            "requester": self.requester,
            "run": self.run,
            "amount_min": "" if self.amount_min is None else str(self.amount_min),
            "amount_max": "" if self.amount_max is None else str(self.amount_max),
        }
        return {k: v for k, v in fields.items() if v}


_AMOUNT = {"max_digits": 18, "decimal_places": 4, "min_value": 0}


class InboxFilterForm(forms.Form):
    tool = forms.ChoiceField(required=False)
    state = forms.ChoiceField(required=False, choices=STATE_CHOICES)
    page = forms.IntegerField(required=False, min_value=1)
    requester = forms.CharField(required=False, max_length=150)
    run = forms.CharField(required=False, max_length=200)
    amount_min = forms.DecimalField(required=False, **_AMOUNT)  # type: ignore[arg-type]
    amount_max = forms.DecimalField(required=False, **_AMOUNT)  # type: ignore[arg-type]

    def __init__(self, data: Any = None, *args: Any, tools: list[str], **kwargs: Any) -> None:
        if data is not None and data.get("state") in STATE_ALIASES:
            data = data.copy()
            data["state"] = STATE_ALIASES[data["state"]]
        super().__init__(data, *args, **kwargs)
        self.tool_choices = [("", "All tools"), *((name, name) for name in tools)]
        tool_field: forms.ChoiceField = self.fields["tool"]  # type: ignore[assignment]
        tool_field.choices = self.tool_choices

    def filters(self) -> tuple[str, str]:
        """The tool and state to filter by; anything unrecognised falls back to defaults,
        field by field, so a bad page number does not drop the tool and state."""
        self.is_valid()
        data = self.cleaned_data
        tool = data.get("tool") or ""
        state = data.get("state") or Occurrence.Status.PENDING_REVIEW.value
        return tool, state

    def narrowing(self) -> InboxNarrowing:
        """Requester, run and amount range; a field that is not valid is left out."""
        self.is_valid()
        data = self.cleaned_data
        return InboxNarrowing(
            requester=(data.get("requester") or "").strip(),
            run=(data.get("run") or "").strip(),
            amount_min=data.get("amount_min"),
            amount_max=data.get("amount_max"),
        )


class ApproveForm(forms.Form):
    action_digest = forms.CharField(max_length=64, validators=[DIGEST_VALIDATOR])


class ReasonForm(forms.Form):
    """Reject and revoke: a reason is required and reaches the agent or the audit trail."""

    reason = forms.CharField(
        max_length=2000,
        error_messages={"required": "Say why.", "max_length": "Keep it under 2000 characters."},
    )


class EditForm(forms.Form):
    arguments = forms.CharField(
        max_length=64 * 1024,
        strip=False,
        error_messages={"required": "Enter the arguments as a JSON object."},
    )
    action_digest = forms.CharField(max_length=64, validators=[DIGEST_VALIDATOR])
    # Sent by the form that said, plainly, that saving withdraws the issued approval.
    withdraw_approval = forms.BooleanField(required=False)


class TenantSwitchForm(forms.Form):
    tenant = forms.CharField(required=False, max_length=64)
    next = forms.CharField(required=False, max_length=2000)
