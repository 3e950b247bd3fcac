"""The gateway in front of a Triton host: Debian's nginx at the host's ``inference_url``, Triton behind it.

Clients speak Triton's own HTTP/REST protocol (KServe v2) to the gateway. It passes the client
endpoints (``/v2``, ``/v2/health/...``, and of ``/v2/models/<m>[/versions/<v>]`` the metadata,
``ready``, ``config``, ``stats`` and ``infer``) to Triton over kept-alive upstream connections and
refuses everything else with 403: the model repository API (load, unload, index), logging, trace
settings (the server's and each model's) and shared memory are the host agent's, which reaches Triton
directly.

Per model, a **route** may split the requests that name no version, ``/v2/models/<m>/infer``, between
the version that serves (``stable``) and a ``canary`` loaded beside it: ``percent`` of them go to the
canary, rewritten to ``/v2/models/<m>/versions/<canary>/infer``, the rest to the stable version the
same way. A client that sends ``X-Modelyard-Routing-Key`` always reaches the same version while the
percent stays. Requests that name a version go to it. Every routed answer carries
``X-Modelyard-Version``. A route may also mirror ``shadow_percent`` of those requests to a ``shadow``
version with nginx's ``mirror``: the copy carries ``X-Modelyard-Shadow: 1`` and nginx discards its
answer, so clients only ever see the answers of the versions that serve. (nginx finishes a request
only when its mirror has answered, so a slow shadow delays the next request on that connection.)
Models without a route are passed as sent (Triton answers with its newest ready version).

With a gRPC address (``grpc_listen``), the gateway also passes Triton's gRPC protocol
(``inference.GRPCInferenceService``) over HTTP/2 with nginx's ``grpc_pass``: the client methods
(health, metadata, config, statistics, ``ModelInfer`` and ``ModelStreamInfer``) and the standard
``grpc.health.v1.Health`` service. Every other method (the repository, shared memory, trace and log
settings) is answered ``PERMISSION_DENIED`` without reaching Triton. gRPC requests are passed as sent:
a route's split applies to HTTP requests only, since the version a gRPC request names is inside its
protobuf body; gRPC clients of a model with a canary name the version they want.

Routes are held in nginx's shared memory by a small Lua module (``modelyard_gateway.lua``, Debian's
``libnginx-mod-http-lua``, the approach ingress-nginx takes for its endpoints) and replaced through a
Unix control socket, so changing a percent, promoting or rolling back never reloads nginx. A reload
closes idle keep-alive connections, and a client that sends on one at that moment loses its request
(see ``runtimes.nginx.NginxFront``); without reloads keep-alive stays on. ``routes.json`` holds the same
routes on disk: nginx reads it when it starts, so a restarted gateway routes as before. Each request a route
gives a version (and each shadow copy) counts in flight on that version until its log phase (``GET /inflight``
on the control socket, ``RouteControl.wait_idle``): after a route change the agent unloads a version the
route no longer gives only once no request is still on its way to it through nginx. The gateway's
config itself changes only with the agent's settings (an upgrade, gRPC turned on); such a reload is
preceded by a drain (``modelyard_drain.lua``): for ``DRAIN_SECONDS`` (less once no client connection is
open) every request is answered with ``Connection: close``, so no busy kept-alive client sits on an idle
connection when the old workers close theirs.

Per model, a share of the client infer requests may be **captured** for replays
(``modelyard_capture.lua``): the draw happens in the rewrite phase, which reads a drawn request's body
into memory (up to ``CAPTURE_BODY_LIMIT`` bytes) before it is passed on, and the log phase appends it,
after the answer went to the client and only when that answer was 2xx, to a per-worker ndjson file.
Requests not drawn are passed exactly as before. Settings come from ``capture.json`` at start and
through the control socket (``/capture``) afterwards.

A model may require an **inference key** (``key_control``, ``modelyard_keys.lua``): its infer, metadata, ready,
config and stats requests without ``Authorization: Bearer <key>`` are answered 401, with a key whose SHA-256 is
not among the model's 403 (429 with ``Retry-After`` for an address that keeps guessing), before anything reads
the body, holds or routes the request; the header is removed from the requests that pass, so Triton, shadow
copies and captures never see it. Shadow copies are the gateway's own subrequests and are not checked again.
Keys come from ``keys.json`` at start and through the control socket (``/keys``) afterwards.

Models registered **on demand** (``residency_control``, ``modelyard_residency.lua``) need not be loaded in
Triton: a request for one that is not resident is held until the agent's loader (``modelyard_agent.residency``)
has loaded it, or answered 503 with ``Retry-After``.

Layout::

    <state dir>/gateway/nginx.conf  nginx.pid  error.log  tmp/  routes.json  control/sock
                        capture.json  capture/<model>/<YYYYmmddHH>-<worker pid>.ndjson  residency.json
                        limits.json  keys.json
"""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

