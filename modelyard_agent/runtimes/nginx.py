"""The nginx in front of a BentoML host (one master per host agent, one upstream per model), and what it
shares with the Triton gateway (``NginxProcess``).

Debian's nginx, run as a plain process with a config under the agent's state dir, listening on the
host's inference port. Each model is served under ``/<model>/`` by the ``bentoml serve`` process its
upstream file names. A swap rewrites that file, checks the whole config (``nginx -t``) and sends a
graceful reload: new workers take new requests, old workers finish the requests they hold and exit.
``switch`` returns the old workers, and ``wait_drained`` waits for them to exit; after that no
request can still be on its way to the process the upstream used to name.

With Debian's nginx Lua module installed, a model can also be **split** for a canary
(``NginxFront.split``): its location then serves each request from the process of the version its route
picks (``runtimes.routes``, ``modelyard_routes.lua`` and ``modelyard_bento.lua``: the stable version, the
canary by percent and sticky ``X-Modelyard-Routing-Key``, or the version ``X-Modelyard-Version-Request``
names), through one upstream whose Lua balancer takes the port from the route. The route is replaced over
a Unix control socket with no reload, which also answers how many requests are in flight per version, so
a version is stopped only once nothing is on its way to it.

Layout::

    <root>/nginx/nginx.conf  nginx.pid  error.log  tmp/  routes.json  control.sock
    <root>/nginx/upstreams/<model>.conf   upstream block (http level)
    <root>/nginx/locations/<model>.conf   location /<model>/ and /_metrics/<model>/<version> (server level)

``/_metrics/<model>/<version>`` is the ``/metrics`` of the process serving that version, so Prometheus
scrapes each served version through the host's one inference port, and a path can only ever answer
with the metrics of the version it names: the location and the upstream change in one reload, and
once a version is replaced its path answers 404. Model names start with a letter or digit, so no
model's ``/<model>/`` can shadow ``/_metrics/``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import requests

from modelyard_agent.runtimes.base import ServingRuntimeError, atomic_write
from modelyard_agent.runtimes.routes import LUA_DIR, SHADOW_HEADER, VERSION_HEADER, RouteControl, lua_available
from modelyard_agent.runtimes.routes import load_modules as _load_modules

logger = logging.getLogger(__name__)
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
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

# The drain before a reload (``modelyard_drain.lua``), for the server block clients reach (the Lua module and a
# ``lua_shared_dict modelyard_drain`` needed). While draining, each request is taken through
# /_modelyard_closing/, whose keepalive_timeout 0 turns keep-alive off for the request (nginx never turns it
# back on), and on to its own location: its answer says "Connection: close" and the client reconnects.
DRAIN_SERVER = """\
        set_by_lua_block $modelyard_draining { return require("modelyard_drain").flag() }
        if ($modelyard_draining) { rewrite ^(.*)$ /_modelyard_closing$1 last; }
        location ^~ /_modelyard_closing/ {
            internal;
            keepalive_timeout 0;
            rewrite ^/_modelyard_closing(/.*)$ $1 last;
        }
"""

# With nginx's Lua module: the routes of split models (``modelyard_routes.lua``, ``modelyard_bento.lua``),
# the one upstream whose balancer sends each request to the port of the version its route picked, and the
# control socket the agent changes routes through.
_SPLIT_HTTP = """\
    lua_package_path "{lua_dir}/?.lua;;";
    lua_shared_dict modelyard_routes 4m;
    lua_shared_dict modelyard_inflight 1m;
    lua_shared_dict modelyard_drain 16k;
    init_by_lua_block {{
        require("modelyard_routes").load("{dir}/routes.json")
        -- Loaded here, so the workers run the modules of this config even when newer files are installed.
        require("modelyard_bento")
        require("modelyard_drain")
    }}
    init_worker_by_lua_block {{ require("modelyard_routes").seed() }}
    upstream modelyard_split {{
        server 0.0.0.1;  # never used: the balancer picks the port
        balancer_by_lua_block {{ require("modelyard_bento").balance() }}
        keepalive 32;
    }}"""

_SPLIT_SERVER = DRAIN_SERVER.replace("{", "{{").replace("}", "}}") + """\
        # /metrics of a version of a split model (a served model's own exact location wins over this one).
        location ~ ^{metrics_prefix}/(?<modelyard_model>[a-z0-9][a-z0-9_-]*)/(?<modelyard_metrics_version>[0-9]+)$ {{
            rewrite_by_lua_block {{
                require("modelyard_bento").metrics(ngx.var.modelyard_model, ngx.var.modelyard_metrics_version)
            }}
            proxy_pass http://modelyard_split;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}"""

_CONTROL_SERVER = """\
    server {{
        listen unix:{dir}/control.sock;
        location = /routes {{ content_by_lua_block {{ require("modelyard_routes").control() }} }}
        location = /inflight {{ content_by_lua_block {{ require("modelyard_routes").counts() }} }}
        location = /drain {{ content_by_lua_block {{ require("modelyard_drain").control() }} }}
        location / {{ return 404; }}
    }}"""

# Every temporary file nginx writes stays under its own directory (an agent runs it unprivileged).
TEMP_PATHS = "\n".join(f"    {kind}_temp_path {{dir}}/tmp/{name};" for kind, name in (
    ("client_body", "body"), ("proxy", "proxy"), ("fastcgi", "fastcgi"), ("uwsgi", "uwsgi"), ("scgi", "scgi")))

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
}}
location = {metrics_path} {{
    proxy_pass http://modelyard_{key}/metrics;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
}}
"""


_SPLIT_UPSTREAM = "# {model} is split: modelyard_bento.lua picks each request's port from its route (routes.json)\n"

_SPLIT_LOCATION = """\
location /{model}/ {{
    set $modelyard_version "";
    set $modelyard_path "";
    set $modelyard_shadow "";
    rewrite_by_lua_block {{ require("modelyard_bento").route("{model}") }}
    log_by_lua_block {{ require("modelyard_bento").done() }}
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
    proxy_pass http://modelyard_split;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header {shadow_header} 1;
    proxy_read_timeout 300s;
}}
"""


def listen_address(inference_url: str, listen: str = "") -> tuple[int, str]:
    """Where a host's nginx listens for ``inference_url``: (its port, 80 by default; ``127.0.0.1`` for a
    loopback URL, else empty, which is every address). ``listen`` (``[host:]port``, as the agent's
    ``--gateway-listen`` checks it), when given, says instead: its port, and its host or every address."""
    if listen:
        port = listen.rsplit(":", 1)[-1]
        return int(port), listen[: -len(port) - 1].strip("[]") if ":" in listen else ""
    parts = urlsplit(inference_url if "://" in inference_url else f"http://{inference_url}")
    return parts.port or 80, "127.0.0.1" if parts.hostname in ("127.0.0.1", "localhost") else ""


def metrics_path(model: str, version: int) -> str:
    """The path under which a host's nginx answers with the ``/metrics`` of the process serving
    ``model`` version ``version`` (404 while another version, or none, serves it)."""
    return f"{METRICS_PREFIX}/{model}/{int(version)}"


def _children(pid: int) -> dict[int, str]:
    """{pid: command line} of the live processes whose parent is ``pid``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != pid or stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue
    return found


def closed_to_others(directory: Path) -> Path | None:
    """The first of ``directory`` and its parents that exists and that others may not search (no ``o+x``),
    or None when nginx's workers, which a root master runs as an unprivileged user, can reach it."""
    here = Path(directory).resolve()
    return next((path for path in (here, *here.parents) if path.exists() and not os.stat(path).st_mode & 0o001),
                None)


