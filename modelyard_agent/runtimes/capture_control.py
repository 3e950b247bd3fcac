"""Request capture settings of a Triton host's gateway (``modelyard_capture.lua``), mixed into
``runtimes.gateway.TritonGateway``; the file format is the capture contract (docs/architecture.md)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path

from modelyard_agent.runtimes.base import ServingRuntimeError, atomic_write
from modelyard_agent.runtimes.routes import read_json_file

# Request bodies up to this many bytes are held in memory, so the log phase can capture them; a larger one
# goes to a temporary file and, when drawn for capture, is counted as skipped.
CAPTURE_BODY_LIMIT = 1 << 20
# Without privileges nginx's workers run as the agent's user; an agent run as root has them run as this one.
WORKER_USER = "nobody"
CAPTURE_SUFFIX = ".ndjson"


class CaptureControl:
    """Reads and changes a running gateway's request capture through its control socket (``/capture``).

    Mixed into ``TritonGateway``, which sets ``dir`` and ``capture_file`` and provides ``_lock()``, ``_control()``
    and ``refuse_closed_parents()``.
    """

    dir: Path
    capture_file: Path

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
            settings = read_json_file(self.capture_file)
            if fraction > 0:
                settings[model] = {"fraction": fraction, "max_bytes": int(max_bytes),
                                   "retention_seconds": int(retention_seconds)}
                self._prepare_capture_directory(model)
            else:
                settings.pop(model, None)
            atomic_write(self.capture_file, json.dumps(settings, indent=1, sort_keys=True))
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

    def _prepare_capture_directory(self, model: str) -> None:
        """Make ``capture_directory(model)``, readable and writable by nginx's workers alone (mode 0700).

        Under a root agent, ``capture/`` stays root's (mode 0711: the workers pass through it but cannot
        replace what is in it) and only ``capture/<model>`` is handed to ``WORKER_USER``; a symlink in
        either place is refused, never followed.

        Raises:
            ServingRuntimeError: the agent runs as root and a directory above the gateway's is closed to
                ``WORKER_USER`` (no search permission for others), so the workers could write nothing and
                every drawn request would be skipped; or a symlink stands where a directory belongs (not
                retryable).
        """
        root = os.geteuid() == 0
        self.refuse_closed_parents(f"request capture: nginx's workers ({WORKER_USER}) cannot reach {self.dir}")
        for path, mode, owner in ((self.dir / "capture", 0o711 if root else 0o700, "root" if root else None),
                                  (self.capture_directory(model), 0o700, WORKER_USER if root else None)):
            if path.is_symlink():
                raise ServingRuntimeError(f"request capture: {path} is a symlink, not a directory; remove it",
                                          retryable=False)
            path.mkdir(exist_ok=True)
            descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchmod(descriptor, mode)
                if owner is not None:
                    user = pwd.getpwnam(owner)
                    os.fchown(descriptor, user.pw_uid, user.pw_gid)
            finally:
                os.close(descriptor)