from modelyard_agent.contract import DEFAULT_MAX_REQUEST_BYTES
from modelyard_agent.runtimes.base import atomic_write
from modelyard_agent.runtimes.capture_control import (  # noqa: F401 (CAPTURE_SUFFIX: other modules import it from here)
    CAPTURE_BODY_LIMIT,
    CAPTURE_SUFFIX,
    WORKER_USER,
    CaptureControl,
)
from modelyard_agent.runtimes.gateway_grpc import grpc_server
from modelyard_agent.runtimes.key_control import KEYS_CONTROL, KEYS_HTTP, KEYS_SERVER, KeyControl, check_keys
from modelyard_agent.runtimes.nginx_process import DRAIN_SERVER, TEMP_PATHS, NginxProcess
from modelyard_agent.runtimes.residency_control import ResidencyControl
from modelyard_agent.runtimes.routes import (  # noqa: F401 (the headers: other modules import them from here)
    CONTROL_BODIES,
    LUA_DIR,
    METRICS_DICT_SIZE,
    ROUTING_KEY_HEADER,
    SHADOW_HEADER,
    VERSION_HEADER,
    RouteControl,
    load_modules,
    read_json_file,
)

# The shared memory of the on-demand models' states and metrics (modelyard_residency.lua): about 1 KiB a model
# before its cold starts fill its histogram, 3 KiB after: some 5,000 models.
RESIDENCY_DICT_SIZE = "16m"

# Header and timeout limits: a client that sends slowly or sends huge headers is cut off by nginx, not by
# Triton, whose older HTTP server crashes on crafted requests (SECURITY.md).
CLIENT_HEADER_TIMEOUT_S = 15
CLIENT_BODY_TIMEOUT_S = 30


def client_settings(max_body_bytes: int = DEFAULT_MAX_REQUEST_BYTES, *,
                    header_timeout: int = CLIENT_HEADER_TIMEOUT_S, body_timeout: int = CLIENT_BODY_TIMEOUT_S) -> str:
    """The client side of the gateway's http block, also what bench/gateway.py's bare nginx reference runs
    with: kept-alive clients; headers of at most 16 KiB a line (4 such buffers, nginx's 400 or 414 beyond);
    a client that pauses more than ``header_timeout`` / ``body_timeout`` seconds between two reads of its
    headers or its body is cut off (nginx's 408: the connection is closed and nothing reaches Triton);
    bodies over ``max_body_bytes`` bytes 413."""
    return f"""\
    access_log off;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    client_header_buffer_size 4k;
    large_client_header_buffers 4 16k;
    client_header_timeout {int(header_timeout)}s;
    client_body_timeout {int(body_timeout)}s;
    send_timeout 60s;
    client_max_body_size {int(max_body_bytes)};"""


# For a model without a route, Triton's answer names the version it picked: asked for it uncompressed
# (modelyard_gateway.lua's route empties $modelyard_accept_encoding then), the gateway reads it there. The
# location's own proxy_set_header replaces the server's, so Connection "" (kept-alive upstreams) comes again.
ANSWER_IN_CLEAR = """\
            proxy_set_header Connection "";
            proxy_set_header Accept-Encoding $modelyard_accept_encoding;
"""

# The shadow copy's own log phase (nginx logs a subrequest only with log_subrequest on), where it is counted.
SHADOW_LOG = """\
            log_subrequest on;
            log_by_lua_block { require("modelyard_metrics").shadow_done(ngx.var.modelyard_model) }
"""

# The proxying: kept-alive upstream connections; each request body is read whole before it is passed
# (in memory up to client_body_buffer_size, then in tmp/), so it reaches Triton with a Content-Length and
# never chunked (a few MB of tiny chunks overflow the stack of tritonservers before 25.07, CVE-2025-23310).
PROXY_SETTINGS = """\
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_request_buffering on;"""

