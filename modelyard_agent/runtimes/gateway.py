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
routes on disk: nginx reads it when it starts, so a restarted gateway routes as before.

Layout::

    <state dir>/gateway/nginx.conf  nginx.pid  error.log  tmp/  routes.json  control.sock
"""

from __future__ import annotations

from pathlib import Path

from modelyard_agent.runtimes.nginx import TEMP_PATHS, NginxProcess
from modelyard_agent.runtimes.routes import (  # noqa: F401 (the headers: other modules import them from here)
    LUA_DIR,
    ROUTING_KEY_HEADER,
    SHADOW_HEADER,
    VERSION_HEADER,
    RouteControl,
    load_modules,
)

_MAIN_CONF = """\
{load_modules}
worker_processes {workers};
worker_shutdown_timeout {shutdown_timeout}s;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    # Triton enforces its own request size limit.
    client_max_body_size 0;
{temp_paths}
    lua_package_path "{lua_dir}/?.lua;;";
    lua_shared_dict modelyard_routes 4m;
    init_by_lua_block {{ require("modelyard_routes").load("{dir}/routes.json") }}
    init_worker_by_lua_block {{ require("modelyard_routes").seed() }}
    upstream modelyard_triton {{
        server {triton} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen {listen} backlog=4096;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_read_timeout 300s;
        proxy_request_buffering off;
        location = /healthz {{ return 200 "ok\\n"; }}
        location = /v2 {{ proxy_pass http://modelyard_triton; }}
        location /v2/health/ {{ proxy_pass http://modelyard_triton; }}
        location ~ ^/v2/models/(?<modelyard_model>[^/]+)/infer$ {{
            set $modelyard_version "";
            set $modelyard_shadow "";
            rewrite_by_lua_block {{ require("modelyard_gateway").route(ngx.var.modelyard_model) }}
            add_header {version_header} $modelyard_version always;
            proxy_pass http://modelyard_triton;
        }}
        # Only a request drawn for its model's shadow comes here (route() jumps), so the others make no
        # mirror subrequest and never wait for one.
        location @modelyard_mirrored {{
            add_header {version_header} $modelyard_version always;
            mirror /_modelyard_shadow;
            mirror_request_body on;
            proxy_pass http://modelyard_triton;
        }}
        location = /_modelyard_shadow {{
            internal;
            rewrite_by_lua_block {{ require("modelyard_gateway").shadow() }}
            proxy_set_header {shadow_header} 1;
            proxy_pass http://modelyard_triton;
        }}
        # A model's metadata, config, readiness and statistics, of the model or one version; not its
        # trace or log settings.
        location ~ ^/v2/models/[^/]+(/versions/[0-9]+)?(/(ready|config|stats|infer))?$ {{
            proxy_pass http://modelyard_triton;
        }}
        location = /v2/models/stats {{ proxy_pass http://modelyard_triton; }}
        location / {{ return 403 "not a client endpoint: the gateway passes /v2, /v2/health and /v2/models/...\\n"; }}
    }}
{grpc_server}    server {{
        listen unix:{dir}/control.sock;
        location = /routes {{ content_by_lua_block {{ require("modelyard_routes").control() }} }}
        location / {{ return 404; }}
    }}
}}
"""


# The client methods of Triton's gRPC service (grpc_service.proto of triton-inference-server/common); the
# others (RepositoryIndex, RepositoryModelLoad/Unload, *SharedMemory*, TraceSetting, LogSettings) are the agent's.
GRPC_CLIENT_METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
                       "ModelStreamInfer", "ModelConfig", "ModelStatistics")

# A gRPC refusal is a "trailers-only" answer: HTTP 200 whose headers carry grpc-status, no body (the gRPC
# over HTTP/2 protocol, PROTOCOL-HTTP2.md of grpc/grpc); nginx sends it as a header-only 204.
_GRPC_SERVER = """\
    upstream modelyard_triton_grpc {{
        server {triton_grpc} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen {grpc_listen} http2 backlog=4096;
        grpc_read_timeout 300s;
        grpc_send_timeout 300s;
        location ~ ^/(inference\\.GRPCInferenceService/({methods})|grpc\\.health\\.v1\\.Health/(Check|Watch))$ {{
            grpc_pass grpc://modelyard_triton_grpc;
        }}
        location / {{
            default_type application/grpc;
            add_header grpc-status 7 always;
            add_header grpc-message "not a client method: the gateway passes health, metadata and inference" always;
            return 204;
        }}
    }}
"""


class TritonGateway(RouteControl, NginxProcess):
    """The gateway nginx of one Triton host.

    Args:
        directory: where its files live (``<agent state dir>/gateway``).
        listen_port, listen_host, shutdown_timeout: as ``NginxProcess``.
        triton: ``host:port`` of Triton's own HTTP endpoint, which the gateway passes requests to.
        workers: nginx worker processes (``auto``: one per CPU).
        grpc_listen: ``[host:]port`` where the gateway takes gRPC, or empty (no gRPC through the gateway).
        triton_grpc: ``host:port`` of Triton's own gRPC endpoint; needed with ``grpc_listen``.

    Raises:
        ValueError: ``grpc_listen`` without ``triton_grpc``.
    """

    SUBDIRS = ("tmp",)

    def __init__(self, directory: Path, listen_port: int, *, triton: str, listen_host: str = "",
                 shutdown_timeout: float = 120.0, workers: str = "auto", grpc_listen: str = "",
                 triton_grpc: str = ""):
        super().__init__(directory, listen_port, listen_host, shutdown_timeout)
        if grpc_listen and not triton_grpc:
            raise ValueError("gRPC through the gateway needs Triton's own gRPC address (--triton-grpc-url)")
        self.triton = triton
        self.grpc_listen, self.triton_grpc = grpc_listen, triton_grpc
        self.workers = workers
        self.routes_file = self.dir / "routes.json"
        self.control_socket = self.dir / "control.sock"

    def main_config(self) -> str:
        return _MAIN_CONF.format(
            load_modules=load_modules(), workers=self.workers,
            shutdown_timeout=int(self.shutdown_timeout), dir=self.dir, lua_dir=LUA_DIR, triton=self.triton,
            listen=self.listen, version_header=VERSION_HEADER, shadow_header=SHADOW_HEADER,
            temp_paths=TEMP_PATHS.format(dir=self.dir),
            grpc_server=_GRPC_SERVER.format(triton_grpc=self.triton_grpc, grpc_listen=self.grpc_listen,
                                            methods="|".join(GRPC_CLIENT_METHODS)) if self.grpc_listen else "",
        )
