"""The review page's decision panel: what the viewer may do now, the approval's state, the
command and its effect, the quorum rule, and an edit's differences."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from approvals.access.requester import UNVERIFIED, requester_marks
from approvals.canonical.confusables import is_hidden, same_person
from approvals.canonical.form import pretty
from approvals.models import (
    Approval,
    AuditEvent,
    Command,
    Occurrence,
    Proposal,
    ToolContract,
)
from approvals.reviews.selectors import effective_approval_state
from approvals.vocabulary import AuditKind, PanelState
from approvals.web.jinja import render_rows
from approvals.web.money import format_money, minor_units, money_lines
from approvals.web.presenters.effects import effect_word
from approvals.web.presenters.history import (
    EvidencePart,
    HistoryLink,
    evidence_parts,
    evidence_text,
    history_caption,
    history_links,
    history_rows,
)
from approvals.web.selectors.review import (
    DecisionView,
    EffectEvidence,
    Freshness,
    ReviewSnapshot,
)
from approvals.web.shell import duration, stamp
from approvals.web.text import (
    NO_HTML,
    argument_flags,
    json_value,
    plain_reveal,
    reveal,
    reveal_html,
)

PANEL_POLL_SECONDS = 2


REPLAY_SAFETY_HELP = {
    ToolContract.ReplaySafety.READ_ONLY: "changes nothing; may be repeated",
    ToolContract.ReplaySafety.IDEMPOTENT_WITH_KEY: "a repeat with the same key has no new effect",
    ToolContract.ReplaySafety.EFFECT_QUERYABLE: "its effect can be looked up before a retry",
    ToolContract.ReplaySafety.UNSAFE: "never repeated without an explicit decision",
}


def _threshold_money(amount_minor: int, currency: str) -> str:
    if minor_units(currency) is None:
        return f"{amount_minor} {currency}"
    return format_money(amount_minor, currency)


def quorum_rule(tool: ToolContract, arguments: dict[str, Any] | None = None) -> str:
    """The tool's approval rule in words, with the threshold that applies to this call's
    currency (a per-currency contract) or the currency-blind one."""
    arguments = arguments or {}
    needed = f"{tool.approvals_required} distinct reviewers"
    if tool.approvals_required == 1:
        return "1 reviewer"
    if not tool.quorum_amount_argument:
        return needed
    amount = tool.quorum_amount_argument
    if tool.quorum_currency_argument:
        thresholds = tool.quorum_thresholds_minor or {}
        listed = ", ".join(
            _threshold_money(value, code) for code, value in sorted(thresholds.items())
        )
        currency = arguments.get(tool.quorum_currency_argument)
        threshold = tool.quorum_threshold(arguments)
        if isinstance(currency, str) and threshold is not None:
            this_call = f"{_threshold_money(threshold, currency)} for this call's currency"
        elif isinstance(currency, str):
            this_call = f"none for {json_value(currency)}, so this call needs the quorum"
        else:
            this_call = ""
        return (
            f"{needed} when {amount} is above the threshold of its currency"
            f"{f' ({this_call})' if this_call else ''}, or its currency has no threshold; "
            f"otherwise 1. Thresholds: {listed or 'none'}"
        )
    if tool.quorum_threshold_minor is None:
        return needed
    return f"{needed} when {amount} is above {tool.quorum_threshold_minor}; otherwise 1"


@dataclass(frozen=True)
class Viewer:
    """Who looks at a review page, and what their roles in its tenant let them do."""

    username: str
    is_reviewer: bool
    is_admin: bool
    email: str = ""


@dataclass(frozen=True)
class EffectView:
    """What the panel says about a command's effect, in words."""

    state: str
    label: str
    headline: str
    # From the remote or the runtime: revealed, like agent text.
    receipt: SafeString
    why: SafeString
    challenges: list[SafeString]
    invocations: int
    epoch: int
    attention: bool  # someone must act: an unknown outcome, or a challenge to answer