_MAIN_CONF = """\
{load_modules}
{user}worker_processes {workers};
worker_shutdown_timeout {shutdown_timeout}s;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
{client_settings}
{temp_paths}
    lua_package_path "{lua_dir}/?.lua;;";
    lua_shared_dict modelyard_routes 4m;
    lua_shared_dict modelyard_inflight 1m;
    lua_shared_dict modelyard_capture 1m;
    lua_shared_dict modelyard_drain 16k;
    lua_shared_dict modelyard_limits 1m;
    lua_shared_dict modelyard_residency {residency_size};
    lua_shared_dict modelyard_wants 1m;
    lua_shared_dict modelyard_metrics {metrics_size};
{keys_http}
    init_by_lua_block {{
        require("modelyard_routes").load("{dir}/routes.json")
        require("modelyard_keys").load("{dir}/keys.json")
        require("modelyard_limits").load("{dir}/limits.json", {max_body})
        require("modelyard_capture").load("{dir}")
        require("modelyard_residency").load("{dir}/residency.json")
        -- Loaded here, so the workers run the modules of this config even when newer files are installed.
        require("modelyard_gateway")
        require("modelyard_drain")
        require("modelyard_workers")
    }}
    init_worker_by_lua_block {{
        require("modelyard_routes").worker_started()
        require("modelyard_residency").worker_started()
    }}
    upstream modelyard_triton {{
        server {triton} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen {listen} backlog=4096;
{proxy_settings}
        proxy_read_timeout 300s;
        # nginx's own 413 (a body past client_max_body_size), in the JSON the per-model check answers.
        error_page 413 @modelyard_too_large;
        location @modelyard_too_large {{
            default_type application/json;
            return 413 '{too_large}';
        }}
{drain_server}        location = /healthz {{ return 200 "ok\\n"; }}
        location = /v2 {{ proxy_pass http://modelyard_triton; }}
        location /v2/health/ {{ proxy_pass http://modelyard_triton; }}
        location = /metrics {{ content_by_lua_block {{ require("modelyard_metrics").expose() }} }}
        location ~ ^/v2/models/(?<modelyard_model>[^/]+)/infer$ {{
            set $modelyard_version "";
            set $modelyard_role "";
            set $modelyard_started "";
            set $modelyard_shadow "";
            set $modelyard_counted "";
            set $modelyard_shadow_counted "";
            set $modelyard_capture "";
            set $modelyard_accept_encoding $http_accept_encoding;
            lua_check_client_abort on;
            rewrite_by_lua_block {{
{start}                {check_keys}
                require("modelyard_limits").check(ngx.var.modelyard_model)
                require("modelyard_capture").draw(ngx.var.modelyard_model)
                require("modelyard_gateway").route(ngx.var.modelyard_model)
            }}
{identity}
            add_header {version_header} $modelyard_version always;
{capture_body}
{answered}            header_filter_by_lua_block {{
                require("modelyard_residency").answered(ngx.var.modelyard_model, ngx.status)
            }}
            log_by_lua_block {{
                require("modelyard_gateway").done(ngx.var.modelyard_model{measure})
                require("modelyard_capture").log(ngx.var.modelyard_model)
            }}
            proxy_pass http://modelyard_triton;
        }}
        # Only a request drawn for its model's shadow comes here (route() jumps), so the others make no
        # mirror subrequest and never wait for one.
        location @modelyard_mirrored {{
            add_header {version_header} $modelyard_version always;
            mirror /_modelyard_shadow;
            mirror_request_body on;
{capture_body}
{classify}            header_filter_by_lua_block {{
                require("modelyard_residency").answered(ngx.var.modelyard_model, ngx.status)
            }}
            log_by_lua_block {{
                require("modelyard_gateway").done(ngx.var.modelyard_model{measure})
                require("modelyard_capture").log(ngx.var.modelyard_model)
            }}
            proxy_pass http://modelyard_triton;
        }}
        # A request that names its version: passed as sent, and captured like the others.
        location ~ ^/v2/models/(?<modelyard_model>[^/]+)/versions/(?<modelyard_named>[0-9]+)/infer$ {{
            set $modelyard_capture "";
            set $modelyard_counted "";
            lua_check_client_abort on;
            rewrite_by_lua_block {{
{start}                {check_keys}
                require("modelyard_limits").check(ngx.var.modelyard_model)
                require("modelyard_capture").draw(ngx.var.modelyard_model)
                require("modelyard_gateway").named(ngx.var.modelyard_model, ngx.var.modelyard_named)
            }}
{capture_body}
{classify}            header_filter_by_lua_block {{
                require("modelyard_residency").answered(ngx.var.modelyard_model, ngx.status, true)
            }}
            log_by_lua_block {{
                require("modelyard_gateway").pinned_done(ngx.var.modelyard_model, ngx.var.modelyard_named{measure})
                require("modelyard_capture").log(ngx.var.modelyard_model, ngx.var.modelyard_named)
            }}
            proxy_pass http://modelyard_triton;
        }}
        location = /_modelyard_shadow {{
            internal;
            rewrite_by_lua_block {{ require("modelyard_gateway").shadow() }}
{shadow_log}            proxy_set_header {shadow_header} 1;
            proxy_pass http://modelyard_triton;
        }}
        # A model's metadata, config, readiness and statistics, of the model or one version; not its
        # trace or log settings.
        location ~ ^/v2/models/(?<modelyard_model>[^/]+)(/versions/[0-9]+)?(/(ready|config|stats))?$ {{
            rewrite_by_lua_block {{ {check_keys} }}
            proxy_pass http://modelyard_triton;
        }}
{keys_server}
        location = /v2/models/stats {{ proxy_pass http://modelyard_triton; }}
        location / {{ return 403 "not a client endpoint: the gateway passes /v2, /v2/health and /v2/models/...\\n"; }}
    }}
{grpc_server}    server {{
        listen unix:{dir}/control/sock;
{control_bodies}
        location = /routes {{ content_by_lua_block {{ require("modelyard_routes").control() }} }}
        location = /inflight {{ content_by_lua_block {{ require("modelyard_routes").counts() }} }}
        location = /capture {{ content_by_lua_block {{ require("modelyard_capture").control() }} }}
        location = /drain {{ content_by_lua_block {{ require("modelyard_drain").control() }} }}
        location = /limits {{ content_by_lua_block {{ require("modelyard_limits").control() }} }}
{keys_control}
        location = /series {{ content_by_lua_block {{ require("modelyard_metrics").control() }} }}
        location /residency {{ content_by_lua_block {{ require("modelyard_residency").control() }} }}
        location / {{ return 404; }}
    }}
}}
"""


