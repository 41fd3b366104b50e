"""What the bulk review page shows of each selected request: its exact canonical JSON
(indented, as the review page shows it) and full digest, the arguments in which the
requests differ, highlighted, and whether it can still be decided."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

from approvals.canonical.confusables import is_hidden, same_person
from approvals.canonical.form import pretty
from approvals.models import Occurrence, Proposal
from approvals.reviews.bulk import BulkResult
from approvals.web.links import occurrence_path
from approvals.web.money import MoneyLine, money_lines
from approvals.web.shell import Notice, age
from approvals.web.text import argument_flags, json_value, reveal, reveal_html

# A top-level argument's line in ``pretty``'s output: four spaces, then its key.
_ARGUMENT_KEY = re.compile(r'^    ("(?:[^"\\]|\\.)*"): ')
_ARGUMENTS_OPEN = '  "arguments": {'


def differing_keys(argument_sets: Sequence[dict[str, Any]]) -> list[str]:
    """The top-level arguments whose value is not the same in every request (missing in
    some counts as different), in the order they first appear."""
    keys: list[str] = []
    for arguments in argument_sets:
        keys.extend(k for k in arguments if k not in keys)
    missing = object()
    return [
        key
        for key in keys
        if len(
            {json.dumps(a.get(key, missing), sort_keys=True, default=repr) for a in argument_sets}
        )
        > 1
    ]


def marked_action(canonical: str, differing: set[str], look_alike: set[str]) -> SafeString:
    """The canonical action indented for reading (``pretty``: exactly the digested values),
    escaped, hidden characters revealed, and the lines of the ``differing`` arguments
    wrapped in ``<mark class="bulk-diff">``."""
    lines: list[SafeString] = []
    inside, current = False, ""
    for line in pretty(canonical).split("\n"):
        if line == _ARGUMENTS_OPEN:
            inside, current = True, ""
        elif inside and not line.startswith("    "):
            inside, current = False, ""
        elif inside and (found := _ARGUMENT_KEY.match(line)):
            current = json.loads(found.group(1))
        if inside and current in differing:
            text = line.lstrip(" ")
            indent = line[: len(line) - len(text)]
            lines.append(
                format_html(
                    '{}<mark class="bulk-diff">{}</mark>', indent, reveal(text, look_alike).html
                )
            )
        else:
            lines.append(reveal(line, look_alike).html)
    return SafeString("\n".join(lines))


@dataclass(frozen=True)
class BulkRow:
    occurrence: Occurrence
    proposal: Proposal
    action_html: SafeString
    differences: list[tuple[SafeString, SafeString]]  # the differing arguments and values
    money: list[MoneyLine]
    requested_by: SafeString
    run_id: SafeString
    age: str
    hidden: int  # hidden characters revealed in the action
    look_alike: bool
    refused: bool  # the request the last submission was refused for
    own: str = ""  # why the viewer may not approve it (their request, their edit), or ""

    @property
    def pending(self) -> bool:
        return self.occurrence.status == Occurrence.Status.PENDING_REVIEW

    @property
    def state_label(self) -> str:
        return self.occurrence.get_status_display()

    @property
    def item(self) -> str:
        """What the form sends back for this request: which version, with which digest."""
        return f"{self.occurrence.pk}:{self.proposal.version}:{self.proposal.action_digest}"

    @property
    def href(self) -> str:
        return occurrence_path("approvals:review", self.occurrence.pk)


def _requests(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'}"


def decided_notice(result: BulkResult, approved: bool) -> Notice:
    """What a written batch says: how many were approved (or rejected), how many still
    need another reviewer's vote (their quorum), and the batch's id as the audit has it."""
    total = len(result.decided)
    if approved:
        text = f"Approved {result.issued} of {_requests(total)}"
        waiting = total - result.issued
        if waiting:
            text += f"; {waiting} still need{'s' if waiting == 1 else ''} another reviewer"
    else:
        text = f"Rejected {_requests(total)}"
    return Notice("success", f"{text} (batch {str(result.batch_id)[:8]}).")


@dataclass(frozen=True)
class Reader:
    """Who reads the page: the self-approval rule's identities."""

    pk: Any
    username: str
    email: str = ""

    def own(self, occurrence: Occurrence, proposal: Proposal) -> str:
        if same_person(occurrence.requested_by, self.username, self.email):
            return "You requested this one, so another reviewer must approve it."
        if proposal.edited_by_id is not None and proposal.edited_by_id == self.pk:
            return "You wrote this version, so another reviewer must approve it."
        return ""


def bulk_rows(
    occurrences: Sequence[Occurrence],
    *,
    reader: Reader,
    refused: uuid.UUID | None,
    now: datetime,
) -> tuple[list[BulkRow], list[str]]:
    """One row per request (each loaded by ``approvals.web.selectors.bulk``), and the
    arguments in which they differ."""
    current = [(o, o.current_proposals[0]) for o in occurrences if o.current_proposals]  # type: ignore[attr-defined]
    arguments = {o.pk: p.arguments for o, p in current}
    differing = differing_keys(list(arguments.values())) if len(current) > 1 else []
    rows = []
    for occurrence, proposal in current:
        args = arguments[occurrence.pk]
        flags = argument_flags(args)
        look_alike = {
            c for flag in flags for c in flag.word if not c.isascii() and not is_hidden(c)
        }
        action = reveal(pretty(proposal.canonical_action), look_alike)
        rows.append(
            BulkRow(
                occurrence=occurrence,
                proposal=proposal,
                action_html=marked_action(proposal.canonical_action, set(differing), look_alike),
                differences=[
                    (
                        reveal_html(key),
                        reveal_html(json_value(args[key])) if key in args else SafeString("—"),
                    )
                    for key in differing
                ],
                money=money_lines(args),
                requested_by=reveal_html(occurrence.requested_by),
                run_id=reveal_html(occurrence.run_id),
                age=age(occurrence.created_at, now),
                hidden=action.hidden,
                look_alike=bool(flags),
                refused=occurrence.pk == refused,
                own=reader.own(occurrence, proposal),
            )
        )
    return rows, differing