def effect_view(command: Command, evidence: EffectEvidence | None) -> EffectView:
    """The effect of ``command`` as the newest evidence tells it."""
    latest = evidence.latest if evidence else None
    data = latest.data if latest is not None and isinstance(latest.data, dict) else {}
    why = str(data.get("why") or data.get("detail") or "")
    receipt = str(data.get("receipt") or "")
    interruption = evidence.interruption if evidence else None
    challenges: list[str] = []
    if interruption is not None and isinstance(interruption.data, dict):
        challenges = [str(c) for c in interruption.data.get("challenges", [])]
    state = command.state
    runtime = command.executed_by == Command.ExecutedBy.RUNTIME
    attention = False
    if (
        state == Command.State.PENDING
        and latest is not None
        and latest.kind == AuditKind.EFFECT_RETRY_SCHEDULED
    ):
        headline = (
            f"Refused before execution; the console calls again in "
            f"{data.get('retry_in_seconds', '?')} s (call {data.get('attempt', '?')} of "
            f"{data.get('of', '?')} was refused)."
        )
    elif state == Command.State.PENDING and runtime:
        headline = "Waiting for the runtime to execute it and report the effect."
    elif state == Command.State.PENDING:
        headline = "Queued: the console will deliver it to the adapter."
    elif state == Command.State.SENDING:
        headline = "Sending: a call to the adapter may be in flight."
    elif state == Command.State.COMMITTED:
        headline = "Committed: the remote did it."
    elif state == Command.State.REJECTED and challenges:
        attention = True
        headline = (
            "Interrupted: the remote asked for authentication and refused the call before "
            "executing it. Nothing is sent again until an admin replaces the credential; "
            "then a new epoch is admitted, because the effect is known rejected."
        )
    elif state == Command.State.REJECTED:
        headline = "Rejected: the remote refused it before executing it."
    elif state == Command.State.OUTCOME_UNKNOWN:
        attention = True
        headline = (
            "Outcome unknown: the call may or may not have taken effect. Nothing is called "
            "again until an operator reconciles it."
        )
    else:
        headline = command.get_state_display()
    return EffectView(
        state=state,
        label=command.get_state_display(),
        headline=headline,
        receipt=reveal_html(receipt),
        why=reveal_html(why),
        challenges=[reveal_html(c) for c in challenges],
        invocations=evidence.invocations if evidence else 0,
        epoch=evidence.epoch if evidence else 1,
        attention=attention,
    )