class TritonGateway(KeyControl, CaptureControl, ResidencyControl, RouteControl, NginxProcess):
    """The gateway nginx of one Triton host.

    Args:
        directory: where its files live (``<agent state dir>/gateway``).
        listen_port, listen_host, shutdown_timeout: as ``NginxProcess``.
        triton: ``host:port`` of Triton's own HTTP endpoint, which the gateway passes requests to.
        workers: nginx worker processes (``auto``: one per CPU).
        grpc_listen: ``[host:]port`` where the gateway takes gRPC, or empty (no gRPC through the gateway).
        triton_grpc: ``host:port`` of Triton's own gRPC endpoint; needed with ``grpc_listen``.
        max_request_bytes: the most bytes of a request body (HTTP and gRPC) the gateway passes, and of an
            infer request to a model without a limit of its own (``set_request_limit``).
        client_header_timeout, client_body_timeout: seconds a client may pause while it sends its headers
            or its body before it is cut off (``client_settings``).
        measure: count every infer request and its latency (``modelyard_metrics.lua``, ``GET /metrics``);
            False only to measure what that costs (``bench/gateway.py``).

    Raises:
        ValueError: ``grpc_listen`` without ``triton_grpc``.
    """

    SUBDIRS = ("tmp", "capture")
    PRIVATE_SUBDIRS = ("control",)

    def __init__(self, directory: Path, listen_port: int, *, triton: str, listen_host: str = "",
                 shutdown_timeout: float = 120.0, workers: str = "auto", grpc_listen: str = "",
                 triton_grpc: str = "", max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 client_header_timeout: int = CLIENT_HEADER_TIMEOUT_S,
                 client_body_timeout: int = CLIENT_BODY_TIMEOUT_S, measure: bool = True):
        super().__init__(directory, listen_port, listen_host, shutdown_timeout)
        self.measure = measure
        self.client_timeouts = {"header_timeout": client_header_timeout, "body_timeout": client_body_timeout}
        if grpc_listen and not triton_grpc:
            raise ValueError("gRPC through the gateway needs Triton's own gRPC address (--triton-grpc-url)")
        self.triton = triton
        self.grpc_listen, self.triton_grpc = grpc_listen, triton_grpc
        self.workers = workers
        self.routes_file = self.dir / "routes.json"
        self.control_socket = self.dir / "control" / "sock"
        self.capture_file = self.dir / "capture.json"
        self.limits_file = self.dir / "limits.json"
        self.keys_file = self.dir / "keys.json"
        self.max_request_bytes = int(max_request_bytes)

    def main_config(self) -> str:
        return _MAIN_CONF.format(
            load_modules=load_modules(), workers=self.workers,
            client_settings=client_settings(self.max_request_bytes, **self.client_timeouts),
            max_body=self.max_request_bytes, too_large=json.dumps({
                "error": f"request body over the limit of {self.max_request_bytes} bytes (the default of this host)",
                "limit_bytes": self.max_request_bytes}),
            proxy_settings=PROXY_SETTINGS,
            user=f"user {WORKER_USER} {_group_of(WORKER_USER)};\n" if os.geteuid() == 0 else "",
            metrics_size=METRICS_DICT_SIZE, measure="" if self.measure else ", false",
            start='                require("modelyard_metrics").start()\n' if self.measure else "",
            residency_size=RESIDENCY_DICT_SIZE, control_bodies=CONTROL_BODIES, keys_http=KEYS_HTTP,
            keys_server=KEYS_SERVER, keys_control=KEYS_CONTROL, check_keys=check_keys("ngx.var.modelyard_model"),
            answered='            body_filter_by_lua_block { require("modelyard_gateway").answered() }\n'
            if self.measure else "",
            classify='            body_filter_by_lua_block { require("modelyard_metrics").classify() }\n'
            if self.measure else "",
            identity=ANSWER_IN_CLEAR if self.measure else "",
            shadow_log=SHADOW_LOG if self.measure else "",
            capture_body=(f"            client_body_buffer_size {CAPTURE_BODY_LIMIT};\n"
                          "            client_body_in_single_buffer on;"),
            shutdown_timeout=int(self.shutdown_timeout), dir=self.dir, lua_dir=LUA_DIR, triton=self.triton,
            listen=self.listen, version_header=VERSION_HEADER, shadow_header=SHADOW_HEADER,
            temp_paths=TEMP_PATHS.format(dir=self.dir), drain_server=DRAIN_SERVER,
            grpc_server=grpc_server(self.triton_grpc, self.grpc_listen) if self.grpc_listen else "",
        )

    def create_series(self, model: str, versions: list[int]) -> dict:
        """Give ``versions`` of ``model``, which serve without a route, their traffic series at 0 (as "stable" and
        "pinned"; ``modelyard_metrics.lua``'s control), so their first requests count as a rise from 0; a
        route's versions have theirs when it is applied. Idempotent: an existing series keeps its counts.

        Returns:
            ``{model: versions}`` as the gateway took them.

        Raises:
            ServingRuntimeError: the gateway refused them (not a model name or version numbers) or does not answer.
        """
        return self._control("POST", {model: [int(v) for v in versions]}, path="/series")

    # Request body limits (modelyard_limits.lua; formats.request_limits derives them).

    def request_limits(self) -> dict:
        """The limits the running gateway holds: ``{"default": bytes, "models": {model: bytes}}``.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET", path="/limits")

    def set_request_limit(self, model: str, limit: int | None) -> dict:
        """Refuse ``model``'s infer request bodies over ``limit`` bytes (None: the host's default) with 413,
        from the next request, with no reload; kept in ``limits.json`` for the next start. Only this model's
        limit goes to the gateway (``PATCH /limits``). Idempotent.

        Returns:
            ``request_limits()`` of this model alone: ``{"default": bytes, "models": {model: bytes}}``
            (``"models": {}`` when it has the default).

        Raises:
            ValueError: a limit below 1 byte, or not a model name.
            ServingRuntimeError: the gateway refused the limits or does not answer.
        """
        if "/" in model or model in (".", "..") or not model:
            raise ValueError(f"{model!r} is not a model name")
        if limit is not None and int(limit) < 1:
            raise ValueError(f"a request limit is 1 byte or more; got {limit!r}")
        with self._lock():
            held = read_json_file(self.limits_file)
            if limit is None:
                held.pop(model, None)
            else:
                held[model] = min(int(limit), self.max_request_bytes)
            atomic_write(self.limits_file, json.dumps(held, indent=1, sort_keys=True))
            return self._control("PATCH", {model: held.get(model)}, path="/limits")


def _group_of(user: str) -> str:
    """The name of ``user``'s primary group (``nogroup`` for Debian's ``nobody``)."""
    import grp

    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
