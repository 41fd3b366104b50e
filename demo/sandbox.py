"""A sandbox payments service: a real HTTP server that the demo and the tests execute against.

It behaves like a small payments API (refunds keyed by ``Idempotency-Key``, an effect query,
a reversal) plus a webhook receiver that does not dedupe and verifies each message's
Standard Webhooks signature with the ``standardwebhooks`` package (a forged, unsigned or
replayed message, older than five minutes, is refused), and it misbehaves on request
(``POST /_sandbox/faults``) so that every ambiguous outcome an adapter must survive can be
produced on purpose: a refusal before any effect, or an effect whose answer never arrives.

State lives in one JSON file, rewritten atomically after every change, so the sandbox
survives its own restart and a test can count what really happened from outside the console.
It is a test double: the standard library's ``ThreadingHTTPServer``, bound to 127.0.0.1.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import signal
import socket
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from standardwebhooks import Webhook, WebhookVerificationError

HOST = "127.0.0.1"
DEFAULT_API_KEY = "sk_sandbox"
# The console's MESSAGES_WEBHOOK_SECRET under DEBUG.
DEFAULT_WEBHOOK_SECRET = "whsec_sandbox"
DEFAULT_HOLD_SECONDS = 30.0
WWW_AUTHENTICATE = 'Bearer realm="payments", error="invalid_token"'
MAX_BODY_BYTES = 1_000_000

# Faults that refuse the request before anything is created, with the status each answers.
REFUSING_FAULTS: dict[str, HTTPStatus] = {
    "unauthorized": HTTPStatus.UNAUTHORIZED,
    "unavailable": HTTPStatus.SERVICE_UNAVAILABLE,
    "declined": HTTPStatus.PAYMENT_REQUIRED,
}
# Faults that let the effect happen and then withhold the answer.
AFTER_EFFECT_FAULTS = ("timeout_after_effect", "reset_after_effect")
FAULT_MODES = (*REFUSING_FAULTS, *AFTER_EFFECT_FAULTS)

DROPPED = "dropped"


def default_data_path() -> Path:
    return Path(tempfile.gettempdir()) / "approval-console-sandbox-payments.json"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _empty_state() -> dict[str, Any]:
    return {
        "refunds": [],
        # idempotency key -> {"refund_id", "body"}: the body decides "same request" vs 409.
        "idempotency": {},
        "messages": [],
        "requests": [],
        "fault": None,
    }


class Store:
    """The sandbox's state, guarded by one lock and persisted after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.state = _empty_state()
        if path.exists():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            self.state.update(loaded)
            # A request still unanswered when the previous process died was never answered.
            for entry in self.state["requests"]:
                if entry["status"] is None:
                    entry["status"] = DROPPED
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            self._save()

    def _save(self) -> None:
        # Temp file + os.replace: a reader (or the next start) sees the old file or the new
        # one, never half of one. No fsync: the promise is surviving this process, not the OS.
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.state, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # -- control ---------------------------------------------------------------------------

    def snapshot(self, name: str) -> Any:
        with self.lock:
            return json.loads(json.dumps(self.state[name]))

    def reset(self) -> None:
        with self.lock:
            self.state = _empty_state()
            self._save()

    def set_fault(self, mode: str | None, times: int) -> dict[str, Any] | None:
        with self.lock:
            fault = {"mode": mode, "remaining": times} if mode and times > 0 else None
            self.state["fault"] = fault
            self._save()
            return fault

    def take_fault(self) -> str | None:
        """Consume one use of the pending fault, if any, and return its mode."""
        with self.lock:
            fault = self.state["fault"]
            if not fault:
                return None
            fault["remaining"] -= 1
            if fault["remaining"] <= 0:
                self.state["fault"] = None
            self._save()
            return str(fault["mode"])

    # -- request log -----------------------------------------------------------------------

    def log_request(self, method: str, path: str, key: str | None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "method": method,
            "path": path,
            "idempotency_key": key,
            "status": None,
            "fault": None,
        }
        with self.lock:
            self.state["requests"].append(entry)
            self._save()
        return entry

    def log_outcome(self, entry: dict[str, Any], *, status: int | str, fault: str | None) -> None:
        with self.lock:
            # After a reset the entry is no longer in the log; updating it is then harmless.
            entry["status"] = status
            entry["fault"] = fault
            self._save()

    # -- effects ---------------------------------------------------------------------------

    def refund_create(self, *, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            known = self.state["idempotency"].get(key)
            if known is not None:
                if known["body"] != body:
                    return HTTPStatus.CONFLICT, _error(
                        "idempotency_key_reused",
                        "This Idempotency-Key was used with a different request body.",
                    )
                return HTTPStatus.OK, self._refund(known["refund_id"])
            refund = {
                "id": f"re_{secrets.token_hex(12)}",
                "payment_id": body["payment_id"],
                "amount_minor": body["amount_minor"],
                "currency": body["currency"],
                "reason": body.get("reason"),
                "status": "succeeded",
                "idempotency_key": key,
                "created_at": _now(),
            }
            self.state["refunds"].append(refund)
            self.state["idempotency"][key] = {"refund_id": refund["id"], "body": body}
            self._save()
            return HTTPStatus.CREATED, dict(refund)

    def refund_by_key(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            known = self.state["idempotency"].get(key)
            return None if known is None else self._refund(known["refund_id"])

    def refund_reverse(self, refund_id: str) -> dict[str, Any] | None:
        with self.lock:
            for refund in self.state["refunds"]:
                if refund["id"] == refund_id:
                    if refund["status"] != "reversed":
                        refund["status"] = "reversed"
                        refund["reversal_id"] = f"rev_{secrets.token_hex(12)}"
                        refund["reversed_at"] = _now()
                        self._save()
                    return dict(refund)
            return None

    def _refund(self, refund_id: str) -> dict[str, Any]:
        return dict(next(r for r in self.state["refunds"] if r["id"] == refund_id))

    def message_record(
        self, *, key: str | None, signature: str | None, webhook_id: str, raw: str, body: Any
    ) -> dict[str, Any]:
        message = {
            "id": f"msg_{secrets.token_hex(12)}",
            "idempotency_key": key,
            "signature": signature,
            "webhook_id": webhook_id,
            "body": body,
            # The exact bytes received, so a test can check an HMAC over them.
            "raw_body": raw,
            "received_at": _now(),
        }
        with self.lock:
            self.state["messages"].append(message)
            self._save()
        return dict(message)


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class SandboxServer(ThreadingHTTPServer):
    """The HTTP server: one thread per connection, state in a :class:`Store`."""

    daemon_threads = True
    # Racing workers open many connections at once; the default backlog of 5 would refuse some.
    request_queue_size = 128

    def __init__(
        self,
        port: int,
        *,
        store: Store,
        api_key: str,
        hold_seconds: float,
        webhook_secret: str = DEFAULT_WEBHOOK_SECRET,
    ) -> None:
        self.store = store
        self.api_key = api_key
        # As Standard Webhooks tells a receiver: a whsec_ secret as it is, any other as its
        # bytes (the console signs with the same key).
        self.webhook = Webhook(
            webhook_secret if webhook_secret.startswith("whsec_") else webhook_secret.encode()
        )
        self.hold_seconds = hold_seconds
        # Set when the server stops, so a held answer does not keep the process alive.
        self.stopping = threading.Event()
        super().__init__((HOST, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: SandboxServer
    # HTTP/1.1 keep-alive, like a real API: clients pool connections, and the reset fault must
    # drop a connection the client expects to reuse.
    protocol_version = "HTTP/1.1"
    # An idle kept-alive connection is closed after this many seconds.
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: the request log at /_sandbox/requests is the record, and a chatty stderr can
        # fill a pipe nobody reads.
        return

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    # -- plumbing --------------------------------------------------------------------------

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        raw = self._read_body()
        if raw is None:
            self._send(Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _error("too_large", "")))
            return
        if url.path.startswith("/_sandbox/"):
            self._send(self._control(url.path, raw))
            return
        store = self.server.store
        query = parse_qs(url.query)
        # The effect query carries its key in the URL; the log shows it like a header's.
        key = self.headers.get("Idempotency-Key") or next(
            iter(query.get("idempotency_key", [])), None
        )
        entry = store.log_request(self.command, url.path, key)
        fault: str | None = None

        route = self._route(url.path)
        name = route[0].get(self.command) if route else None
        if route is None:
            reply = Reply(HTTPStatus.NOT_FOUND, _error("not_found", "No such endpoint."))
        elif name is None:
            reply = Reply(HTTPStatus.METHOD_NOT_ALLOWED, _error("method_not_allowed", ""))
        elif name != "message" and not self._authorized():
            # Messages authenticate by their signature, which _message verifies.
            reply = self._unauthorized("Missing or wrong API key.")
        else:
            arg = route[1]
            # Every POST under /v1 is a write a fault applies to: refunds, reversals, messages.
            fault = store.take_fault() if self.command == "POST" else None
            if fault in REFUSING_FAULTS:
                reply = self._refusal(fault)
            elif name == "create":
                reply = self._refund_create(raw)
            elif name == "query":
                reply = self._refund_query(query)
            elif name == "reverse":
                reply = self._refund_reverse(arg)
            else:
                reply = self._message(raw)

        if fault == "reset_after_effect":
            store.log_outcome(entry, status=DROPPED, fault=fault)
            self._drop_connection()
            return
        if fault == "timeout_after_effect" and self.server.stopping.wait(self.server.hold_seconds):
            store.log_outcome(entry, status=DROPPED, fault=fault)
            self._drop_connection()
            return
        store.log_outcome(entry, status=reply.status, fault=fault)
        self._send(reply)

    @staticmethod
    def _route(path: str) -> tuple[dict[str, str], str] | None:
        """{method: endpoint name} and the path argument for a /v1 path, or None."""
        parts = path.strip("/").split("/")
        if parts == ["v1", "refunds"]:
            return {"GET": "query", "POST": "create"}, ""
        if len(parts) == 4 and parts[:2] == ["v1", "refunds"] and parts[3] == "reversal":
            return {"POST": "reverse"}, parts[2]
        if parts == ["v1", "messages"]:
            return {"POST": "message"}, ""
        return None

    def _read_body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.server.api_key.encode()
        )

    def _send(self, reply: Reply) -> None:
        payload = json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            # The client gave up (e.g. its read timeout fired during a hold): nothing to tell.
            self.close_connection = True

    def _drop_connection(self) -> None:
        # SO_LINGER with a zero timeout makes close() send an RST instead of a FIN: the client
        # sees a reset connection, not a clean end of stream. rfile holds a reference to the
        # socket too, so both must be closed before the kernel lets go of it.
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.connection.close()

    # -- /v1 endpoints ---------------------------------------------------------------------

    def _unauthorized(self, message: str) -> Reply:
        return Reply(
            HTTPStatus.UNAUTHORIZED,
            _error("invalid_token", message),
            {"WWW-Authenticate": WWW_AUTHENTICATE},
        )

    def _refusal(self, fault: str) -> Reply:
        if fault == "unauthorized":
            return self._unauthorized("The API key was revoked (sandbox fault).")
        if fault == "unavailable":
            return Reply(
                HTTPStatus.SERVICE_UNAVAILABLE,
                _error("service_unavailable", "Try again later; nothing was done (sandbox fault)."),
                {"Retry-After": "1"},
            )
        return Reply(
            HTTPStatus.PAYMENT_REQUIRED,
            _error("declined", "Refused before any effect (sandbox fault)."),
        )

    def _refund_create(self, raw: bytes) -> Reply:
        key = self.headers.get("Idempotency-Key")
        if not key:
            return Reply(
                HTTPStatus.BAD_REQUEST,
                _error("idempotency_key_required", "Send an Idempotency-Key header."),
            )
        body, problem = _refund_body(raw)
        if problem:
            return Reply(HTTPStatus.BAD_REQUEST, _error("invalid_request", problem))
        status, answer = self.server.store.refund_create(key=key, body=body)
        return Reply(status, answer)

    def _refund_query(self, query: dict[str, list[str]]) -> Reply:
        key = (query.get("idempotency_key") or [""])[0]
        if not key:
            return Reply(
                HTTPStatus.BAD_REQUEST,
                _error("invalid_request", "Query by ?idempotency_key=."),
            )
        refund = self.server.store.refund_by_key(key)
        if refund is None:
            return Reply(HTTPStatus.NOT_FOUND, _error("not_found", "No refund with this key."))
        return Reply(HTTPStatus.OK, refund)

    def _refund_reverse(self, refund_id: str) -> Reply:
        refund = self.server.store.refund_reverse(refund_id)
        if refund is None:
            return Reply(HTTPStatus.NOT_FOUND, _error("not_found", "No such refund."))
        return Reply(HTTPStatus.OK, refund)

    def _message(self, raw: bytes) -> Reply:
        try:
            self.server.webhook.verify(raw, dict(self.headers.items()), json_parse=False)
        except WebhookVerificationError as exc:
            return Reply(HTTPStatus.UNAUTHORIZED, _error("invalid_signature", str(exc)))
        try:
            text = raw.decode("utf-8")
            body = json.loads(text)
        except ValueError:
            return Reply(HTTPStatus.BAD_REQUEST, _error("invalid_request", "Send a JSON body."))
        message = self.server.store.message_record(
            key=self.headers.get("Idempotency-Key"),
            signature=self.headers.get("X-Signature"),
            webhook_id=self.headers.get("webhook-id", ""),
            raw=text,
            body=body,
        )
        return Reply(HTTPStatus.ACCEPTED, {"id": message["id"]})

    # -- /_sandbox control -----------------------------------------------------------------

    def _control(self, path: str, raw: bytes) -> Reply:
        store = self.server.store
        held = {
            "/_sandbox/requests": "requests",
            "/_sandbox/refunds": "refunds",
            "/_sandbox/messages": "messages",
        }
        if self.command == "GET" and path in held:
            return Reply(HTTPStatus.OK, store.snapshot(held[path]))
        if self.command == "GET" and path == "/_sandbox/faults":
            return Reply(HTTPStatus.OK, store.snapshot("fault"))
        if self.command == "POST" and path == "/_sandbox/faults":
            try:
                body = json.loads(raw or b"{}")
                mode, times = body.get("mode"), body.get("times", 1)
            except (ValueError, AttributeError):
                mode, times = "", None
            if mode not in (*FAULT_MODES, None) or type(times) is not int or times < 0:
                return Reply(
                    HTTPStatus.BAD_REQUEST,
                    _error("invalid_request", f"mode is one of {', '.join(FAULT_MODES)}"),
                )
            return Reply(HTTPStatus.OK, {"fault": store.set_fault(mode, times)})
        if self.command == "POST" and path == "/_sandbox/reset":
            store.reset()
            return Reply(HTTPStatus.OK, {"reset": True})
        return Reply(HTTPStatus.NOT_FOUND, _error("not_found", "No such endpoint."))


def _refund_body(raw: bytes) -> tuple[dict[str, Any], str]:
    """The parsed refund request and "" or, when it is unusable, {} and what is wrong."""
    try:
        body = json.loads(raw)
    except ValueError:
        return {}, "Send a JSON body."
    if not isinstance(body, dict):
        return {}, "Send a JSON object."
    if not isinstance(body.get("payment_id"), str) or not body["payment_id"]:
        return {}, "payment_id is a non-empty string."
    amount = body.get("amount_minor")
    if type(amount) is not int or amount <= 0:
        return {}, "amount_minor is a positive integer."
    if not isinstance(body.get("currency"), str) or not body["currency"]:
        return {}, "currency is a non-empty string."
    if body.get("reason") is not None and not isinstance(body["reason"], str):
        return {}, "reason is a string."
    return body, ""


def serve(
    *,
    port: int,
    data_path: Path,
    api_key: str,
    hold_seconds: float = DEFAULT_HOLD_SECONDS,
    webhook_secret: str = DEFAULT_WEBHOOK_SECRET,
    on_listening: Callable[[str], None] = print,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly. Must run in the main thread."""
    server = SandboxServer(
        port,
        store=Store(data_path),
        api_key=api_key,
        hold_seconds=hold_seconds,
        webhook_secret=webhook_secret,
    )
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    # serve_forever runs in a thread because shutdown() blocks until it returns, so it cannot
    # be called from a signal handler running on the serving thread.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        on_listening(f"http://{HOST}:{server.server_port}")
        stop.wait()
    finally:
        server.stopping.set()
        server.shutdown()
        thread.join()
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
