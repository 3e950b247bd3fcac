"""Per-model routes held in a host nginx's shared memory, the part the Triton gateway
(``runtimes.gateway.TritonGateway``) and the BentoML front (``runtimes.nginx.NginxFront``) share.

A route is ``{"stable", "canary", "percent", "shadow", "shadow_percent"}`` (plus, on the BentoML front,
``"ports"``: ``{"<version>": port}``, the loopback port of each version's ``bentoml serve``). ``percent``
(0-100) of a model's requests that name no version go to ``canary``, the rest to ``stable``; a request
with ``X-Modelyard-Routing-Key`` is hashed (CRC-32) into 10,000 buckets, so it always reaches the same
version while the percent stays and raising the percent only moves keys to the canary (the Lua in
``modelyard_routes.lua``). Routes are replaced over the nginx's Unix control socket (``POST /routes``),
with no reload, and kept in ``routes.json`` beside it, which nginx reads when it starts. A change sends that
model's route alone (``PATCH /routes``); ``resync_routes`` sends every route.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

from modelyard_agent.runtimes.base import ServingRuntimeError, atomic_write

# The shared memory of the traffic series both fronts keep (modelyard_metrics.lua): about 2 KiB a series of
# (model, version, role), so some 4,000 series; past that nginx evicts the least recently used counters.
METRICS_DICT_SIZE = "8m"

# The control socket's bodies (every route, residency or capture setting at once: some 60 bytes a model) stay in
# memory up to 1 MiB; a larger one goes to nginx's temporary file, which modelyard_routes.lua's request_json reads.
# Past CONTROL_BODY_LIMIT (some 500,000 models at once) nginx refuses the body with 413 and a sentence naming the
# bound, which ``_control`` raises as its error.
CONTROL_BODY_LIMIT = "64m"
CONTROL_BODIES = f"""\
        client_max_body_size {CONTROL_BODY_LIMIT};
        client_body_buffer_size 1m;
        error_page 413 = @modelyard_control_too_large;
        location @modelyard_control_too_large {{
            default_type text/plain;
            return 413 "a control body is at most 64 MiB (client_max_body_size {CONTROL_BODY_LIMIT}): send less\\n";
        }}"""

LUA_DIR = Path(__file__).resolve().parent
MODULES = (Path("/usr/lib/nginx/modules/ndk_http_module.so"), Path("/usr/lib/nginx/modules/ngx_http_lua_module.so"))
ROUTING_KEY_HEADER = "X-Modelyard-Routing-Key"
VERSION_HEADER = "X-Modelyard-Version"
SHADOW_HEADER = "X-Modelyard-Shadow"
ROUTE_KEYS = ("stable", "canary", "percent", "shadow", "shadow_percent")


def lua_available() -> bool:
    """True when Debian's nginx Lua module (``libnginx-mod-http-lua``) is installed."""
    return all(path.exists() for path in MODULES)


def load_modules() -> str:
    """The ``load_module`` lines of an nginx.conf that routes with Lua.

    Raises:
        ServingRuntimeError: the module is not installed (not retryable).
    """
    missing = [str(path) for path in MODULES if not path.exists()]
    if missing:
        raise ServingRuntimeError(f"the gateway needs nginx's Lua module ({', '.join(missing)} is missing): "
                                  f"install Debian's libnginx-mod-http-lua and lua-cjson", retryable=False)
    return "\n".join(f"load_module {path};" for path in MODULES)


