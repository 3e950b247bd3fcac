"""The nginx in front of a BentoML host (one master per host agent, one upstream per model): the config it
runs and the per-model changes to it (``NginxFront``).

Debian's nginx, run as a plain process (``runtimes.nginx_process.NginxProcess``) with a config under the
agent's state dir, listening on the host's inference port. Each model is served under ``/<model>/`` by the
``bentoml serve`` process its upstream file names. A swap rewrites that file, checks the whole config
(``nginx -t``) and sends a graceful reload: new workers take new requests, old workers finish the requests
they hold and exit. ``switch`` returns the old workers, and ``wait_drained`` waits for them to exit; after
that no request can still be on its way to the process the upstream used to name.

With Debian's nginx Lua module installed, a model can also be **split** for a canary
(``NginxFront.split``): its location then serves each request from the process of the version its route
picks (``runtimes.routes``, ``modelyard_routes.lua`` and ``modelyard_bento.lua``: the stable version, the
canary by percent and sticky ``X-Modelyard-Routing-Key``, or the version ``X-Modelyard-Version-Request``
names), through one upstream whose Lua balancer takes the port from the route. The route is replaced over
a Unix control socket with no reload, which also answers how many requests are in flight per version, so
a version is stopped only once nothing is on its way to it.

Layout::

    <root>/nginx/nginx.conf  nginx.pid  error.log  tmp/  routes.json  control/sock
    <root>/nginx/upstreams/<model>.conf   upstream block (http level)
    <root>/nginx/locations/<model>.conf   location /<model>/ and /_metrics/<model>/<version> (server level)

``/_metrics/<model>/<version>`` is the ``/metrics`` of the process serving that version, so Prometheus
scrapes each served version through the host's one inference port, and a path can only ever answer
with the metrics of the version it names: the location and the upstream change in one reload, and
once a version is replaced its path answers 404. Model names start with a letter or digit, so no
model's ``/<model>/`` can shadow ``/_metrics/``.
"""

from __future__ import annotations

import re
from pathlib import Path

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.key_control import KEYS_CONTROL, KEYS_HTTP, KEYS_SERVER, KeyControl
from modelyard_agent.runtimes.nginx_process import DRAIN_SERVER, TEMP_PATHS, NginxProcess
from modelyard_agent.runtimes.routes import (
    CONTROL_BODIES,
    LUA_DIR,
    METRICS_DICT_SIZE,
    SHADOW_HEADER,
    VERSION_HEADER,
    RouteControl,
    lua_available,
)
from modelyard_agent.runtimes.routes import load_modules as _load_modules

_SAFE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$")
_SERVER_PORT = re.compile(r"server 127\.0\.0\.1:(\d+)")
METRICS_PREFIX = "/_metrics"

_MAIN_CONF = """\
{load_modules}
worker_processes 1;
worker_shutdown_timeout {shutdown_timeout}s;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_timeout {keepalive}s;
{temp_paths}
{split_http}
    include {dir}/upstreams/*.conf;
    server {{
        listen {listen};
        location = /healthz {{ return 200 "ok\\n"; }}
        location / {{ return 404 "no model is served under this path\\n"; }}
{split_server}
        include {dir}/locations/*.conf;
    }}
{control_server}
}}
"""

# With nginx's Lua module: the routes of split models (``modelyard_routes.lua``, ``modelyard_bento.lua``),
# the one upstream whose balancer sends each request to the port of the version its route picked, and the
# control socket the agent changes routes through.
_SPLIT_HTTP = """\
    lua_package_path "{lua_dir}/?.lua;;";
    lua_shared_dict modelyard_routes 4m;
    lua_shared_dict modelyard_inflight 1m;
    lua_shared_dict modelyard_drain 16k;
    lua_shared_dict modelyard_metrics {metrics_size};
{keys_http}
    init_by_lua_block {{
        require("modelyard_routes").load("{dir}/routes.json")
        require("modelyard_keys").load("{dir}/keys.json")
        -- Loaded here, so the workers run the modules of this config even when newer files are installed.
        require("modelyard_bento")
        require("modelyard_drain")
        require("modelyard_workers")
    }}
    init_worker_by_lua_block {{ require("modelyard_routes").worker_started() }}
    upstream modelyard_split {{
        server 0.0.0.1;  # never used: the balancer picks the port
        balancer_by_lua_block {{ require("modelyard_bento").balance() }}
        keepalive 32;
    }}"""

