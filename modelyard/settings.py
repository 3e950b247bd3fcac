"""Settings for Modelyard, every one read from the environment.

Local defaults work out of the box (SQLite, Redis on 127.0.0.1, an S3 stand-in on
127.0.0.1:9000, Prometheus on 127.0.0.1:9090). With ``MODELYARD_DEBUG=false`` a
missing secret key is a startup error rather than a silent default.
"""

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from modelyard.env import env_bool, env_float, env_int, env_list, env_str
from modelyard_agent.formats.archives import DEFAULT_LIMITS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("MODELYARD_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("MODELYARD_DEBUG", True)
SECRET_KEY = env_str("MODELYARD_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("MODELYARD_SECRET_KEY must be set when MODELYARD_DEBUG is false")
    SECRET_KEY = "insecure-local-development-key-do-not-use-in-production"

ALLOWED_HOSTS = env_list("MODELYARD_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("MODELYARD_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "csp",
    "django_celery_beat",
    "audit",
    "accounts",
    "registry",
    "deployments",
    "monitoring",
    "promotions",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "modelyard.middleware.NulPathMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # An ETag (the digest of the body) on every GET answer that sets none itself, and a 304 for an
    # If-None-Match that names it: a client polling an unchanged object gets no body back.
    "django.middleware.http.ConditionalGetMiddleware",
    "modelyard.middleware.FormBodyLimitMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]

# Content-Security-Policy (django-csp): every script, style and connection from this origin
# only; the pages have no inline scripts or styles and load nothing from a CDN.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

ROOT_URLCONF = "modelyard.urls"
WSGI_APPLICATION = "modelyard.wsgi.application"

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
]

DATABASE_URL = env_str("DATABASE_URL")
if not DATABASE_URL:
    # The embedded default for a laptop: SQLite under var/. Processes that
    # never touch the database (host agents) may run where var/ is read-only.
    try:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    DATABASE_URL = f"sqlite:///{VAR_DIR / 'modelyard.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("MODELYARD_DB_CONN_MAX_AGE", 60),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several local processes (web, workers, beat) write: wait for the lock instead of failing,
    # and take it at BEGIN so a reader never has to upgrade to a writer mid-transaction.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 30, "transaction_mode": "IMMEDIATE"})
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Server-side prepared statements: psycopg binds parameters on the server and prepares a query once this
    # connection has run it MODELYARD_DB_PREPARE_THRESHOLD times, so PostgreSQL parses and plans the same read
    # once per connection instead of on every request (about 0.1-0.4 ms a query, bench/results/
    # registry_profile.md). 0 turns them off (Django's own default, client-side binding), as a connection
    # pooler in transaction mode that does not track prepared statements needs (PgBouncer before 1.21).
    PREPARE_THRESHOLD = env_int("MODELYARD_DB_PREPARE_THRESHOLD", 5)
    if PREPARE_THRESHOLD < 0:
        raise ImproperlyConfigured("MODELYARD_DB_PREPARE_THRESHOLD must be 0 (off) or a positive number of runs")
    if PREPARE_THRESHOLD:
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            {"server_side_binding": True, "prepare_threshold": PREPARE_THRESHOLD})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "registry:model-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# Uploads: Django spools anything above 2.5 MB to a temp file, so a large
# artifact never sits in the web process's memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
DATA_UPLOAD_MAX_MEMORY_SIZE = 10_485_760

REST_FRAMEWORK = {
    # API tokens (stored as SHA-256 digests, scoped, expiring): ``Authorization: Bearer <token>``;
    # the browser's session for the pages' own calls.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # A view that sets its own permission_classes must list TokenScopePermission too.
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "accounts.permissions.TokenScopePermission",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["modelyard.api.FilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "modelyard.api.CursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "modelyard.api_errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "modelyard.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Modelyard API",
    "DESCRIPTION": (
        "Model registry and rollout orchestration for Triton and BentoML serving hosts. Lists are "
        "cursor-paginated (`results`, `next`, `previous`): follow `next` to page on; no row is skipped or "
        "repeated while rows are inserted. `page_size` is 50 by default and at most 200 (more is refused with 400)."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page (/api/docs/) serves Swagger UI's files from this app's static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "persistAuthorization": False, "displayRequestDuration": True},
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "modelyard.schema.document_error_statuses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "DeploymentStatusEnum": "deployments.choices.DeploymentStatus",
        "AgentJobStatusEnum": "deployments.choices.JobStatus",
        "VersionStatusEnum": "registry.choices.VersionStatus",
        "PromotionDecisionEnum": "promotions.choices.Decision",
        "ApiTokenStateEnum": "accounts.api.serializers.TOKEN_STATES",
    },
}

# Access control (accounts.access): the team models go to when none is named, and the aliases
# only a team's owners may move.
MODELYARD_DEFAULT_TEAM = env_str("MODELYARD_DEFAULT_TEAM", "default")
MODELYARD_PRODUCTION_ALIASES = env_list("MODELYARD_PRODUCTION_ALIASES", ["production"])
# Request capture (registry.capture): the most bytes of captured requests one model may keep on one host
# (4 GiB), and the longest a capture may be kept (30 days, in seconds).
MODELYARD_CAPTURE_MAX_BYTES_LIMIT = env_int("MODELYARD_CAPTURE_MAX_BYTES_LIMIT", 4 * 1024**3)
MODELYARD_CAPTURE_MAX_RETENTION_SECONDS = env_int("MODELYARD_CAPTURE_MAX_RETENTION_SECONDS", 30 * 86_400)

# Celery: JSON only, late acknowledgement, so a worker killed mid-task hands
# the message back to the broker instead of losing it.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_TIME_LIMIT = env_int("MODELYARD_TASK_TIME_LIMIT", 1800)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("MODELYARD_TASK_SOFT_TIME_LIMIT", 1700)
# A message a worker took but never acknowledged (the worker died) goes back to its queue after
# this many seconds; longer than any task may run, so a live task is never handed out twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("MODELYARD_BROKER_VISIBILITY_TIMEOUT", CELERY_TASK_TIME_LIMIT + 600),
}
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
HEARTBEAT_INTERVAL = env_float("MODELYARD_HEARTBEAT_INTERVAL", 30.0)
HOST_OFFLINE_AFTER = env_float("MODELYARD_HOST_OFFLINE_AFTER", 90.0)
# Hosts whose agent reports in but whose runtime was not live are asked this often (seconds), so the
# report that shows the runtime back, and with it the repair, comes within this much of its restart.
RECOVERY_HEARTBEAT_INTERVAL = env_float("MODELYARD_RECOVERY_HEARTBEAT_INTERVAL", 5.0)
# Unload a model from a host once it answered no request for this many seconds (0: never).
IDLE_UNLOAD_AFTER = env_float("MODELYARD_IDLE_UNLOAD_AFTER", 0.0)
# The autoscaler's window: the queue time it judges by, and the least time between two changes (seconds).
AUTOSCALE_WINDOW = env_float("MODELYARD_AUTOSCALE_WINDOW", 120.0)
RECONCILE_INTERVAL = env_float("MODELYARD_RECONCILE_INTERVAL", 60.0)
RECONCILE_BACKOFF = env_float("MODELYARD_RECONCILE_BACKOFF", 300.0)
DISPATCH_TIMEOUT = env_float("MODELYARD_DISPATCH_TIMEOUT", 600.0)
# A target dispatched this many seconds ago to an online host whose agent has not got it is sent again under a new
# claim by the reconciler: the orchestrator worker that was to send it died first (deployments.delivery).
DISPATCH_RESEND_AFTER = env_float("MODELYARD_DISPATCH_RESEND_AFTER", 60.0)
# A target on a host whose agent has never reported is failed after this many seconds: a few
# heartbeat intervals for an agent just started, and not the whole dispatch timeout for one that
# was never set up.
UNREPORTED_HOST_TIMEOUT = env_float("MODELYARD_UNREPORTED_HOST_TIMEOUT", 180.0)
# A profile whose agent sent no report for its sweep's time budget plus this many seconds is failed.
PROFILE_STALL_GRACE = env_float("MODELYARD_PROFILE_STALL_GRACE", 300.0)
UPLOAD_SWEEP_INTERVAL = env_float("MODELYARD_UPLOAD_SWEEP_INTERVAL", 900.0)
# Garbage collection of the artifact bucket (registry/gc.py): how often (seconds), and how old an
# unreferenced object must be before it is removed (seconds; covers registrations still committing).
GC_INTERVAL = env_float("MODELYARD_GC_INTERVAL", 86_400.0)
GC_GRACE_SECONDS = env_int("MODELYARD_GC_GRACE_SECONDS", 86_400)
CELERY_BEAT_SCHEDULE = {
    # The orchestrator asks every host agent to report in, and repairs drift from the reports.
    "request-host-heartbeats": {"task": "deployments.request_heartbeats", "schedule": HEARTBEAT_INTERVAL},
    "request-recovering-host-heartbeats": {"task": "deployments.request_recovery_heartbeats",
                                           "schedule": RECOVERY_HEARTBEAT_INTERVAL},
    "reconcile-fleet": {"task": "deployments.reconcile", "schedule": RECONCILE_INTERVAL},
    # Checks every minute; does nothing while IDLE_UNLOAD_AFTER is 0.
    "unload-idle-models": {"task": "deployments.unload_idle_models", "schedule": 60.0},
    # Only deployments with autoscale bounds are touched.
    "autoscale-instances": {"task": "deployments.autoscale", "schedule": 60.0},
    # Multipart uploads left open past their expiry are aborted, so S3 frees their parts.
    "expire-uploads": {"task": "registry.expire_uploads", "schedule": UPLOAD_SWEEP_INTERVAL},
    "collect-garbage": {"task": "registry.collect_garbage", "schedule": GC_INTERVAL},
}
CELERY_TASK_ALWAYS_EAGER = env_bool("MODELYARD_CELERY_EAGER", False)

