"""Process control of one nginx master the host agent runs as a plain process (``NginxProcess``): the part
the BentoML front (``runtimes.nginx.NginxFront``) and the Triton gateway (``runtimes.gateway.TritonGateway``)
share.

Start it, check it answers, change its files under a host-wide lock with ``nginx -t`` and a graceful reload
(new workers take new requests, old ones finish the requests they hold and exit), wait for the old workers
to drain, stop it. Subclasses give the config; those with the Lua module drain each reload first
(``DRAIN_SERVER``), so no kept-alive client loses a request to it. ``TEMP_PATHS`` and ``DRAIN_SERVER`` are
config pieces both configs include; ``listen_address`` says where either listens for a host's inference URL.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import requests

from modelyard_agent.runtimes.base import ServingRuntimeError, atomic_write

logger = logging.getLogger(__name__)
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

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

# Every temporary file nginx writes stays under its own directory (an agent runs it unprivileged).
TEMP_PATHS = "\n".join(f"    {kind}_temp_path {{dir}}/tmp/{name};" for kind, name in (
    ("client_body", "body"), ("proxy", "proxy"), ("fastcgi", "fastcgi"), ("uwsgi", "uwsgi"), ("scgi", "scgi")))


def listen_address(inference_url: str, listen: str = "") -> tuple[int, str]:
    """Where a host's nginx listens for ``inference_url``: (its port, 80 by default; ``127.0.0.1`` for a
    loopback URL, else empty, which is every address). ``listen`` (``[host:]port``, as the agent's
    ``--gateway-listen`` checks it), when given, says instead: its port, and its host or every address."""
    if listen:
        port = listen.rsplit(":", 1)[-1]
        return int(port), listen[: -len(port) - 1].strip("[]") if ":" in listen else ""
    parts = urlsplit(inference_url if "://" in inference_url else f"http://{inference_url}")
    return parts.port or 80, "127.0.0.1" if parts.hostname in ("127.0.0.1", "localhost") else ""


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
    # Directories of the agent's user alone (``_private_directory``): where a control socket is bound.
    PRIVATE_SUBDIRS: tuple[str, ...] = ()
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
        for sub in self.PRIVATE_SUBDIRS:
            self._private_directory(self.dir / sub)
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

    @staticmethod
    def _private_directory(path: Path) -> None:
        """Make ``path`` a directory of the agent's user alone (mode 0700, a symlink refused), before nginx
        binds a socket in it: nginx's master sets its umask to 0 and leaves a Unix socket 0666, so the directory
        is what keeps other local users from connecting (search permission on it is checked first).

        Raises:
            ServingRuntimeError: a symlink or a file stands at ``path`` (not retryable).
        """
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise ServingRuntimeError(f"{path} must be a directory of the agent's own, not a link or a file; "
                                      "remove it", retryable=False)
        path.mkdir(mode=0o700, exist_ok=True)
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(descriptor, 0o700)
            if os.fstat(descriptor).st_uid != os.geteuid():
                os.fchown(descriptor, os.geteuid(), os.getegid())
        finally:
            os.close(descriptor)

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
                self._sleep_out_drain(self.DRAIN_SECONDS)
            self._nginx("-s", "reload")
            self._wait_reloaded(master, old_workers, timeout)
        finally:
            if drained and not self._set_draining(False):
                logger.warning("nginx in %s: the drain could not be ended; it expires by itself", self.dir)
        return old_workers

    def _sleep_out_drain(self, seconds: float, poll: float = 0.02) -> bool:
        """Wait ``seconds`` for busy kept-alive clients to be told to close, or less: until no client connection is
        open (``_client_connections``), since then none can lose a request to the reload (a reload of a host whose
        clients do not keep connections alive, or that has none, is not held up). True when it ended because no
        client connection was open, False when its time ran out."""
        deadline = time.monotonic() + seconds
        while self._client_connections() != 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    def _client_connections(self) -> int | None:
        """The client connections nginx holds open, busy or idle, other than the agent's own; None when unknown
        (here: a config without the Lua module, which does not drain)."""
        return None

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