_SPLIT_SERVER = DRAIN_SERVER.replace("{", "{{").replace("}", "}}") + """\
        # What the front measured of every request to a model (modelyard_metrics.lua), all versions.
        location = /metrics {{ content_by_lua_block {{ require("modelyard_metrics").expose() }} }}
        # /metrics of a version of a split model (a served model's own exact location wins over this one).
        location ~ ^{metrics_prefix}/(?<modelyard_model>[a-z0-9][a-z0-9_-]*)/(?<modelyard_metrics_version>[0-9]+)$ {{
            rewrite_by_lua_block {{
                require("modelyard_bento").metrics(ngx.var.modelyard_model, ngx.var.modelyard_metrics_version)
            }}
            proxy_pass http://modelyard_split;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
""" + KEYS_SERVER.replace("{", "{{").replace("}", "}}")

_CONTROL_SERVER = """\
    server {{
        listen unix:{dir}/control/sock;
{control_bodies}
        location = /routes {{ content_by_lua_block {{ require("modelyard_routes").control() }} }}
        location = /inflight {{ content_by_lua_block {{ require("modelyard_routes").counts() }} }}
        location = /drain {{ content_by_lua_block {{ require("modelyard_drain").control() }} }}
""" + KEYS_CONTROL.replace("{", "{{").replace("}", "}}") + """
        location / {{ return 404; }}
    }}"""

_UPSTREAM = """\
upstream modelyard_{key} {{
    server 127.0.0.1:{port} max_fails=0;
    keepalive 16;
}}
"""

_LOCATION = """\
location /{model}/ {{
    if ($http_x_modelyard_version_request !~ "^({version})?$") {{
        return 404 "{model} v$http_x_modelyard_version_request is not served on this host (served: {version})\\n";
    }}
    proxy_pass http://modelyard_{key}/;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_read_timeout 300s;
    add_header X-Modelyard-Version {version} always;
{measure}}}
location = {metrics_path} {{
    proxy_pass http://modelyard_{key}/metrics;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
}}
"""


# With the Lua module, a plain location measures its requests too (modelyard_metrics.lua).
_PLAIN_MEASURE = """\
    rewrite_by_lua_block {{
        require("modelyard_keys").check("{model}")
        require("modelyard_bento").plain_start()
    }}
    log_by_lua_block {{ require("modelyard_bento").plain_done("{model}", "{version}") }}
"""

_SPLIT_UPSTREAM = "# {model} is split: modelyard_bento.lua picks each request's port from its route (routes.json)\n"

# What only a split location holds (a plain one may call modelyard_bento too, to measure its requests).
_SPLIT_MARK = 'require("modelyard_bento").route('

_SPLIT_LOCATION = """\
location /{model}/ {{
    set $modelyard_version "";
    set $modelyard_path "";
    set $modelyard_shadow "";
    rewrite_by_lua_block {{
        require("modelyard_keys").check("{model}")
        require("modelyard_bento").route("{model}")
    }}
    log_by_lua_block {{ require("modelyard_bento").done("{model}") }}
    add_header {version_header} $modelyard_version always;
    mirror /_modelyard_shadow/{model};
    mirror_request_body on;
    proxy_pass http://modelyard_split;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_read_timeout 300s;
}}
location = /_modelyard_shadow/{model} {{
    internal;
    rewrite_by_lua_block {{ require("modelyard_bento").shadow("{model}") }}
    log_subrequest on;
    log_by_lua_block {{ require("modelyard_metrics").shadow_done("{model}") }}
    proxy_pass http://modelyard_split;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header {shadow_header} 1;
    proxy_read_timeout 300s;
}}
"""


def metrics_path(model: str, version: int) -> str:
    """The path under which a host's nginx answers with the ``/metrics`` of the process serving
    ``model`` version ``version`` (404 while another version, or none, serves it)."""
    return f"{METRICS_PREFIX}/{model}/{int(version)}"


