"""Inference keys at a host's front (``modelyard_keys.lua``), shared by the Triton gateway
(``runtimes.gateway.TritonGateway``) and the BentoML front (``runtimes.nginx.NginxFront``).

A model that requires a key is held as ``{model: [digest, ...]}``: each digest the hex SHA-256 of a key that opens
it (what the control plane stores and sends, ``deployments.routes.wanted_inference_keys``; the key itself never
reaches a host). A request to such a model without ``Authorization: Bearer <key>`` is answered 401, one with a key
whose digest is not among the model's 403; a client address that keeps sending wrong keys is answered 429 with
``Retry-After`` (nginx's ``limit_req``). Models absent from the table require no key. The keys are replaced over the
nginx's control socket with no reload (``PATCH /keys`` with the models that changed) and kept in ``keys.json``,
which nginx reads when it starts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from modelyard_agent.runtimes.base import atomic_write
from modelyard_agent.runtimes.routes import read_json_file

_DIGEST = re.compile(r"^[0-9a-f]{64}$")

# Wrong keys a client address may send: BAD_KEY_RATE a second after a burst of BAD_KEY_BURST, then 429 until
# it slows down (a brute force of 10,000 guesses takes more than half an hour).
BAD_KEY_RATE = "5r/s"
BAD_KEY_BURST = 10
RETRY_AFTER_S = 1

# The http block's part: the keys' shared dict (about 100 bytes a key: some 40,000 keys) and the wrong keys'
# zone keyed on the client's address (nginx's LRU bounds it: about 16,000 addresses a MiB).
KEYS_HTTP = f"""\
    lua_shared_dict modelyard_keys 4m;
    limit_req_zone $binary_remote_addr zone=modelyard_bad_keys:4m rate={BAD_KEY_RATE};"""

_GUESSING = json.dumps({"error": "too many wrong inference keys from this address: slow down",
                        "code": "inference_key_guessing"})

# The client server's part: where modelyard_keys.check sends a wrong key (its limit_req runs before the 403), and
# the 429 of a client past it.
KEYS_SERVER = f"""\
        location @modelyard_bad_key {{
            limit_req zone=modelyard_bad_keys burst={BAD_KEY_BURST} nodelay;
            limit_req_status 429;
            error_page 429 = @modelyard_key_guessing;
            content_by_lua_block {{ require("modelyard_keys").refuse_wrong() }}
        }}
        location @modelyard_key_guessing {{
            default_type application/json;
            add_header Retry-After {RETRY_AFTER_S} always;
            return 429 '{_GUESSING}';
        }}"""

KEYS_CONTROL = '        location /keys { content_by_lua_block { require("modelyard_keys").control() } }'


def check_keys(model: str) -> str:
    """The Lua call a client location's rewrite phase makes first for ``model`` (a Lua expression, such as
    ``ngx.var.modelyard_model``, or a quoted name)."""
    return f'require("modelyard_keys").check({model})'


class KeyControl:
    """Reads and changes the inference keys a running nginx holds, through its control socket.

    Mixed into an ``NginxProcess`` subclass that sets ``keys_file`` and provides ``_lock()`` and ``_control()``.
    """

    keys_file: Path

    def inference_keys(self) -> dict[str, list[str]]:
        """The keys the running nginx holds: ``{model: [hex digest, ...]}``, sorted, for the models that require one.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET", path="/keys")

    def set_inference_keys(self, changes: dict[str, list[str] | None]) -> dict[str, list[str]]:
        """Make each model of ``changes`` require a key that hashes to one of its digests (``[]``: no key opens it),
        or none (None); other models stay as they are. From the next request, with no reload; kept in ``keys.json``
        for the next start. Only these models go to nginx (``PATCH /keys``). Idempotent.

        Args:
            changes: ``{model: [hex SHA-256 digest, ...] or None}``.

        Returns:
            ``{model: [digest, ...]}`` as nginx now holds the models of ``changes`` that require a key.

        Raises:
            ValueError: a digest that is not 64 hex characters, or not a model name.
            ServingRuntimeError: nginx refused the keys or does not answer.
        """
        cleaned: dict[str, list[str] | None] = {}
        for model, digests in changes.items():
            if "/" in model or "\0" in model or model in (".", "..") or not model:
                raise ValueError(f"{model!r} is not a model name")
            if digests is not None:
                digests = sorted({str(digest).lower() for digest in digests})
                if not all(_DIGEST.match(digest) for digest in digests):
                    raise ValueError(f"the keys of {model} must be hex SHA-256 digests")
            cleaned[model] = digests
        with self._lock():
            held = read_json_file(self.keys_file)
            for model, digests in cleaned.items():
                if digests is None:
                    held.pop(model, None)
                else:
                    held[model] = digests
            atomic_write(self.keys_file, json.dumps(held, indent=1, sort_keys=True))
            self.keys_file.chmod(0o600)
            return self._control("PATCH", cleaned, path="/keys")

    def key_refusals(self) -> dict[str, int]:
        """Requests refused since nginx started, by reason: ``{"missing": n, "wrong": n}`` (a wrong key past the
        rate limit is counted as wrong too, before its 429).

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET", path="/keys/refusals")
