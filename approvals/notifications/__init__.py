"""Notifications: reviewers hear of requests in the tools they already watch.

A request's proposal (and its escalation, and its decision) writes one
``NotificationEvent`` in its own transaction: the outbox (``outbox``). After commit a
Celery task fans it out (``fanout``) into ``NotificationDelivery`` rows, one per channel and
recipient:

- **e-mail** to each reviewer the request is routed to (plain text and HTML, with a link
  to the review page; never a token), per the reviewer's preference: every request, a
  digest every N minutes (``digest``, sent by Celery beat), or nothing; quiet hours in
  their time zone defer it to the end of the quiet hours;
- **console**: the header's unread count;
- **Slack**: the routed groups' incoming webhooks (the action's summary, amount,
  requester, the digest's first 12 characters, a link), and again when it is decided;
  a group's Slack app (``slack_app``) says the same, the decision a reply in the
  request's thread;
- **webhook**: the routed groups' generic webhooks, signed with Standard Webhooks as
  callbacks are.

Each delivery is sent by the outbox mechanism callbacks use (``approvals.outbound.
outbox``): leased, sent once outside any transaction, every attempt recorded, retried after
1, 2, 4 … ``NOTIFY_RETRY_BACKOFF_SECONDS`` up to ``NOTIFY_MAX_ATTEMPTS``; a group whose
channel keeps failing shows on the routing page. Arguments a contract marks sensitive
(``ToolContract.sensitive_arguments``) are left out of every message (``content``).
"""
