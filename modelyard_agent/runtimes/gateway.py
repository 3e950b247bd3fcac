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

import http.client
import json
import os
import pwd
import shutil
import socket
from pathlib import Path

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.nginx import TEMP_PATHS, NginxProcess, _atomic_write

LUA_DIR = Path(__file__).resolve().parent
MODULES = (Path("/usr/lib/nginx/modules/ndk_http_module.so"), Path("/usr/lib/nginx/modules/ngx_http_lua_module.so"))
ROUTING_KEY_HEADER = "X-Modelyard-Routing-Key"
VERSION_HEADER = "X-Modelyard-Version"
SHADOW_HEADER = "X-Modelyard-Shadow"
# Request bodies up to this many bytes are held in memory, so the log phase can capture them; a larger one
# goes to a temporary file and, when drawn for capture, is counted as skipped.
CAPTURE_BODY_LIMIT = 1 << 20
# Without privileges nginx's workers run as the agent's user; an agent run as root has them run as this one.
WORKER_USER = "nobody"
CAPTURE_SUFFIX = ".ndjson"

_MAIN_CONF = """\
{load_modules}
{user}worker_processes {workers};
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
    lua_shared_dict modelyard_capture 1m;
    init_by_lua_block {{
        require("modelyard_gateway").load("{dir}/routes.json")
        require("modelyard_capture").load("{dir}")
    }}
    init_worker_by_lua_block {{ require("modelyard_gateway").seed() }}
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
            rewrite_by_lua_block {{ require("modelyard_gateway").route(ngx.var.modelyard_model) }}
            add_header {version_header} $modelyard_version always;
            mirror /_modelyard_shadow;
            mirror_request_body on;
{capture_body}
            log_by_lua_block {{ require("modelyard_capture").log(ngx.var.modelyard_model) }}
            proxy_pass http://modelyard_triton;
        }}
        location ~ ^/v2/models/(?<modelyard_model>[^/]+)/versions/(?<modelyard_named>[0-9]+)/infer$ {{
            proxy_request_buffering on;
{capture_body}
            log_by_lua_block {{ require("modelyard_capture").log(ngx.var.modelyard_model, ngx.var.modelyard_named) }}
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
        location ~ ^/v2/models/[^/]+(/versions/[0-9]+)?(/(ready|config|stats))?$ {{
            proxy_pass http://modelyard_triton;
        }}
        location = /v2/models/stats {{ proxy_pass http://modelyard_triton; }}
        location / {{ return 403 "not a client endpoint: the gateway passes /v2, /v2/health and /v2/models/...\\n"; }}
    }}
    server {{
        listen unix:{dir}/control.sock;
        location = /routes {{ content_by_lua_block {{ require("modelyard_gateway").control() }} }}
        location = /capture {{ content_by_lua_block {{ require("modelyard_capture").control() }} }}
        location / {{ return 404; }}
    }}
}}
"""


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection over a Unix socket (the gateway's control socket)."""

    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class TritonGateway(NginxProcess):
    """The gateway nginx of one Triton host.

    Args:
        directory: where its files live (``<agent state dir>/gateway``).
        listen_port, listen_host, shutdown_timeout: as ``NginxProcess``.
        triton: ``host:port`` of Triton's own HTTP endpoint, which the gateway passes requests to.
        workers: nginx worker processes (``auto``: one per CPU).
    """

    SUBDIRS = ("tmp", "capture")

    def __init__(self, directory: Path, listen_port: int, *, triton: str, listen_host: str = "",
                 shutdown_timeout: float = 120.0, workers: str = "auto"):
        super().__init__(directory, listen_port, listen_host, shutdown_timeout)
        self.triton = triton
        self.workers = workers
        self.routes_file = self.dir / "routes.json"
        self.control_socket = self.dir / "control.sock"
        self.capture_file = self.dir / "capture.json"

    def main_config(self) -> str:
        missing = [str(path) for path in MODULES if not path.exists()]
        if missing:
            raise ServingRuntimeError(f"the gateway needs nginx's Lua module ({', '.join(missing)} is missing): "
                                      f"install Debian's libnginx-mod-http-lua and lua-cjson", retryable=False)
        return _MAIN_CONF.format(
            load_modules="\n".join(f"load_module {path};" for path in MODULES), workers=self.workers,
            user=f"user {WORKER_USER} {_group_of(WORKER_USER)};\n" if os.geteuid() == 0 else "",
            capture_body=(f"            client_body_buffer_size {CAPTURE_BODY_LIMIT};\n"
                          "            client_body_in_single_buffer on;"),
            shutdown_timeout=int(self.shutdown_timeout), dir=self.dir, lua_dir=LUA_DIR, triton=self.triton,
            listen=self.listen, version_header=VERSION_HEADER, shadow_header=SHADOW_HEADER,
            temp_paths=TEMP_PATHS.format(dir=self.dir),
        )

    def routes(self) -> dict[str, dict]:
        """The routes the running gateway holds: ``{model: {"stable", "canary", "percent", "shadow",
        "shadow_percent"}}``.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET")

    def set_route(self, model: str, *, stable: int, canary: int | None = None, percent: float = 0.0,
                  shadow: int | None = None, shadow_percent: float = 0.0) -> dict:
        """Send ``percent`` (0-100) of ``model``'s requests that name no version to ``canary``, the rest to
        ``stable``, and mirror ``shadow_percent`` (0-100) of them to ``shadow``, whose answers no client sees;
        effective for the next request, with no reload. Idempotent.

        Returns:
            The route as the gateway now holds it.

        Raises:
            ValueError: a percent outside 0-100 or a version below 1.
            ServingRuntimeError: the gateway refused the routes or does not answer.
        """
        for name, value in (("canary", percent), ("shadow", shadow_percent)):
            if not 0 <= float(value) <= 100:
                raise ValueError(f"a {name} percent is from 0 to 100; got {value!r}")
        if any(v is not None and int(v) < 1 for v in (stable, canary, shadow)):
            raise ValueError("versions are numbered from 1")
        route = {"stable": int(stable), "canary": None if canary is None else int(canary), "percent": float(percent),
                 "shadow": None if shadow is None else int(shadow), "shadow_percent": float(shadow_percent)}
        return self._change(model, route)[model]

    def remove_route(self, model: str) -> None:
        """Pass ``model``'s requests as sent again (no split). Idempotent.

        Raises:
            ServingRuntimeError: as ``set_route``.
        """
        self._change(model, None)

    def _change(self, model: str, route: dict | None) -> dict[str, dict]:
        with self._lock():
            routes = self._read_file()
            if route is None:
                routes.pop(model, None)
            else:
                routes[model] = route
            _atomic_write(self.routes_file, json.dumps(routes, indent=1, sort_keys=True))
            return self._control("POST", routes)

    def _read_file(self) -> dict[str, dict]:
        try:
            return json.loads(self.routes_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ServingRuntimeError(f"{self.routes_file} is not JSON: {exc}", retryable=False) from exc

    def _control(self, method: str, body: dict | None = None, timeout: float = 5.0,
                 path: str = "/routes") -> dict[str, dict]:
        connection = _UnixConnection(self.control_socket, timeout)
        try:
            connection.request(method, path, body=None if body is None else json.dumps(body),
                               headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            text = answer.read().decode()
        except OSError as exc:
            raise ServingRuntimeError(f"the gateway's control socket does not answer: {exc}", retryable=True) from exc
        finally:
            connection.close()
        if answer.status != 200:
            raise ServingRuntimeError(f"the gateway refused the {path.strip('/')}: {text.strip()}", retryable=False)
        return json.loads(text)

    # Request capture (issue 15; the file format is the capture contract, docs/architecture.md).

    def capture_directory(self, model: str) -> Path:
        """Where the gateway writes ``model``'s captured requests: ``<gateway dir>/capture/<model>/``, files
        ``<YYYYmmddHH>-<worker pid>.ndjson`` (UTC hour), one JSON object per line."""
        return self.dir / "capture" / model

    def capture(self) -> dict[str, dict]:
        """The capture settings the running gateway holds, with its counters: ``{model: {"fraction" (0-1),
        "max_bytes", "retention_seconds", "bytes" (what it counts on disk), "skipped" (requests drawn but
        not captured since nginx started: a body over ``CAPTURE_BODY_LIMIT`` bytes, no known version, the
        capture full)}}``.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET", path="/capture")

    def set_capture(self, model: str, *, fraction: float, max_bytes: int, retention_seconds: int) -> dict:
        """Capture ``fraction`` (0-1) of ``model``'s client infer requests, up to ``max_bytes`` bytes of
        capture files, kept ``retention_seconds``; fraction 0 turns it off and deletes what was captured.
        Effective for the next request, with no reload. Idempotent.

        Returns:
            The model's settings and counters as the gateway now holds them (``{}`` when turned off).

        Raises:
            ValueError: a fraction outside 0-1, negative bytes or a retention below 1 s.
            ServingRuntimeError: the gateway refused the settings or does not answer.
        """
        fraction = float(fraction)
        if not 0 <= fraction <= 1:
            raise ValueError(f"a capture fraction is from 0 to 1; got {fraction!r}")
        if int(max_bytes) < 0 or int(retention_seconds) < 1:
            raise ValueError("max_bytes must be 0 or more and retention_seconds 1 or more")
        if "/" in model or model in (".", "..") or not model:
            raise ValueError(f"{model!r} is not a model name")
        with self._lock():
            settings = self._read_capture_file()
            if fraction > 0:
                settings[model] = {"fraction": fraction, "max_bytes": int(max_bytes),
                                   "retention_seconds": int(retention_seconds)}
                self._prepare_capture_directory(model)
            else:
                settings.pop(model, None)
            _atomic_write(self.capture_file, json.dumps(settings, indent=1, sort_keys=True))
            held = self._control("POST", settings, path="/capture")
            if fraction == 0:
                shutil.rmtree(self.capture_directory(model), ignore_errors=True)
            return held.get(model, {})

    def set_capture_usage(self, usage: dict[str, int]) -> dict[str, dict]:
        """Tell the gateway how many bytes each model's capture directory holds now (``{model: bytes}``), so
        its counter of the bound matches the disk after expired files were deleted; workers reopen their
        files. Returns ``capture()``.

        Raises:
            ServingRuntimeError: as ``capture``.
        """
        return self._control("PUT", {model: int(size) for model, size in usage.items()}, path="/capture")

    def _read_capture_file(self) -> dict[str, dict]:
        try:
            return json.loads(self.capture_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ServingRuntimeError(f"{self.capture_file} is not JSON: {exc}", retryable=False) from exc

    def _prepare_capture_directory(self, model: str) -> None:
        """Make ``capture_directory(model)``, readable and writable by nginx's workers alone (mode 0700)."""
        for path in (self.dir / "capture", self.capture_directory(model)):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o700)
            if os.geteuid() == 0:
                user = pwd.getpwnam(WORKER_USER)
                os.chown(path, user.pw_uid, user.pw_gid)


def _group_of(user: str) -> str:
    """The name of ``user``'s primary group (``nogroup`` for Debian's ``nobody``)."""
    import grp

    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