@dataclass(frozen=True)
class DecisionPanel:
    """Everything the decision panel shows, and the stamp its poll compares."""

    occurrence: Occurrence
    proposals: list[Proposal]  # every version, in order
    decision: DecisionView
    proposal: Proposal
    approval: Approval | None
    command: Command | None
    effect: EffectView | None
    state_label: str
    shown: Proposal
    shown_is_current: bool
    is_reviewer: bool
    is_admin: bool
    is_requester: bool
    is_editor: bool  # wrote the current version, so may not approve it
    has_voted: bool
    undecided: bool
    can_decide: bool
    can_revoke: bool
    editable: bool
    # Saving an edit now withdraws an issued approval: the page says so on the form.
    edit_withdraws: bool
    still_needed: int
    eligible: list[str]
    rejected_by: str
    rejection_reason: SafeString
    expires_in: str
    escalated: str  # "Escalated: waiting 35 min" while undecided past the review deadline
    history: list[AuditEvent]
    history_html: SafeString  # the window's rows (templates/jinja2/approvals/history_rows.html)
    history_total: int
    history_caption: str
    history_links: list[HistoryLink]
    evidence: list[EvidencePart]
    evidence_text: str
    now: datetime
    stamp: str
    poll_url: str
    poll_seconds: int
    # Who consumed the approval: an execution id from the runtime, revealed.
    consumed_by_html: SafeString = NO_HTML

    def context(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def expiry(fresh: Freshness, now: datetime) -> tuple[str | None, str]:
    """The approval's state at ``now`` and, while it is issued, the time left in words."""
    if fresh.approval_state is None or fresh.approval_expires_at is None:
        return fresh.approval_state, ""
    state = effective_approval_state(fresh.approval_state, fresh.approval_expires_at, now)
    if state != Approval.State.ISSUED:
        return state, ""
    return state, timesince(now, fresh.approval_expires_at, depth=1)


def panel_stamp(fresh: Freshness, viewer: Viewer, *, shown_digest: str, now: datetime) -> str:
    """The decision panel's stamp, from what ``approvals.web.selectors.review.freshness_get`` reads
    in one query: a poll compares it before it reads anything else."""
    return stamp(
        [
            fresh.status,
            fresh.updated_at,
            fresh.last_event_id,
            *expiry(fresh, now),
            fresh.command_state,
            fresh.reviewers,
            fresh.quorum,
            shown_digest,
            viewer,
        ]
    )


def escalation_label(occurrence: Occurrence, now: datetime) -> str:
    """ "Escalated: waiting 35 min" for a request past its review deadline, else ""."""
    if occurrence.escalated_at is None:
        return ""
    minutes = max(int((now - occurrence.created_at).total_seconds() // 60), 0)
    return f"Escalated: waiting {minutes} min"


def _state_label(decision: DecisionView, evidence: EffectEvidence | None) -> str:
    """The header's word for the decision, and for a consumed approval what its command did:
    "Consumed" alone hid an effect that failed, is unknown or was interrupted."""
    label = PanelState(decision.state).label
    if decision.state != PanelState.CONSUMED or decision.command is None:
        return label
    interrupted = evidence is not None and evidence.interruption is not None
    return f"{label} · {effect_word(decision.command.state, interrupted=interrupted)}"


def decision_panel(
    snapshot: ReviewSnapshot, viewer: Viewer, *, shown_digest: str = ""
) -> DecisionPanel:
    occurrence, decision, window = snapshot.occurrence, snapshot.decision, snapshot.history
    history = window.events
    now = snapshot.now
    proposal = decision.proposal
    # The digest the page on screen displays: the approve form sends it, never a newer one.
    shown = next(
        (p for p in snapshot.reviewed.proposals if p.action_digest == shown_digest), proposal
    )
    undecided = decision.state in {PanelState.PENDING, PanelState.AWAITING_QUORUM}
    approval = decision.approval
    eligible = [
        name
        for name in snapshot.reviewer_names
        if name not in decision.voters
        and not same_person(occurrence.requested_by, name)
        and (proposal.edited_by is None or name != proposal.edited_by.username)
    ]
    expires_in = ""
    if approval is not None and decision.state in {PanelState.ISSUED, PanelState.DELIVERED}:
        expires_in = timesince(now, approval.expires_at, depth=1)
    editable = (
        viewer.is_reviewer
        and occurrence.status in {Occurrence.Status.PENDING_REVIEW, Occurrence.Status.APPROVED}
        and decision.state not in {PanelState.CONSUMED, PanelState.TIMED_OUT}
    )
    can_decide = viewer.is_reviewer and undecided
    can_revoke = viewer.is_admin and decision.state in {PanelState.ISSUED, PanelState.DELIVERED}
    evidence = evidence_parts(snapshot.claims) if snapshot.claims is not None else []

    rendered = panel_stamp(
        snapshot.freshness, viewer, shown_digest=shown.action_digest, now=snapshot.now
    )
    poll_url = ""
    if not decision.final:
        # The poll re-renders the history window the page shows, not the newest.
        query = urlencode(
            {"shown": shown.action_digest, "rendered": rendered, **window.cursor.query}
        )
        poll_url = f"{reverse('approvals:panel', args=[occurrence.pk])}?{query}"

    return DecisionPanel(
        occurrence=occurrence,
        proposals=snapshot.reviewed.proposals,
        decision=decision,
        proposal=proposal,
        approval=approval,
        command=decision.command,
        effect=effect_view(decision.command, snapshot.effect) if decision.command else None,
        state_label=_state_label(decision, snapshot.effect),
        shown=shown,
        shown_is_current=shown.pk == proposal.pk,
        is_reviewer=viewer.is_reviewer,
        is_admin=viewer.is_admin,
        # As the service judges it: requested_by names the viewer after normalization.
        is_requester=same_person(occurrence.requested_by, viewer.username, viewer.email),
        is_editor=proposal.edited_by is not None and proposal.edited_by.username == viewer.username,
        has_voted=viewer.username in decision.voters,
        undecided=undecided,
        can_decide=can_decide,
        can_revoke=can_revoke,
        editable=editable,
        edit_withdraws=editable and decision.state in {PanelState.ISSUED, PanelState.DELIVERED},
        still_needed=max(decision.needed - len(decision.votes), 0),
        eligible=eligible,
        rejected_by=snapshot.rejected_by,
        rejection_reason=reveal_html(occurrence.rejection_reason),
        expires_in=expires_in,
        escalated=escalation_label(occurrence, now) if undecided else "",
        history=history,
        history_html=render_rows("approvals/history_rows.html", {"rows": history_rows(history)}),
        history_total=window.total,
        history_caption=history_caption(window),
        history_links=history_links(occurrence.pk, window),
        evidence=evidence,
        evidence_text=evidence_text(evidence),
        now=now,
        stamp=rendered,
        poll_url=poll_url,
        poll_seconds=PANEL_POLL_SECONDS,
        consumed_by_html=reveal_html(approval.consumed_by_execution if approval else ""),
    )


@dataclass(frozen=True)
class DiffRow:
    key: SafeString
    old: SafeString
    new: SafeString
    change: str  # added, removed, changed


def diff_rows(old: Proposal, new: Proposal) -> list[DiffRow]:
    """The arguments that differ between two versions, by name."""
    before, after = old.arguments, new.arguments
    rows = []
    for key in sorted(set(before) | set(after)):
        old_text = json_value(before[key]) if key in before else ""
        new_text = json_value(after[key]) if key in after else ""
        if key in before and key in after and old_text == new_text:
            continue
        change = "added" if key not in before else "removed" if key not in after else "changed"
        rows.append(DiffRow(reveal_html(key), reveal_html(old_text), reveal_html(new_text), change))
    return rows


def diff_base(proposals: list[Proposal], current: Proposal, since_digest: str) -> Proposal | None:
    """The version a diff starts from: the one the reviewer saw before, else the previous."""
    base = next(
        (p for p in proposals if p.action_digest == since_digest and p.pk != current.pk), None
    )
    if base is None and current.version > 1:
        base = next((p for p in proposals if p.version == current.version - 1), None)
    return base


def edit_initial(proposal: Proposal) -> dict[str, str]:
    """The edit form's starting text: the current arguments, hidden characters escaped."""
    arguments = json.dumps(proposal.arguments, indent=2, ensure_ascii=False)
    return {"arguments": plain_reveal(arguments), "action_digest": proposal.action_digest}


@dataclass(frozen=True)
class Requester:
    """``requested_by`` as the agent gave it, marked by the rule the notifications use
    (``approvals.access.requester``): a reviewer reads the same warning here as in her
    e-mail."""

    html: SafeString  # as given, hidden characters shown as \\uXXXX
    verified: bool  # names a member (username or email, after ``identity_key``)
    look_alike: bool  # could be taken for a console user's name it is not spelled as
    note: str  # what the messages say about it (plain text; escaped where shown)

    @property
    def given(self) -> bool:
        return bool(self.html)

    @property
    def unverified_note(self) -> str:
        """The unverified note without its label, which the page shows as a badge."""
        return self.note.removeprefix(UNVERIFIED)


def requester(requested_by: str, tenant_id: int, tenant_name: str) -> Requester:
    """The review page's requester: one read of the tenant's members, only when a requester
    is given."""
    marks = requester_marks(requested_by, tenant_id, tenant_name)
    return Requester(
        html=reveal_html(requested_by),
        verified=marks["verified"],
        look_alike=marks["look_alike"],
        note=marks["note"],
    )


def review_page(panel: DecisionPanel, *, since_digest: str = "") -> dict[str, Any]:
    """What the review page shows around the decision panel.

    Unlike the rest of this module it reads one thing: the tenant's members, to say whether
    ``requested_by`` names one of them (one query, only when a requester is given).
    """
    occurrence = panel.occurrence
    proposal = panel.proposal
    proposals = panel.proposals
    arguments = proposal.arguments
    flags = argument_flags(arguments)
    look_alike = {c for flag in flags for c in flag.word if not c.isascii() and not is_hidden(c)}
    action = reveal(pretty(proposal.canonical_action), look_alike)
    base = diff_base(proposals, proposal, since_digest)
    tool = occurrence.tool
    return {
        "tool": tool,
        "tenant": occurrence.tenant,
        "versions": len(proposals),
        "action_html": action.html,
        "hidden_chars": action.hidden,
        "look_alikes": flags,
        "money": money_lines(arguments),
        "reason_html": reveal_html(occurrence.reason),
        "requested_by_html": reveal_html(occurrence.requested_by),
        "requester": requester(
            occurrence.requested_by, occurrence.tenant_id, occurrence.tenant.name
        ),
        "run_id_html": reveal_html(occurrence.run_id),
        "diff_base": base,
        "diff_rows": diff_rows(base, proposal) if base else [],
        "since_mode": base is not None and base.action_digest == since_digest,
        "next_version": proposal.version + 1,
        "replay_help": REPLAY_SAFETY_HELP.get(ToolContract.ReplaySafety(tool.replay_safety), ""),
        "quorum_rule": quorum_rule(tool, arguments),
        "lifetime": duration(tool.approval_lifetime.total_seconds()),
    }
