"""The BentoML host adapter: a locked Bento Store and blue/green ``bentoml serve`` processes behind nginx
(``modelyard_agent.bentoml_host``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from modelyard_agent.adapters.common import load_deadline, running_profiles, unload_deadline
from modelyard_agent.bentoml_host import deploy_bentoml_version, route_bentoml_model, unload_bentoml_model
from modelyard_agent.bentoml_instances import collect_bentoml_heartbeat, front_for, tidy_models
from modelyard_agent.config import current as settings
from modelyard_agent.coordination import host_model_lock
from modelyard_agent.profiling.bentoml import profile_bentoml_version, stop_stale_instances
from modelyard_agent.runtimes.base import ServingRuntimeError


class BentoMLHostAgent:
    """BentoML: a locked Bento Store and blue/green ``bentoml serve`` processes behind nginx
    (``modelyard_agent.bentoml_host``)."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        """As ``HostAgent.deploy``. A payload with ``canary_percent`` or ``shadow_percent`` keeps the version that
        serves (the stable one) serving beside the new one and splits the model's requests on nginx
        (``bentoml_host._deploy_canary``); a payload with neither, for the stable or the canary version of a
        split model, sends every request to it and stops the other (a rollback or a promotion, no reload)."""

        return deploy_bentoml_version(payload, root=Path(settings().bentoml_root), report=report,
                                      load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload))

    def heartbeat(self, request: dict) -> dict:
        """Start nginx unless it runs (so a host serving nothing yet is online), tidy what a dead agent left
        (under each model's lock, skipping models being deployed), then report."""

        root = Path(settings().bentoml_root)
        errors = []
        try:
            front_for(root, request["inference_url"]).ensure_running()
        except ServingRuntimeError as exc:
            errors.append(f"nginx: {exc.message}")
        tidied = tidy_models(root, request["inference_url"], lambda model: host_model_lock(request["host"], model))

        stop_stale_instances(root, running_profiles(request["host"]))
        report = collect_bentoml_heartbeat(inference_url=request["inference_url"],
                                           root=root, labels=settings().labels)
        report["tidied"] = tidied
        report["errors"] = errors + report["errors"]
        return report

    def route(self, payload: dict) -> dict:
        """Set ``payload["model"]``'s route on the host's nginx (``contract.RoutePayload``), with no reload, once
        each version it names runs here (``bentoml_host.route_bentoml_model``); returns the route nginx holds.

        Raises:
            ServingRuntimeError: nginx has no Lua module, the model has no canary here, a version is not served
                here, or nginx does not answer.
        """

        return route_bentoml_model(payload, root=Path(settings().bentoml_root))

    def set_inference_keys(self, payload: dict) -> dict:
        """As ``HostAgent.set_inference_keys``, on the host's nginx (started unless it runs).

        Raises:
            ServingRuntimeError: nginx has no Lua module (not retryable), or it refused the keys or did not answer.
        """

        front = front_for(Path(settings().bentoml_root), payload["inference_url"])
        if not front.splits:
            raise ServingRuntimeError("checking inference keys needs nginx's Lua module: install Debian's "
                                      "libnginx-mod-http-lua and lua-cjson on this host", retryable=False)
        front.ensure_running()
        return front.set_inference_keys(payload["keys"])

    def replay(self, payload: dict, *, progress, should_stop) -> dict:
        """Replays run on Triton hosts only (BentoML hosts capture no requests yet)."""
        return {"status": "failed", "done": 0, "total": 0, "summary": {},
                "message": "replays are not available on BentoML hosts yet"}

    def unload(self, payload: dict) -> None:

        unload_bentoml_model(payload, root=Path(settings().bentoml_root), timeout=unload_deadline(payload))

    def profile(self, payload: dict, *, progress, should_stop) -> dict:

        return profile_bentoml_version(payload, root=Path(settings().bentoml_root), wrk_binary=settings().wrk,
                                       progress=progress, should_stop=should_stop,
                                       load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload))