class NginxProcess:
    """One nginx master run by the host agent as a plain process, with its config under ``directory``.

    The shared part of the BentoML front (``NginxFront``) and the Triton gateway
    (``runtimes.gateway.TritonGateway``): start it, check it answers, change config files under a host-wide
    lock with ``nginx -t`` and a graceful reload, wait for old workers to drain, stop it. Subclasses give
    the main config (``main_config``) and the subdirectories it includes (``SUBDIRS``).

    Args:
        directory: where nginx.conf, nginx.pid, error.log and tmp/ live.
        listen_port: the host's inference port (from its ``inference_url``).
        listen_host: the address to listen on; ``127.0.0.1`` for a loopback inference URL.
        shutdown_timeout: seconds old workers may take to finish their requests after a reload.
    """

    SUBDIRS: tuple[str, ...] = ("tmp",)
    # Seconds a reload is preceded by a drain (``_set_draining``): time for each busy kept-alive client to send
    # one request and be told to close, so none sits idle on an old worker when it closes its idle connections.
    DRAIN_SECONDS = 1.0

    def __init__(self, directory: Path, listen_port: int, listen_host: str = "", shutdown_timeout: float = 120.0):
        self.dir = Path(directory).resolve()
        self.listen_port = int(listen_port)
        self.listen = f"{listen_host}:{self.listen_port}" if listen_host else str(self.listen_port)
        self.shutdown_timeout = shutdown_timeout
        self.conf = self.dir / "nginx.conf"

    def main_config(self) -> str:
        """The text of nginx.conf."""
        raise NotImplementedError

    def _nginx(self, *args: str) -> None:
        done = subprocess.run([NGINX, "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c", str(self.conf),
                               *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise ServingRuntimeError(f"nginx {' '.join(args) or 'start'} failed: {done.stderr.strip()}",
                                      retryable=False)

    def master_pid(self) -> int | None:
        """The running master's pid, or None when nginx is not running."""
        try:
            pid = int((self.dir / "nginx.pid").read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid if "nginx: master" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") else None

    def ensure_running(self, timeout: float = 10.0) -> None:
        """Write the main config and start the master unless it runs; wait until it answers /healthz.

        A changed main config is checked and applied with a graceful reload.

        Raises:
            ServingRuntimeError: nginx refused the config or does not answer within ``timeout`` s; or
                the agent runs as root and a directory above ``directory`` is closed to others, so the
                workers (an unprivileged user) could not write the request bodies they spool to
                ``tmp/`` and would answer 500 to each one over their in-memory buffer (not retryable).
        """
        self.refuse_closed_parents(f"nginx's workers cannot reach {self.dir}/tmp, where they spool request bodies")
        for sub in self.SUBDIRS:
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        text = self.main_config()
        with self._lock():
            if not self.conf.exists() or self.conf.read_text() != text:
                atomic_write(self.conf, text)
                if self.master_pid() is not None:
                    self._reload(timeout)
            if self.master_pid() is None:
                self._nginx()
        deadline = time.monotonic() + timeout
        while not self.is_live():
            if time.monotonic() > deadline:
                raise ServingRuntimeError(f"nginx does not answer on port {self.listen_port}", retryable=True)
            time.sleep(0.05)

    def refuse_closed_parents(self, what: str) -> None:
        """Under a root agent, whose nginx runs its workers as an unprivileged user, raise when ``directory``
        or a parent is closed to others (``closed_to_others``); ``what`` starts the message (what the
        workers cannot do there). Does nothing for an agent that is not root: its workers are its own user.

        Raises:
            ServingRuntimeError: naming the closed directory, its mode and the ``chmod o+x`` that opens it
                (not retryable).
        """
        if os.geteuid() != 0 or (closed := closed_to_others(self.dir)) is None:
            return
        raise ServingRuntimeError(
            f"{what}: nginx's workers run as an unprivileged user, and {closed} is closed to others (mode "
            f"{os.stat(closed).st_mode & 0o777:o}); make it traversable (chmod o+x {closed}) or give the agent a "
            "state directory under one that is", retryable=False)

    def reload(self, timeout: float = 10.0) -> None:
        """Check the config on disk and reload gracefully: new workers take new connections, the old ones
        finish their requests and close their idle kept-alive connections. Returns once the old workers no
        longer accept requests.

        Raises:
            ServingRuntimeError: nginx is not running (retryable), refused the config, or did not reload
                within ``timeout`` seconds.
        """
        with self._lock():
            self._reload(timeout)

    def _reload(self, timeout: float, *, checked: bool = False) -> set[int]:
        """Check the config (unless ``checked``), drain, reload and wait; the pids of the workers from before.
        The caller holds ``_lock()``."""
        master = self.master_pid()
        if master is None:
            raise ServingRuntimeError("nginx is not running", retryable=True)
        old_workers = set(_children(master))
        if not checked:
            self._nginx("-t")
        # The flag expires by itself, so an agent killed mid-reload cannot leave every answer closing.
        drained = self._set_draining(True, expires=self.DRAIN_SECONDS + timeout + 5)
        try:
            if drained:
                time.sleep(self.DRAIN_SECONDS)
            self._nginx("-s", "reload")
            self._wait_reloaded(master, old_workers, timeout)
        finally:
            if drained and not self._set_draining(False):
                logger.warning("nginx in %s: the drain could not be ended; it expires by itself", self.dir)
        return old_workers

    def _set_draining(self, draining: bool, expires: float = 0.0) -> bool:
        """Start (for at most ``expires`` seconds) or end answering every client request with
        ``Connection: close`` (``modelyard_drain.lua``); True when the running nginx did. Here: no drain (a
        config without the Lua module)."""
        return False

    def is_live(self) -> bool:
        """True when nginx answers its /healthz on the inference port."""
        try:
            return requests.get(f"http://127.0.0.1:{self.listen_port}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    @contextmanager
    def _lock(self):
        """One change at a time per host (an exclusive ``flock`` on ``<dir>/.lock``): the agent runs several
        processes, and two changes must not each see the other's half-checked files or reload over each other."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _apply(self, files: dict[Path, str | None], timeout: float) -> set[int]:
        """Write (or, for None, delete) ``files``, check the config and reload gracefully.

        Returns once the workers from before the reload no longer accept requests, with their pids
        (for ``wait_drained``). On a refused config the old files are put back.

        Raises:
            ServingRuntimeError: nginx is not running, refused the config, or did not reload within
                ``timeout`` seconds.
        """
        with self._lock():
            if self.master_pid() is None:
                raise ServingRuntimeError("nginx is not running", retryable=True)
            before = {path: path.read_text() if path.exists() else None for path in files}
            self._write(files)
            try:
                self._nginx("-t")
            except ServingRuntimeError:
                self._write(before)
                raise
            return self._reload(timeout, checked=True)

    @staticmethod
    def _wait_reloaded(master: int, old_workers: set[int], timeout: float) -> None:
        """Wait until none of ``old_workers`` accepts requests any more and a new worker runs (the new
        config serves, its control socket included).

        Raises:
            ServingRuntimeError: not within ``timeout`` seconds (retryable).
        """
        deadline = time.monotonic() + timeout
        while True:
            workers = _children(master)
            accepting = [pid for pid, cmd in workers.items() if pid in old_workers and "shutting down" not in cmd]
            fresh = [pid for pid in workers if pid not in old_workers and "worker process" in workers[pid]]
            if not accepting and fresh:
                return
            if time.monotonic() > deadline:
                raise ServingRuntimeError(f"nginx did not reload within {timeout:g} s", retryable=True)
            time.sleep(0.02)

    @staticmethod
    def _write(files: dict[Path, str | None]) -> None:
        for path, text in files.items():
            if text is None:
                path.unlink(missing_ok=True)
            else:
                atomic_write(path, text)

    def wait_drained(self, old_workers: set[int], timeout: float) -> None:
        """Wait until the given (old) workers have finished their requests and exited.

        Raises:
            ServingRuntimeError: some still run after ``timeout`` seconds.
        """
        master = self.master_pid()
        deadline = time.monotonic() + timeout
        while master is not None and old_workers & set(_children(master)):
            if time.monotonic() > deadline:
                raise ServingRuntimeError(f"old nginx workers still busy after {timeout:g} s", retryable=True)
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the master gracefully (``nginx -s quit``) and wait for it to exit."""
        pid = self.master_pid()
        if pid is None:
            return
        self._nginx("-s", "quit")
        deadline = time.monotonic() + timeout
        while self.master_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)


class NginxFront(RouteControl, NginxProcess):
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

    def __init__(self, root: Path, listen_port: int, listen_host: str = "", shutdown_timeout: float = 120.0,
                 client_keepalive: float = 0.0):
        super().__init__(Path(root) / "nginx", listen_port, listen_host, shutdown_timeout)
        self.client_keepalive = client_keepalive
        self.splits = lua_available()
        self.routes_file = self.dir / "routes.json"
        self.control_socket = self.dir / "control.sock"

    def main_config(self) -> str:
        split = {"load_modules": "", "split_http": "", "split_server": "", "control_server": ""}
        if self.splits:
            split = {"load_modules": _load_modules(),
                     "split_http": _SPLIT_HTTP.format(lua_dir=LUA_DIR, dir=self.dir),
                     "split_server": _SPLIT_SERVER.format(metrics_prefix=METRICS_PREFIX),
                     "control_server": _CONTROL_SERVER.format(dir=self.dir)}
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
        return path.exists() and "modelyard_bento" in path.read_text()

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
                                          metrics_path=metrics_path(model, version)),
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
