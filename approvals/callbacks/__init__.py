"""Push: each decision on a runtime's request POSTed to the callback URL it registered.

A runtime key may register one callback URL (``PUT /api/v1/callback``); the answer carries
a signing secret, once. Every decision on an occurrence the key proposed (approved,
rejected, expired, edited) becomes a ``CallbackDelivery`` row in the transaction that
decided it (an outbox, written by the deciding service through ``approvals.callbacks.outbox``),
and a Celery task POSTs it after commit::

    POST <url>
    Content-Type: application/json
    webhook-id: <delivery id>                   (the same on every retry: deduplicate on it)
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>
    X-Console-Delivery: <delivery id>
    X-Console-Timestamp: <unix seconds>
    X-Console-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>

The ``webhook-*`` headers are Standard Webhooks' (``approvals.outbound.signing``): a
receiver checks them with ``standardwebhooks.Webhook(secret).verify(body, headers)``. The
``X-Console-*`` ones are the console's from before, over the same body and timestamp, kept
so receivers written for them keep working.

A 2xx answer delivers it. Anything else (another status, a timeout, a refused connection)
is recorded as an attempt and retried after 2, 4, 8 … seconds, up to
``CALLBACK_MAX_ATTEMPTS``; then the delivery is ``failed`` and the runtime is expected to
read the occurrence (``GET /api/v1/occurrences/{id}``), which holds the same facts.
Delivery is at least once: a worker that dies mid-call leaves the delivery leased, and
the sweep tries it again once the lease ran out.

The secret is stored encrypted (``approvals.access.encryption``: Fernet under keys derived
from ``SECRET_KEY``, readable with ``SECRET_KEY_FALLBACKS`` after a rotation): the console
must sign with it, so a hash would not do.

"""