class NginxFront(KeyControl, RouteControl, NginxProcess):
    """The nginx master of one BentoML host agent.

    With Debian's nginx Lua module installed (``splits``), a model may also be **split**: its location
    sends each request to the ``bentoml serve`` process of the version its route picks
    (``runtimes.routes``; the route carries each version's port), so a canary starts, changes its percent,
    is promoted or rolled back without a reload. Only turning a model's location from plain to split, and
    back, reloads.

    Args:
        root: the agent's BentoML directory; nginx lives in ``root/nginx``.
        listen_port, listen_host, shutdown_timeout: as ``NginxProcess``.
        client_keepalive: seconds nginx keeps an idle client connection open; 0 (the default here)
            answers every request with ``Connection: close``. A graceful reload closes the idle
            connections of the old workers, and a request a client sends on one at that moment
            fails with "connection closed without response" (measured: 1 in about 13,000 requests
            with 4 busy keep-alive clients, 10 swaps), unless the reload is drained first
            (``_set_draining``, with the Lua module): then no kept-alive client loses a request.
    """

    SUBDIRS = ("upstreams", "locations", "tmp")
    PRIVATE_SUBDIRS = ("control",)

    def __init__(self, root: Path, listen_port: int, listen_host: str = "", shutdown_timeout: float = 120.0,
                 client_keepalive: float = 0.0):
        super().__init__(Path(root) / "nginx", listen_port, listen_host, shutdown_timeout)
        self.client_keepalive = client_keepalive
        self.splits = lua_available()
        self.routes_file = self.dir / "routes.json"
        self.keys_file = self.dir / "keys.json"
        self.control_socket = self.dir / "control" / "sock"

    def main_config(self) -> str:
        split = {"load_modules": "", "split_http": "", "split_server": "", "control_server": ""}
        if self.splits:
            split = {"load_modules": _load_modules(),
                     "split_http": _SPLIT_HTTP.format(lua_dir=LUA_DIR, dir=self.dir, metrics_size=METRICS_DICT_SIZE,
                                                       keys_http=KEYS_HTTP),
                     "split_server": _SPLIT_SERVER.format(metrics_prefix=METRICS_PREFIX),
                     "control_server": _CONTROL_SERVER.format(dir=self.dir, control_bodies=CONTROL_BODIES)}
        return _MAIN_CONF.format(dir=self.dir, listen=self.listen, shutdown_timeout=int(self.shutdown_timeout),
                                 keepalive=int(self.client_keepalive), temp_paths=TEMP_PATHS.format(dir=self.dir),
                                 **split)

    def _set_draining(self, draining: bool, expires: float = 0.0) -> bool:
        """As ``NginxProcess._set_draining``, through the control socket's ``/drain``, when clients are kept
        alive and the Lua module is there; False otherwise (every answer says ``Connection: close`` anyway)."""
        return self.splits and self.client_keepalive > 0 and super()._set_draining(draining, expires)

    def is_split(self, model: str) -> bool:
        """True when ``model``'s location is split (its route picks the version of each request)."""
        path = self.dir / "locations" / f"{model}.conf"
        return path.exists() and _SPLIT_MARK in path.read_text()

    def split(self, model: str, timeout: float = 10.0) -> set[int]:
        """Make ``model``'s location split with a graceful reload: from then on its route (``set_route``,
        which must hold the ports of its versions first) picks the version of each request.

        Returns:
            The workers from before the reload, as ``switch``; they kept sending requests to the process
            the plain location named.

        Raises:
            ServingRuntimeError: this nginx has no Lua module, a bad model name, nginx refused the config,
                or the reload did not happen within ``timeout`` seconds.
        """
        if not self.splits:
            raise ServingRuntimeError("splitting a model's traffic needs nginx's Lua module: install Debian's "
                                      "libnginx-mod-http-lua and lua-cjson on this host", retryable=False)
        return self._apply_model(model, {
            "upstreams": _SPLIT_UPSTREAM.format(model=model),
            "locations": _SPLIT_LOCATION.format(model=model, version_header=VERSION_HEADER,
                                                shadow_header=SHADOW_HEADER),
        }, timeout)

    def upstream_port(self, model: str) -> int | None:
        """The backend port the model's upstream file names, or None when it has none."""
        path = self.dir / "upstreams" / f"{model}.conf"
        found = _SERVER_PORT.search(path.read_text()) if path.exists() else None
        return int(found.group(1)) if found else None

    def switch(self, model: str, port: int, version: int, timeout: float = 10.0) -> set[int]:
        """Point ``/<model>/`` and ``metrics_path(model, version)`` at ``127.0.0.1:port`` with a graceful reload.

        Returns once the workers from before the reload no longer accept requests (they are
        shutting down or gone), with their pids, for ``wait_drained``. On a refused config the old
        files are put back and nginx keeps serving as before.

        Raises:
            ServingRuntimeError: a bad model name, nginx refused the config, or the reload did not
                happen within ``timeout`` seconds.
        """
        key = model.replace("-", "_")
        return self._apply_model(model, {
            "upstreams": _UPSTREAM.format(key=key, port=int(port)),
            "locations": _LOCATION.format(model=model, key=key, version=int(version),
                                          metrics_path=metrics_path(model, version),
                                          measure=_PLAIN_MEASURE.format(model=model, version=int(version))
                                          if self.splits else ""),
        }, timeout)

    def remove(self, model: str, timeout: float = 10.0) -> set[int]:
        """Stop routing ``/<model>/`` (a graceful reload); returns the old workers, as ``switch``.

        Raises:
            ServingRuntimeError: as ``switch``.
        """
        return self._apply_model(model, {"upstreams": None, "locations": None}, timeout)

    def _apply_model(self, model: str, texts: dict[str, str | None], timeout: float) -> set[int]:
        if not _SAFE_NAME.match(model):
            raise ServingRuntimeError(f"model name {model!r} cannot be used in an nginx location", retryable=False)
        return self._apply({self.dir / sub / f"{model}.conf": text for sub, text in texts.items()}, timeout)
