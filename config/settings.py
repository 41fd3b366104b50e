"""One settings module for every environment, read from the environment.

The defaults run the console locally on SQLite with an in-memory Celery broker, so that
``bin/demo`` needs no server. Tests and production set ``DATABASE_URL`` to PostgreSQL.

With ``DEBUG`` off the settings refuse to load without a secret key of the deployment's
own, and a variable that cannot be parsed is an error rather than a silent default.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
import structlog
from csp.constants import NONE, SELF

# The environment's readers; DEVELOPMENT_SECRET_KEY and GENERATE_SECRET_KEY are read from
# here by tests and the error messages.
from config.environment import (  # noqa: F401
    DEVELOPMENT_SECRET_KEY,
    GENERATE_SECRET_KEY,
    _env,
    debug_hosts,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_proxy_ssl_header,
    env_redis_url,
    secret_key,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = secret_key(debug=DEBUG)
# Earlier secret keys, newest first (comma-separated): what they signed (sessions, password
# reset links) and the secrets stored encrypted under them (approvals.access.encryption)
# still read. Rotating: the new key in SECRET_KEY, the old one here; once
# `manage.py reencrypt_secrets` has run and the old sessions have expired, drop it.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS")
ALLOWED_HOSTS = debug_hosts(env_list("ALLOWED_HOSTS", "127.0.0.1,localhost"), debug=DEBUG)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "csp",
    "ninja",
    "axes",
    "approvals",
    "reconciliation",
    # The MCP gateway (manage.py mcp_gateway): above both, its journal in this database.
    "gateway",
    # The console's own system checks (config/checks.py).
    "config.apps.ConsoleConfig",
]
# The demo (a sandbox payments service, seed data, a simulated agent: the demo app and its
# management commands) is installed for bin/demo and the tests, never in production.
CONSOLE_DEMO = env_bool("CONSOLE_DEMO", DEBUG)
if CONSOLE_DEMO:
    INSTALLED_APPS.append("demo")

MIDDLEWARE = [
    "approvals.web.middleware.TraceIdMiddleware",
    "approvals.web.middleware.NoStoreMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the app itself (hashed, compressed), before sessions and the rest.
    "config.staticfiles.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # The console's 404 and 500 pages under DEBUG too (config/errors.py).
    "config.errors.ErrorPagesMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
    # The long tables' rows, in templates/jinja2/ (approvals.web.jinja); autoescape is on.
    {
        "BACKEND": "django.template.backends.jinja2.Jinja2",
        "NAME": "jinja2",
        "DIRS": [BASE_DIR / "templates" / "jinja2"],
        "APP_DIRS": False,
        "OPTIONS": {"environment": "approvals.web.jinja.environment", "autoescape": True},
    },
]

# Served by config/asgi.py (set there): every request runs in a thread of its own that ends
# with it, so a connection kept for the thread would be left behind. There, none is kept
# and requests borrow from a psycopg pool per process instead (Django's advice for ASGI).
SERVED_BY_ASGI = os.environ.get("CONSOLE_SERVED_BY_ASGI") == "1"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        # Kept between requests (a new PostgreSQL connection per request costs more than the
        # request): one per gunicorn thread. Not under runserver, which starts a thread per
        # request, nor under ASGI (above). A Celery worker's is closed after each task
        # anyway (Celery's Django fixup).
        conn_max_age=0 if SERVED_BY_ASGI else env_int("CONN_MAX_AGE", 0 if DEBUG else 60),
        # A persistent connection is checked before a request uses it, so the first request
        # after the database comes back reconnects instead of failing on the dead one.
        # Under ASGI, a connection is checked when borrowed from the pool, so a restarted
        # database costs one failed check, not a request. Either check reads the socket
        # first and asks the server only if it has something to say (config/postgresql).
        conn_health_checks=True,
    )
}
if SERVED_BY_ASGI and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Per process: DB_POOL_MAX connections at most (plan WEB_CONCURRENCY x DB_POOL_MAX below
    # max_connections); a request waits up to DB_POOL_TIMEOUT seconds for one, then fails.
    # The pool's connections are checked by the backend when borrowed (above), not by
    # psycopg_pool's round trip, which Django would hand the pool with this on.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env_int("DB_POOL_MIN", 2),
        "max_size": env_int("DB_POOL_MAX", 10, minimum=1),
        "timeout": env_int("DB_POOL_TIMEOUT", 10, minimum=1),
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, with timestamps parsed by Python's C ISO parser instead of Django's
    # pure-Python loader (config/postgresql/base.py).
    DATABASES["default"]["ENGINE"] = "config.postgresql"
    if env_bool("DB_PREPARED_STATEMENTS", True):
        # Parameters travel apart from the SQL (server-side binding), so a statement's text
        # is the same on every request, and psycopg prepares it on its connection after
        # DB_PREPARE_THRESHOLD uses: PostgreSQL then skips parsing and, mostly, planning.
        # Measured with bench/page_bench.py: a review page's SQL went from 7.6 to 3.0 ms.
        # Off (DB_PREPARED_STATEMENTS=0) behind a pooler that does not keep prepared
        # statements per client (PgBouncer before 1.21 in transaction mode).
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=True,
            prepare_threshold=env_int("DB_PREPARE_THRESHOLD", 5),
        )
# Seconds a client is asked to wait (Retry-After) when the database is unavailable: the
# API answers 503 database_unavailable and the console a "temporarily unavailable" page.
DATABASE_RETRY_AFTER_SECONDS = env_int("DATABASE_RETRY_AFTER_SECONDS", 5, minimum=1)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The inbox's indexes include updated_at (index-only counts on PostgreSQL); SQLite, the demo's
# database, ignores included columns, which is all this check would say.
SILENCED_SYSTEM_CHECKS = ["models.W040"]

# Django's four validators. They apply where Django applies them: password forms (the
# admin's, a password change) and createsuperuser, and ``add_member``, which calls
# validate_password for every user it creates. ``seed_demo`` (the demo's published
# passwords) and the tests create users with create_user, which validates nothing.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env_int("PASSWORD_MIN_LENGTH", 12, minimum=8)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Sign-in throttling (django-axes, approvals/auth.py): after AXES_FAILURE_LIMIT failed
# sign-ins for one username from one address, that pair is locked out for the cool-off,
# which each further failure starts again; the right password does not sign in meanwhile.
# Attempts are rows in the database, shared by every web process.
AUTHENTICATION_BACKENDS = [
    "approvals.web.auth.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("AXES_COOLOFF_SECONDS", 15 * 60, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "approvals.web.auth.lockout_response"
# The client address is REMOTE_ADDR. Behind a reverse proxy that is the proxy's address,
# so the lockout becomes one per username (still a lockout, but anyone can then pause a
# known username's sign-in); see docs/security.md.
AXES_VERBOSE = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(_env("STATIC_ROOT") or BASE_DIR / "staticfiles")
# collectstatic writes hashed, compressed copies and a manifest to STATIC_ROOT, and
# WhiteNoise serves them with far-future caching (config/staticfiles.py). Before it has run
# (the demo, the tests, the benchmarks) names stay as they are and WhiteNoise finds the
# files in static/ on each request.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.staticfiles.ConsoleStaticFilesStorage"},
}
_STATIC_COLLECTED = (STATIC_ROOT / "staticfiles.json").is_file()
WHITENOISE_USE_FINDERS = DEBUG or not _STATIC_COLLECTED
WHITENOISE_AUTOREFRESH = DEBUG or not _STATIC_COLLECTED

LOGIN_URL = "/accounts/login/"
# Only where a view does not choose: the sign-in lands each role on its own home
# (approvals.web.home.ConsoleLoginView).
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# The agent API refuses bodies above 64 KiB before parsing them.
API_MAX_BODY_BYTES = 64 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES

# Requests per runtime key per window (fixed windows; a tenant's own limit, set in the
# admin, wins); beyond it the API answers 429 rate_limited with Retry-After. Counted in
# Redis when there is one (API_RATE_LIMIT_REDIS_URL, below), else in the database, one
# atomic upsert per request; either way the limit holds across web processes
# (approvals/access/ratelimit.py).
API_RATE_LIMIT = env_int("API_RATE_LIMIT", 600, minimum=1)
API_RATE_WINDOW_SECONDS = env_int("API_RATE_WINDOW_SECONDS", 60, minimum=1)
# GET /api/v1/occurrences/{id}?wait=N (approvals/longpoll.py): the longest wait a client may
# ask for, and how often a waiter reads when it cannot be woken by PostgreSQL's LISTEN
# (SQLite, a LISTEN connection being re-made, or a WSGI server, where each waiter holds a
# thread). A long-poll counts as one request against the key's rate limit.
LONG_POLL_MAX_SECONDS = env_int("LONG_POLL_MAX_SECONDS", 60, minimum=1)
LONG_POLL_FALLBACK_SECONDS = env_int("LONG_POLL_FALLBACK_SECONDS", 2, minimum=1)
# Claims refused with a token the tenant never issued: audited one by one up to this many
# per key and window; the rest are counted into one security.refusals_burst event.
API_AUDITED_REFUSALS_PER_WINDOW = env_int("API_AUDITED_REFUSALS_PER_WINDOW", 20)
# Seconds a web process may answer a runtime key from memory instead of reading its row
# (approvals/keycache.py): a deactivated key is refused everywhere within this, at most 1;
# 0 reads the row on every request.
RUNTIME_KEY_CACHE_SECONDS = env_float("RUNTIME_KEY_CACHE_SECONDS", 1.0)
# How long after a deactivation an admin may reactivate the key (undo a mistaken click);
# afterwards a deactivated key stays so, and the runtime needs a new one.
RUNTIME_KEY_REACTIVATION_HOURS = env_float("RUNTIME_KEY_REACTIVATION_HOURS", 24.0)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
# Secure cookies unless DEBUG: a cookie sent over plain HTTP can be read, and one set over
# plain HTTP (or from a sibling subdomain) can be planted. Turning them off is for a
# deployment that is reached over plain HTTP on purpose.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
# A reviewer's session is a working day, not Django's two weeks.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 60 * 60, minimum=60)
# Flash messages live in the server-side session rather than in a cookie of their own: a
# messages cookie is only as trustworthy as SECRET_KEY, and it carries a message's
# "safe HTML" mark, so whoever knows the key could plant markup in the page.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
# Off by default because they depend on how TLS reaches the process (a proxy in front of
# it, or not); docs/deploy.md's production environment turns them on.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("SECURE_PROXY_SSL_HEADER")
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# A load balancer probes over plain HTTP behind the TLS proxy: no redirect for its probes.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# Scripts only from our own origin: no inline scripts, no eval, no CDN.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "memory://")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Redis (and the filesystem transport) hand an unacknowledged message to another worker
# after this many seconds. It must be longer than any delivery takes (the adapter's
# timeouts bound a call), or a slow delivery is redelivered while it runs; that redelivery
# is then recorded and resolved by the contract (see reconciliation.dispatch), never a
# blind second call.
CELERY_VISIBILITY_TIMEOUT = env_int("CELERY_VISIBILITY_TIMEOUT", 300, minimum=1)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT
}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = os.environ.get("CELERY_FILESYSTEM_DIR", str(BASE_DIR / ".celery-queue"))
    CELERY_BROKER_TRANSPORT_OPTIONS.update(
        {
            "data_folder_in": _queue_dir,
            "data_folder_out": _queue_dir,
            # Broadcasts (worker control) too, or kombu writes them to ./control.
            "control_folder": os.path.join(_queue_dir, "control"),
        }
    )
CELERY_BEAT_SCHEDULE = {
    "chain-the-audit-trail": {"task": "approvals.tasks.audit_chain_extend_all", "schedule": 5.0},
    "expire-what-the-clock-expired": {
        "task": "approvals.tasks.approvals_expire",
        "schedule": env_float("APPROVAL_EXPIRY_SWEEP_SECONDS", 60.0, minimum=0.1),
    },
    "review-deadlines": {
        "task": "approvals.tasks.review_deadlines_sweep",
        "schedule": env_float("REVIEW_DEADLINES_SWEEP_SECONDS", 10.0, minimum=0.1),
    },
    "escalate-what-nobody-took": {
        "task": "reconciliation.tasks.operations_escalate",
        "schedule": 60.0,
    },
    "sweep-the-outbox": {
        "task": "reconciliation.tasks.commands_sweep",
        "schedule": env_float("DISPATCH_SWEEP_EVERY_SECONDS", 10.0, minimum=0.1),
    },
    "push-what-was-not-pushed": {"task": "approvals.tasks.callbacks_sweep", "schedule": 15.0},
    "notify-what-was-not-notified": {
        "task": "approvals.notifications.sweep",
        "schedule": env_float("NOTIFY_SWEEP_SECONDS", 15.0, minimum=0.1),
    },
    "send-notification-digests": {
        "task": "approvals.notifications.digests",
        "schedule": env_float("NOTIFY_DIGEST_SWEEP_SECONDS", 60.0, minimum=0.1),
    },
    "report-refusal-bursts": {
        "task": "approvals.ratelimit.usage_report_closed",
        "schedule": float(API_RATE_WINDOW_SECONDS),
    },
}
# Push callbacks (approvals.callbacks): each decision POSTed to the URL a runtime key
# registered, signed, retried after 2, 4, 8 ... s up to CALLBACK_MAX_ATTEMPTS. Plain http
# and loopback or private addresses only where the operator allows them (the demo does).
CALLBACK_MAX_ATTEMPTS = env_int("CALLBACK_MAX_ATTEMPTS", 8, minimum=1)
CALLBACK_RETRY_BACKOFF_SECONDS = env_float("CALLBACK_RETRY_BACKOFF_SECONDS", 2.0, minimum=0.0)
CALLBACK_SWEEP_GRACE_SECONDS = env_float("CALLBACK_SWEEP_GRACE_SECONDS", 10.0, minimum=0.0)
CALLBACK_ALLOW_HTTP = env_bool("CALLBACK_ALLOW_HTTP", DEBUG)
CALLBACK_ALLOW_PRIVATE_HOSTS = env_bool("CALLBACK_ALLOW_PRIVATE_HOSTS", DEBUG)
# Callback deliveries run on a queue of their own, so that a slow receiver never delays a
# command's execution (the default queue, "celery"). Every deployment runs a worker that
# consumes it: bin/serve starts one (CALLBACK_CONCURRENCY processes) beside the main worker.
# CELERY_QUEUE and CALLBACKS_QUEUE rename both queues, for consoles that share one broker
# (bin/serve's workers consume the names set; bench/http_bench.py --with-worker uses its own).
CELERY_TASK_DEFAULT_QUEUE = _env("CELERY_QUEUE") or "celery"
CALLBACKS_QUEUE = _env("CALLBACKS_QUEUE") or "callbacks"
CELERY_TASK_ROUTES = {
    "approvals.tasks.callback_deliver": {"queue": CALLBACKS_QUEUE},
    "approvals.tasks.callbacks_sweep": {"queue": CALLBACKS_QUEUE},
    # Notifications call out too (SMTP, Slack, webhooks): beside the callbacks.
    "approvals.notifications.*": {"queue": CALLBACKS_QUEUE},
}
# Notifications (approvals.notifications): retried after 2, 4, 8 ... s up to
# NOTIFY_MAX_ATTEMPTS, every attempt recorded; e-mail through Django's EMAIL_* settings.
NOTIFY_MAX_ATTEMPTS = env_int("NOTIFY_MAX_ATTEMPTS", 6, minimum=1)
NOTIFY_RETRY_BACKOFF_SECONDS = env_float("NOTIFY_RETRY_BACKOFF_SECONDS", 2.0, minimum=0.0)
NOTIFY_SWEEP_GRACE_SECONDS = env_float("NOTIFY_SWEEP_GRACE_SECONDS", 10.0, minimum=0.0)
# An event with at most this many deliveries due at once is sent by its fan-out task
# itself (one task a request instead of one more a delivery); 0 publishes each.
NOTIFY_INLINE_DELIVERIES = env_int("NOTIFY_INLINE_DELIVERIES", 5, minimum=0)
# A group's Slack app posts through Slack's Web API here (chat.postMessage); tests point it
# at a local receiver. Its address follows the callbacks' rules (CALLBACK_ALLOW_PRIVATE_HOSTS).
SLACK_API_URL = _env("SLACK_API_URL") or "https://slack.com/api"
# The outbox is drained by one task for many events (approvals/notifications/drain.py): a
# commit publishes a drain only while none is pending, which a marker in a cache every
# process shares says (Django's cache.add). Redis: NOTIFY_DRAIN_REDIS_URL, or the broker's
# when it is Redis. Without one ("none", or the demo's filesystem broker) the marker's cache
# is Django's dummy one, whose add() always succeeds: every commit publishes a drain.
_drain_redis = env_redis_url(
    "NOTIFY_DRAIN_REDIS_URL",
    broker_url=CELERY_BROKER_URL,
    without="for every commit to publish a drain",
)
NOTIFY_DRAIN_CACHE = "notifications-drain"
# A drain message lost after its marker was set: the marker expires after this, and the
# sweep fans out what waited longer than NOTIFY_SWEEP_GRACE_SECONDS meanwhile.
NOTIFY_DRAIN_MARKER_SECONDS = env_int("NOTIFY_DRAIN_MARKER_SECONDS", 30, minimum=1)
# Events a drain reads at once, and at most how many batches one drain task takes before it
# publishes the next drain (so that one task never runs for ever).
NOTIFY_DRAIN_BATCH = env_int("NOTIFY_DRAIN_BATCH", 50, minimum=1)
NOTIFY_DRAIN_MAX_BATCHES = env_int("NOTIFY_DRAIN_MAX_BATCHES", 10, minimum=1)
CACHES: dict[str, dict[str, object]] = {
    # Django's own default, said aloud: nothing else in the console caches through Django.
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    NOTIFY_DRAIN_CACHE: (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _drain_redis,
            "KEY_PREFIX": f"console:notify:{CALLBACKS_QUEUE}",
            "OPTIONS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        }
        if _drain_redis
        else {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}
    ),
}
EMAIL_BACKEND = _env("EMAIL_BACKEND") or "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = _env("EMAIL_HOST") or "localhost"
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = _env("EMAIL_HOST_USER") or ""
EMAIL_HOST_PASSWORD = _env("EMAIL_HOST_PASSWORD") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
# The file backend's directory (the demo's catcher, /_demo/outbox, reads it).
EMAIL_FILE_PATH = _env("EMAIL_FILE_PATH") or str(BASE_DIR / ".mail")
DEFAULT_FROM_EMAIL = _env("DEFAULT_FROM_EMAIL") or "Approval console <console@localhost>"
# The Redis the rate limit counts in (approvals/access/ratecounter.py): a request within
# its limit then writes nothing to the database. Unset, the broker's when it is Redis;
# "none" (or no Redis broker) counts in the database, as the demo on SQLite does.
_rate_limit_redis = env_redis_url(
    "API_RATE_LIMIT_REDIS_URL", broker_url=CELERY_BROKER_URL, without="to count in the database"
)
API_RATE_LIMIT_REDIS_URL = _rate_limit_redis
API_RATE_LIMIT_REDIS_PREFIX = _env("API_RATE_LIMIT_REDIS_PREFIX") or "console:ratelimit"
# Task modules beyond the apps' tasks.py (which autodiscovery finds).
CELERY_IMPORTS = [
    "approvals.access.ratelimit",
    "approvals.callbacks.tasks",
    "approvals.notifications.tasks",
]
# A console-executed command still pending this long after its last change was never
# delivered (its announcement was lost): the sweep delivers it.
DISPATCH_SWEEP_GRACE_SECONDS = env_int("DISPATCH_SWEEP_GRACE_SECONDS", 10)

# The operators' queue lists a command still sending or pending this long as stuck; an
# operator's compensation call still unfinished this long is given up as abandoned (the
# request that made it died), so that another may be made.
OPERATIONS_STUCK_SECONDS = env_int("OPERATIONS_STUCK_SECONDS", 120)
# An operator's "I'm on it" lapses this long after it was taken or last renewed (by the
# database's clock), so that an item nobody works on shows as unowned again.
OPERATIONS_TAKE_MINUTES = env_int("OPERATIONS_TAKE_MINUTES", 30)
# Console pages link here in escalation messages.
CONSOLE_BASE_URL = _env("CONSOLE_BASE_URL") or "http://127.0.0.1:8000"

# /metrics answers only `Authorization: Bearer <this>`; unset, the endpoint is off (404).
METRICS_TOKEN = _env("METRICS_TOKEN") or ""

# Adapters. Every HTTP call has explicit timeouts: past the read timeout the outcome is
# unknown, never a worker waiting for ever.
ADAPTER_CONNECT_TIMEOUT = env_float("ADAPTER_CONNECT_TIMEOUT", 3.0, minimum=0.1)
ADAPTER_READ_TIMEOUT = env_float("ADAPTER_READ_TIMEOUT", 10.0, minimum=0.1)
# Every outbound call (adapters, callbacks, escalation; approvals/outbound/client.py) ends
# this many seconds after it started, however its receiver dribbles, and reads at most this
# much of an answer: a slow or huge receiver holds a worker for a bounded time and memory.
OUTBOUND_DEADLINE_SECONDS = env_float("OUTBOUND_DEADLINE_SECONDS", 30.0, minimum=0.1)
OUTBOUND_MAX_RESPONSE_BYTES = env_int("OUTBOUND_MAX_RESPONSE_BYTES", 1024 * 1024, minimum=1024)
# The adapters' calls share one client per worker process, which reuses a connection to the
# remote only within this many seconds of its last answer (0: a new connection every call).
# Keep it below the remote's own keep-alive timeout (nginx 75 s, gunicorn 2 s): a connection
# the remote closes as a call goes out makes that call's outcome unknown.
ADAPTER_KEEPALIVE_SECONDS = env_float("ADAPTER_KEEPALIVE_SECONDS", 1.0, minimum=0.0)
# Still sending this long after its last call started: no call can still be in flight (the
# deadline above ends it; the margin lets a live worker record the answer), so its worker
# died, and the outbox sweep delivers it again, whose own rules decide what runs (a query,
# a call under the same key, or outcome unknown). With the sweep every 10 s, a worker's
# death mid-call is settled within about 50 s, not the broker's visibility timeout.
DISPATCH_STUCK_SENDING_SECONDS = env_int(
    "DISPATCH_STUCK_SENDING_SECONDS", int(OUTBOUND_DEADLINE_SECONDS) + 10, minimum=1
)
# The URLs default to the sandbox (manage.py run_sandbox_payments) only where the demo is
# installed (bin/demo, the tests): a deployment names its payments API and webhook, and a
# missing one is a system check error (config/checks.py), never a call to the loopback.
# Without a secret of its own an adapter call is refused by the remote (recorded as an
# authentication challenge) rather than signed with a value published in this file.
SANDBOX_URL = "http://127.0.0.1:8100"
PAYMENTS_URL = _env("PAYMENTS_URL") or (SANDBOX_URL if CONSOLE_DEMO else "")
PAYMENTS_API_KEY = _env("PAYMENTS_API_KEY") or ("sk_sandbox" if DEBUG else "")
MESSAGES_WEBHOOK_URL = _env("MESSAGES_WEBHOOK_URL") or (
    f"{SANDBOX_URL}/v1/messages" if CONSOLE_DEMO else ""
)
MESSAGES_WEBHOOK_SECRET = _env("MESSAGES_WEBHOOK_SECRET") or ("whsec_sandbox" if DEBUG else "")

LOG_LEVEL = os.environ.get("LOG_LEVEL", "DEBUG" if DEBUG else "INFO")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {
            "()": structlog.stdlib.ProcessorFormatter,
            # Aligned key=value columns for people at a terminal; one JSON object per line
            # everywhere else, which is cheaper to render and what log collectors parse.
            # In JSON, an exception is its formatted traceback ("exception"): Django's
            # "Internal Server Error" lines (django.request) carry exc_info.
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.dev.ConsoleRenderer(colors=False),
            ]
            if DEBUG
            else [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            # Lines from the standard library's loggers (django.request among them) carry
            # the request's trace id too, so a 500 in the log matches the X-Trace-Id the
            # client saw.
            "foreign_pre_chain": [
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="iso"),
            ],
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "console"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "approvals": {"level": LOG_LEVEL},
        "reconciliation": {"level": LOG_LEVEL},
        # Django's default config gives "django" a plain console handler of its own (under
        # DEBUG) and lets it propagate too, so every line was printed twice: once plain,
        # once by structlog. No handler of its own: one line per event, ours.
        "django": {"handlers": [], "level": "INFO"},
        "django.request": {"level": "WARNING"},
    },
}

structlog.configure(
    processors=[
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.filter_by_level,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)