# S3 artifact store. Locally an S3 stand-in listens on 127.0.0.1:9000.
S3_ENDPOINT_URL = env_str("MODELYARD_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
# The endpoint serving hosts download artifacts from: their presigned URLs name it. Empty: the one
# above, which is right only when hosts reach S3 at the same address as the control plane (not a
# loopback address with hosts on other machines).
S3_HOST_ENDPOINT_URL = env_str("MODELYARD_S3_HOST_ENDPOINT_URL", "")
S3_BUCKET = env_str("MODELYARD_S3_BUCKET", "modelyard-artifacts")
S3_REGION = env_str("MODELYARD_S3_REGION", "us-east-1")
S3_ACCESS_KEY_ID = env_str("MODELYARD_S3_ACCESS_KEY_ID", "modelyard")
S3_SECRET_ACCESS_KEY = env_str("MODELYARD_S3_SECRET_ACCESS_KEY", "modelyard-secret")
S3_PRESIGN_SECONDS = env_int("MODELYARD_S3_PRESIGN_SECONDS", 3600)
S3_CONNECT_TIMEOUT = env_float("MODELYARD_S3_CONNECT_TIMEOUT", 5.0)
S3_READ_TIMEOUT = env_float("MODELYARD_S3_READ_TIMEOUT", 60.0)
S3_CREATE_BUCKET = env_bool("MODELYARD_S3_CREATE_BUCKET", DEBUG)
# Pages on these origins may PUT upload parts straight to the bucket (its CORS rules, set by
# ``manage.py configure_s3_cors``); the upload page's CSP allows connections to the endpoint.
S3_CORS_ORIGINS = env_list("MODELYARD_S3_CORS_ORIGINS", ["http://127.0.0.1:8080", "http://localhost:8080"])

# Direct-to-S3 multipart uploads: part size in bytes (the client may choose another between 5 MiB
# and 5 GiB), how long a presigned part URL stays valid and how long an upload may stay open (seconds).
UPLOAD_PART_BYTES = env_int("MODELYARD_UPLOAD_PART_BYTES", 64 * 1024**2)
UPLOAD_PART_URL_SECONDS = env_int("MODELYARD_UPLOAD_PART_URL_SECONDS", 3600)
UPLOAD_EXPIRY_SECONDS = env_int("MODELYARD_UPLOAD_EXPIRY_SECONDS", 24 * 3600)
# Part URLs carry the part's declared SHA-256 as x-amz-checksum-sha256 (S3's flexible checksums,
# which AWS S3 and MinIO check on arrival); off for a store that does not support them.
S3_PART_CHECKSUMS = env_bool("MODELYARD_S3_PART_CHECKSUMS", True)
# Whether the store's part ETags are MD5s of the bytes it received. AWS S3 says so itself when they
# are not (SSE-KMS, SSE-C); set false for a store that encrypts without saying so (some encrypted
# MinIO setups): completed uploads are then streamed back and hashed instead.
S3_ETAGS_ARE_MD5 = env_bool("MODELYARD_S3_ETAGS_ARE_MD5", True)

# Artifact limits, checked before anything is stored.
MAX_ARTIFACT_BYTES = env_int("MODELYARD_MAX_ARTIFACT_BYTES", 2 * 1024**3)
MAX_UNPACKED_BYTES = env_int("MODELYARD_MAX_UNPACKED_BYTES", DEFAULT_LIMITS.max_unpacked_bytes)
MAX_COMPRESSION_RATIO = env_int("MODELYARD_MAX_COMPRESSION_RATIO", DEFAULT_LIMITS.max_compression_ratio)
MAX_ARCHIVE_MEMBERS = env_int("MODELYARD_MAX_ARCHIVE_MEMBERS", DEFAULT_LIMITS.max_members)

# Prometheus, queried with prometheus-api-client.
PROMETHEUS_URL = env_str("MODELYARD_PROMETHEUS_URL", "http://127.0.0.1:9090")
PROMETHEUS_TIMEOUT = env_float("MODELYARD_PROMETHEUS_TIMEOUT", 5.0)
# The app's own /metrics (counts only) is open unless this is set; then a scrape
# must send ``Authorization: Bearer <token>``.
METRICS_TOKEN = env_str("MODELYARD_METRICS_TOKEN")

# Promotion webhooks: seconds per delivery attempt, attempts before giving up (backoff 2, 4, 8 … s).
WEBHOOK_TIMEOUT = env_float("MODELYARD_WEBHOOK_TIMEOUT", 5.0)
WEBHOOK_MAX_ATTEMPTS = env_int("MODELYARD_WEBHOOK_MAX_ATTEMPTS", 6)
# For tests only: lets webhooks reach loopback, private and link-local addresses (a receiver on
# 127.0.0.1). Left False, such URLs are refused when saved and again before each delivery.
WEBHOOK_ALLOW_PRIVATE = env_bool("MODELYARD_WEBHOOK_ALLOW_PRIVATE", False)

# Host agents run the modelyard_agent package with settings of their own (modelyard_agent/config.py).
# The orchestrator's defaults of the per-host load and unload deadlines (ServingHost.load_deadline,
# unload_deadline), seconds; the same variables set an agent's own defaults.
AGENT_LOAD_TIMEOUT = env_float("MODELYARD_AGENT_LOAD_TIMEOUT", 600.0)
AGENT_UNLOAD_TIMEOUT = env_float("MODELYARD_AGENT_UNLOAD_TIMEOUT", 120.0)
# The local BentoML host's directory, for `manage.py stop_bentoml_host` (make stop).
AGENT_BENTOML_ROOT = env_str("MODELYARD_AGENT_BENTOML_ROOT", str(VAR_DIR / "bentoml-agent"))
# How "Try it" reaches a host (deployments/inference.py): "agent", over the broker through the host's
# agent (the web tier need not reach the serving network), or "direct" to its inference_url.
TRY_IT_ROUTES = ("agent", "direct")
TRY_IT_ROUTE = env_str("MODELYARD_TRY_IT_ROUTE", "agent")
if TRY_IT_ROUTE not in TRY_IT_ROUTES:
    raise ImproperlyConfigured(f"MODELYARD_TRY_IT_ROUTE must be agent or direct, not {TRY_IT_ROUTE!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("MODELYARD_LOG_LEVEL", "INFO")},
    "loggers": {"botocore": {"level": "WARNING"}, "urllib3": {"level": "WARNING"}},
}

if not DEBUG:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("MODELYARD_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("MODELYARD_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("MODELYARD_HSTS_PRELOAD", True)
    SECURE_SSL_REDIRECT = env_bool("MODELYARD_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