def read_json_file(path: Path) -> dict:
    """The JSON object an agent last wrote to ``path`` (routes.json, capture.json); ``{}`` when there is none.

    Raises:
        ServingRuntimeError: the file is not JSON (not retryable).
    """
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ServingRuntimeError(f"{path} is not JSON: {exc}", retryable=False) from exc


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection over a Unix socket (an nginx's control socket)."""

    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def make_route(*, stable: int, canary: int | None = None, percent: float = 0.0, shadow: int | None = None,
               shadow_percent: float = 0.0, ports: dict[int, int] | None = None) -> dict:
    """A route as the Lua module holds it.

    Args:
        stable, canary, shadow: version numbers (canary and shadow may be None).
        percent, shadow_percent: shares of requests, 0-100.
        ports: version -> loopback port of the process serving it (BentoML front only).

    Raises:
        ValueError: a percent outside 0-100, a version below 1 or a port outside 1-65535.
    """
    for name, value in (("canary", percent), ("shadow", shadow_percent)):
        if not 0 <= float(value) <= 100:
            raise ValueError(f"a {name} percent is from 0 to 100; got {value!r}")
    if any(v is not None and int(v) < 1 for v in (stable, canary, shadow)):
        raise ValueError("versions are numbered from 1")
    route = {"stable": int(stable), "canary": None if canary is None else int(canary), "percent": float(percent),
             "shadow": None if shadow is None else int(shadow), "shadow_percent": float(shadow_percent)}
    if ports is not None:
        if any(not 1 <= int(port) <= 65535 for port in ports.values()):
            raise ValueError(f"ports are from 1 to 65535; got {ports!r}")
        route["ports"] = {str(int(version)): int(port) for version, port in ports.items()}
    return route


class RouteControl:
    """Reads and replaces the routes of a running nginx through its control socket.

    Mixed into an ``NginxProcess`` subclass that sets ``routes_file`` and ``control_socket`` and provides
    ``_lock()`` (one change per host at a time).
    """

    routes_file: Path
    control_socket: Path

    def routes(self) -> dict[str, dict]:
        """The routes the running nginx holds: ``{model: route}``.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET")

    def set_route(self, model: str, *, stable: int, canary: int | None = None, percent: float = 0.0,
                  shadow: int | None = None, shadow_percent: float = 0.0, ports: dict[int, int] | None = None) -> dict:
        """Send ``percent`` (0-100) of ``model``'s requests that name no version to ``canary``, the rest to
        ``stable``, and mirror ``shadow_percent`` (0-100) of them to ``shadow``, whose answers no client sees;
        effective for the next request, with no reload. Idempotent.

        Returns:
            The route as nginx now holds it.

        Raises:
            ValueError: as ``make_route``.
            ServingRuntimeError: nginx refused the routes or does not answer.
        """
        route = make_route(stable=stable, canary=canary, percent=percent, shadow=shadow,
                           shadow_percent=shadow_percent, ports=ports)
        return self._change(model, route)[model]

    def remove_route(self, model: str) -> None:
        """Drop ``model``'s route. Idempotent.

        Raises:
            ServingRuntimeError: as ``set_route``.
        """
        self._change(model, None)

    def resync_routes(self) -> dict[str, dict]:
        """Send nginx every route ``routes.json`` holds at once (``POST /routes``), replacing what it holds (a
        nginx that starts reads the file itself; this is for one whose routes are in doubt). Idempotent.

        Returns:
            ``routes()`` after the change.

        Raises:
            ServingRuntimeError: nginx refused the routes or does not answer.
        """
        with self._lock():
            return self._control("POST", self._read_file())

    def _change(self, model: str, route: dict | None) -> dict[str, dict]:
        """Keep ``model``'s ``route`` (None: drop it) in ``routes.json`` and send nginx that one change
        (``PATCH /routes``); returns nginx's answer, ``{model: route}`` (``{}`` for a dropped route)."""
        with self._lock():
            routes = self._read_file()
            if route is None:
                routes.pop(model, None)
            else:
                routes[model] = route
            atomic_write(self.routes_file, json.dumps(routes, indent=1, sort_keys=True))
            return self._control("PATCH", {model: route})

    def inflight(self) -> dict[str, int]:
        """Requests a route gave a version, in flight now, ``{"<model>/<version>": count}`` (shadow copies
        included), summed over the nginx workers that still run: a worker that died cannot end its requests,
        so what it counted is left out.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable), or this nginx counts nothing
                (a config from before the counts: not retryable).
        """
        totals: dict[str, int] = {}
        for key, count in self._control("GET", path="/inflight").items():
            model, version, *worker = key.split("/")
            if worker and not Path(f"/proc/{worker[0]}").exists():
                continue
            totals[f"{model}/{version}"] = totals.get(f"{model}/{version}", 0) + int(count)
        return totals

    def wait_idle(self, model: str, version: int, timeout: float, poll: float = 0.02) -> None:
        """Wait until no request a route gave ``version`` of ``model`` is on its way to it (call it once the
        route no longer gives that version: no new request can then be counted on it); ``timeout`` and
        ``poll`` in seconds.

        Raises:
            ServingRuntimeError: requests still in flight after ``timeout`` seconds (retryable).
        """
        key = f"{model}/{int(version)}"
        deadline = time.monotonic() + timeout
        while (count := int(self.inflight().get(key) or 0)) > 0:
            if time.monotonic() > deadline:
                raise ServingRuntimeError(f"{count} request(s) to {model} v{version} still in flight after "
                                          f"{timeout:g} s", retryable=True)
            time.sleep(poll)

    def _set_draining(self, draining: bool, expires: float = 0.0) -> bool:
        """As ``NginxProcess._set_draining``, through the control socket's ``/drain`` (``modelyard_drain.lua``);
        False when the running nginx has none (started from an older config) or does not answer."""
        body = {"draining": bool(draining), **({"expires": float(expires)} if draining and expires else {})}
        try:
            return self._control("POST", body, path="/drain")["draining"] == bool(draining)
        except ServingRuntimeError:
            return False

    def _client_connections(self) -> int | None:
        """As ``NginxProcess._client_connections``, from the control socket's ``/drain`` (``modelyard_drain.lua``);
        None when the running nginx does not say (started from an older config) or does not answer."""
        try:
            clients = self._control("GET", path="/drain").get("clients")
        except ServingRuntimeError:
            return None
        return clients if isinstance(clients, int) else None

    def _read_file(self) -> dict[str, dict]:
        return read_json_file(self.routes_file)

    def _control(self, method: str, body: dict | None = None, timeout: float = 5.0, path: str = "/routes") -> dict:
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
