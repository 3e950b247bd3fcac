"""``bentoml serve`` processes: one per served version, each in its own session and BENTOML_HOME.

Two ``serve`` processes sharing one BENTOML_HOME wipe each other's metrics directory, so each
instance gets a home of its own under ``<root>/instances/`` with ``bentos`` and ``models`` linked to
the host's store. It is started with an exact tag (``:latest`` can serve two versions at once after
a worker restart), on a free loopback port below the kernel's ephemeral range (started again on
another one when a process took it before ``serve`` bound it), in a new session: killing BentoML's arbiter alone
leaves its workers serving, so a stop signals the whole process group, and every process whose
environment names the instance's home, then checks the port is free. ``BENTOML_CONTAINERIZED``
makes a service whose initialisation fails exit instead of restarting it forever.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.bento_store import bentoml_env

LOG_TAIL_BYTES = 16000
PORT_FLOOR = 20_000  # the lowest port an instance is given: below it sit the well-known and registered services
START_TRIES = 3  # starts of one instance when its port was taken before ``serve`` bound it
PORT_TAKEN = "Address already in use"  # errno 98's text in serve.log


@dataclass(frozen=True)
class Instance:
    """One ``bentoml serve`` process.

    Attributes:
        model: registered model name; version: its version number; tag: the Bento tag served.
        port: loopback port it listens on; home: its BENTOML_HOME; pid: its process (group) id,
            0 before it was started.
    """

    model: str
    version: int
    tag: str
    port: int
    home: str
    pid: int = 0

    def as_dict(self) -> dict:
        """A JSON-ready dict (the state file's form)."""
        return asdict(self)

    @property
    def url(self) -> str:
        """The instance's own base URL (not through nginx)."""
        return f"http://127.0.0.1:{self.port}"


def ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections and ``bind(port 0)`` (``net.ipv4.ip_local_port_range``;
    Linux's default 32768-60999 where it cannot be read)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A loopback TCP port nothing listens on now, outside the kernel's ephemeral range.

    ``serve`` binds its port seconds after it is chosen (once BentoML is imported); a port of the
    ephemeral range can be given in those seconds to any outgoing connection of the host, one outside
    it only to a process that asks for that port by number. A port of the ephemeral range is the
    fallback when 256 random ports outside it are all taken.
    """
    ephemeral = ephemeral_ports()
    outside = [port for port in range(PORT_FLOOR, 65536) if port not in ephemeral]
    for port in random.sample(outside, min(256, len(outside))):
        if port_is_free(port):
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """True when ``127.0.0.1:port`` can be bound (nobody listens there)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def plan_instance(root: Path, store_home: Path, *, model: str, version: int, tag: str) -> Instance:
    """Make the home of a new instance (links to the store) and choose its port; starts nothing."""
    home = Path(root) / "instances" / f"{model}-v{version}-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    for sub in ("bentos", "models"):
        (Path(store_home) / sub).mkdir(parents=True, exist_ok=True)
        (home / sub).symlink_to(Path(store_home).resolve() / sub)
    return Instance(model=model, version=int(version), tag=tag, port=free_port(), home=str(home))


def start_instance(planned: Instance) -> Instance:
    """Start ``bentoml serve <tag>`` for a planned instance, in a new session; returns it with its pid.

    Output goes to ``<home>/serve.log``.
    """
    log = open(Path(planned.home) / "serve.log", "ab")  # noqa: SIM115 - handed to the child
    env = {**bentoml_env(Path(planned.home)), "BENTOML_CONTAINERIZED": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "bentoml", "serve", planned.tag, "--host", "127.0.0.1",
             "--port", str(planned.port)],
            env=env, cwd=planned.home, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    return Instance(**{**planned.as_dict(), "pid": process.pid})


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_running(instance: Instance) -> bool:
    """True while the instance's leader process is alive (a zombie child is reaped, not counted).

    The leader is known by its pid and by the BENTOML_HOME in its environment (a pid reused after
    an agent restart names another home). A child of this process whose environment reads empty is
    still in ``execve``: ``Popen`` returns once the exec has closed the child's descriptors, but the
    kernel fills in the new image's environment (``mm->env_start``, set in ``create_elf_tables``)
    only after that, so on a loaded host the first check can fall in between.
    """
    if not instance.pid:
        return False
    _reap(instance.pid)
    try:
        fields = Path(f"/proc/{instance.pid}/stat").read_text().rsplit(")", 1)[1].split()
        state, parent = fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return False
    if state == "Z":
        return False
    home = _home_of(instance.pid)
    if home is None and parent == os.getpid() and _environ_is_empty(instance.pid):
        return True
    return home == instance.home


def _environ_is_empty(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _home_of(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"BENTOML_HOME="):
            return item.split(b"=", 1)[1].decode()
    return None


def processes_of(home: str) -> list[int]:
    """Pids of the live processes whose BENTOML_HOME is ``home`` (the arbiter and its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _home_of(int(entry.name)) == home:
            found.append(int(entry.name))
    return found


def log_tail(instance: Instance) -> str:
    """The last lines of the instance's serve.log (for error messages)."""
    path = Path(instance.home) / "serve.log"
    if not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        return handle.read().decode(errors="replace").strip()


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception): .+")


def startup_error(instance: Instance) -> str:
    """The first ``SomethingError: message`` line of the instance's log (the root cause of a failed
    start), else its last line."""
    lines = [line.strip() for line in log_tail(instance).splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    return errors[0] if errors else (lines[-1] if lines else "no output")


def is_ready(instance: Instance, timeout: float = 2.0) -> bool:
    """True when the instance answers 200 on /readyz."""
    try:
        return requests.get(f"{instance.url}/readyz", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def wait_ready(instance: Instance, timeout: float, poll: float = 0.1) -> None:
    """Wait until the instance answers /readyz (it does not while the service initialises).

    Raises:
        ServingRuntimeError: the process exited (its log's tail is in the message) or was not
            ready within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not is_ready(instance):
        if not is_running(instance):
            raise ServingRuntimeError(
                f"bentoml serve {instance.tag} exited before it was ready: {startup_error(instance)}",
                retryable=False)
        if time.monotonic() > deadline:
            raise ServingRuntimeError(f"bentoml serve {instance.tag} was not ready within {timeout:g} s",
                                      retryable=True)
        time.sleep(poll)


class StartFailed(ServingRuntimeError):
    """``start_ready`` failed; ``instance`` is the last one it started (for the caller to stop and discard)."""

    def __init__(self, error: ServingRuntimeError, instance: Instance):
        super().__init__(error.message, retryable=error.retryable, timed_out=error.timed_out)
        self.instance = instance


def start_ready(planned: Instance, timeout: float, started: Callable[[Instance], None]) -> Instance:
    """Start a planned instance and wait until it answers /readyz; returns it, with its pid.

    An instance that exits because its port was taken (another process bound it between the choice
    and ``serve``'s own bind) is started again on another port, ``START_TRIES`` starts in all, within
    the one ``timeout`` (seconds); its log so far is kept as ``serve-<port>.log``.

    Args:
        planned: from ``plan_instance``.
        timeout: seconds from the first start until the instance must be ready.
        started: called with each instance once started and before the wait (to record its pid).

    Raises:
        StartFailed: the instance exited or was not ready in time (``wait_ready``'s errors), with the
            last instance started.
    """
    deadline, starts = time.monotonic() + timeout, 0
    while True:
        instance = start_instance(planned)
        started(instance)
        starts += 1
        try:
            wait_ready(instance, timeout=max(0.0, deadline - time.monotonic()))
            return instance
        except ServingRuntimeError as exc:
            if starts == START_TRIES or PORT_TAKEN not in exc.message:
                raise StartFailed(exc, instance) from exc
        log = Path(instance.home) / "serve.log"
        log.rename(log.with_name(f"serve-{instance.port}.log"))
        planned = Instance(**{**planned.as_dict(), "port": free_port()})


def smoke_request(instance: Instance, sample_input: dict, signature: dict, timeout: float = 30.0) -> None:
    """POST the version's sample input to its first API route (as JSON) and require a 200.

    Raises:
        ServingRuntimeError: no API route is known, or the service did not answer 200.
    """
    apis = ((signature or {}).get("bentoml") or {}).get("apis") or []
    if not apis:
        raise ServingRuntimeError("the Bento declares no API to send the sample input to", retryable=False)
    route = apis[0].get("route") or f"/{apis[0]['name']}"
    try:
        answer = requests.post(f"{instance.url}{route}", json=sample_input, timeout=timeout)
    except requests.RequestException as exc:
        raise ServingRuntimeError(f"smoke request to {route} failed: {exc}", retryable=True) from exc
    if answer.status_code != 200:
        raise ServingRuntimeError(f"smoke request to {route} answered {answer.status_code}: {answer.text[:300]}",
                                  retryable=False)


def stop_instance(instance: Instance, timeout: float = 30.0) -> None:
    """Stop the instance's whole process group (SIGTERM, then SIGKILL after ``timeout`` s) and any
    process still using its home, then wait until its port is free.

    Raises:
        ServingRuntimeError: its port is still taken 10 s after every process was gone.
    """
    pids = set(processes_of(instance.home))
    if instance.pid and is_running(instance):
        pids.add(instance.pid)
    groups = {pid for pid in pids if _group_of(pid) == pid} | ({instance.pid} if instance.pid else set())
    _signal_all(groups, pids, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pids):
        _signal_all(groups, _alive(pids), signal.SIGKILL)
        end = time.monotonic() + 10
        while _alive(pids) and time.monotonic() < end:
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while not port_is_free(instance.port):
        if time.monotonic() > deadline:
            raise ServingRuntimeError(f"port {instance.port} is still taken after stopping {instance.tag}",
                                      retryable=True)
        time.sleep(0.05)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal_all(groups: set[int], pids: set[int], sig: int) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        _reap(pid)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive
