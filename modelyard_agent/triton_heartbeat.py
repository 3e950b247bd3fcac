"""What a Triton host agent reports about its host in each heartbeat (``collect_heartbeat``): Triton's
liveness, version and repository index, the GPUs' memory and the model repository's free disk."""

import shutil
from pathlib import Path

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.triton import TritonRuntime, read_memory_in_use


def collect_heartbeat(*, inference_url: str, metrics_url: str, model_repository: Path, labels: dict) -> dict:
    """What a host agent reports about its host; never raises.

    Returns:
        ``{"runtime_live": bool, "runtime_version": str | None, "models": [{"name", "version",
        "state", "reason" (only when Triton gives one)}], "gpus": [{"gpu_uuid", "memory_used", "memory_total"} (bytes)],
        "disk_free_bytes": int | None, "labels": {...}, "errors": [str]}``.
    """
    runtime = TritonRuntime(inference_url, timeout=5.0)
    report: dict = {"runtime_live": runtime.is_live(), "runtime_version": None, "models": [], "gpus": [],
                    "disk_free_bytes": None, "labels": labels, "errors": []}
    if report["runtime_live"]:
        try:
            report["runtime_version"] = runtime.server_version()
            report["models"] = [
                {"name": m.name, "version": m.version, "state": m.state, **({"reason": m.reason} if m.reason else {})}
                for m in runtime.repository_index()
            ]
        except ServingRuntimeError as exc:
            report["errors"].append(exc.message)
    if metrics_url:
        try:
            report["gpus"] = list(read_memory_in_use(metrics_url).gpus)
        except ServingRuntimeError as exc:
            report["errors"].append(exc.message)
    try:
        report["disk_free_bytes"] = shutil.disk_usage(model_repository).free
    except OSError as exc:
        report["errors"].append(f"model repository {model_repository}: {exc}")
    return report
