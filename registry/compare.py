"""What changed between two versions of a model: signature (each change compatible or breaking for the
clients of the older one), serving config, files, lineage and offline metrics.

``a`` is the version clients use now (the one replaced), ``b`` the one that replaces it; a change is
*breaking* when a request that ``a`` served, or a response a client of ``a`` reads, no longer fits ``b``.
"""

from dataclasses import asdict, dataclass

from google.protobuf import json_format

from modelyard_agent.formats.triton_config import ModelConfigError, parse_model_config
from registry.choices import ArtifactFormat
from registry.models import ModelVersion

SAME, COMPATIBLE, BREAKING = "same", "compatible", "breaking"


@dataclass(frozen=True)
class TensorChange:
    """One input or output of either version: ``a``/``b`` are ``{"data_type", "dims"}`` (None where the
    version lacks it); ``verdict`` is same, compatible or breaking, ``why`` says what changed."""

    kind: str
    name: str
    a: dict | None
    b: dict | None
    verdict: str
    why: str


def _tensors(signature: dict, kind: str) -> dict[str, dict]:
    return {t["name"]: {"data_type": t.get("data_type"), "dims": list(t.get("dims") or [])}
            for t in (signature or {}).get(kind, []) if t.get("name")}


def _dims_accept(wide: list, narrow: list) -> bool:
    """True when every shape ``narrow`` allows also fits ``wide`` (same rank; -1 takes any size)."""
    return len(wide) == len(narrow) and all(w == -1 or w == n for w, n in zip(wide, narrow, strict=True))


def _tensor_change(kind: str, name: str, a: dict | None, b: dict | None, optional: bool) -> TensorChange:
    if a is None:
        if kind == "output" or optional:
            return TensorChange(kind, name, a, b, COMPATIBLE, f"new {'optional ' if optional else ''}{kind}")
        return TensorChange(kind, name, a, b, BREAKING, "new required input: requests without it are refused")
    if b is None:
        why = ("removed: requests that send it are refused" if kind == "input"
               else "removed: clients that read it get nothing")
        return TensorChange(kind, name, a, b, BREAKING, why)
    if a["data_type"] != b["data_type"]:
        return TensorChange(kind, name, a, b, BREAKING, f"data type {a['data_type']} → {b['data_type']}")
    if a["dims"] == b["dims"]:
        return TensorChange(kind, name, a, b, SAME, "")
    # An input may widen (accept more shapes); an output may narrow (produce fewer).
    fits = _dims_accept(b["dims"], a["dims"]) if kind == "input" else _dims_accept(a["dims"], b["dims"])
    return TensorChange(kind, name, a, b, COMPATIBLE if fits else BREAKING,
                        f"dims {a['dims']} → {b['dims']}" + ("" if fits else f": not every {kind} of a fits b"))


def _batch_change(a: int, b: int) -> dict:
    if a == b:
        verdict, why = SAME, ""
    elif (a == 0) != (b == 0):
        verdict, why = BREAKING, "batching turned " + ("on" if b else "off") + ": every tensor's shape changes"
    elif b < a:
        verdict, why = BREAKING, f"batches of up to {a} are refused above {b}"
    else:
        verdict, why = COMPATIBLE, "larger batches allowed"
    return {"a": a, "b": b, "verdict": verdict, "why": why}


def compare_signatures(a: dict, b: dict) -> dict:
    """Compare two versions' signatures (``ModelVersion.signature``).

    Returns:
        ``{"verdict": "same" | "compatible" | "breaking", "tensors": [TensorChange as dict],
        "max_batch_size": {"a", "b", "verdict", "why"}}``; inputs first, then outputs, by name. The
        verdict is the worst of its parts.
    """
    changes = []
    optional = {t["name"] for t in (b or {}).get("inputs", []) if t.get("optional")}
    for kind, key in (("input", "inputs"), ("output", "outputs")):
        old, new = _tensors(a, key), _tensors(b, key)
        for name in sorted(set(old) | set(new)):
            changes.append(_tensor_change(kind, name, old.get(name), new.get(name), name in optional))
    batch = _batch_change(int((a or {}).get("max_batch_size") or 0), int((b or {}).get("max_batch_size") or 0))
    verdicts = {c.verdict for c in changes} | {batch["verdict"]}
    verdict = BREAKING if BREAKING in verdicts else COMPATIBLE if COMPATIBLE in verdicts else SAME
    return {"verdict": verdict, "tensors": [asdict(c) for c in changes], "max_batch_size": batch}


def breaking_changes(a: ModelVersion, b: ModelVersion) -> list[str]:
    """One sentence per change from ``a`` to ``b`` that breaks ``a``'s clients; empty when none does."""
    found = compare_signatures(a.signature, b.signature)
    sentences = [f"{t['kind']} {t['name']}: {t['why']}" for t in found["tensors"] if t["verdict"] == BREAKING]
    if found["max_batch_size"]["verdict"] == BREAKING:
        sentences.append(f"max_batch_size: {found['max_batch_size']['why']}")
    return sentences


def config_facts(version: ModelVersion) -> dict:
    """The serving config that matters when comparing: backend or platform, batching, instance groups
    and ensemble steps of a Triton config; the BentoML tag and methods of a BentoML export. Values are
    plain text, "—" where the config says nothing."""
    signature = version.signature or {}
    if version.format not in ArtifactFormat.triton_formats():
        bento = signature.get("bentoml") or {}
        methods = ", ".join(m.get("name", "") for m in bento.get("methods") or []) or "—"
        return {"runtime": "BentoML", "tag": bento.get("tag") or "—", "methods": methods}
    if not (version.config_text or "").strip():
        return {"config": "none recorded"}
    try:
        cfg = parse_model_config(version.config_text)
    except ModelConfigError:
        return {"config": "does not parse"}
    groups = [json_format.MessageToDict(g, preserving_proto_field_name=True) for g in cfg.instance_group]
    return {
        "backend": cfg.backend or "—",
        "platform": cfg.platform or "—",
        "max_batch_size": str(cfg.max_batch_size),
        "instance_group": "; ".join(
            f"{g.get('count', 1)} × {g.get('kind', 'KIND_AUTO')}" + (f" on GPUs {g['gpus']}" if g.get("gpus") else "")
            for g in groups) or "— (Triton's default)",
        "dynamic_batching": _message_text(cfg, "dynamic_batching"),
        "sequence_batching": _message_text(cfg, "sequence_batching"),
        "ensemble_steps": ", ".join(f"{s.model_name} (v{s.model_version})" for s in cfg.ensemble_scheduling.step)
        or "—",
    }


def _message_text(cfg, field: str) -> str:
    if not cfg.HasField(field):
        return "off"
    fields = json_format.MessageToDict(getattr(cfg, field), preserving_proto_field_name=True)
    return ", ".join(f"{k}={v}" for k, v in sorted(fields.items())) or "on (Triton's defaults)"


def _rows(a: dict, b: dict) -> list[dict]:
    return [{"field": key, "a": a.get(key, "—"), "b": b.get(key, "—"), "changed": a.get(key) != b.get(key)}
            for key in dict.fromkeys([*a, *b])]


def _lineage(version: ModelVersion) -> dict:
    return {
        "format": version.get_format_display(), "registered": version.created_at.strftime("%Y-%m-%d %H:%M UTC"),
        "registered_by": version.created_by.username if version.created_by else "—",
        "source_commit": version.source_commit or "—", "ci_run_url": version.ci_run_url or "—",
        "training_data_uri": version.training_data_uri or "—",
        "tags": ", ".join(f"{k}={v}" for k, v in sorted(version.tags.items())) or "—",
    }


def _metrics(a: dict, b: dict) -> list[dict]:
    rows = []
    for name in sorted(set(a) | set(b)):
        old, new = a.get(name), b.get(name)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
        # Rounded to 12 places so that 0.97 - 0.95 reads 0.02, not 0.020000000000000018.
        delta = round(new - old, 12) if numbers else None
        rows.append({"name": name, "a": old, "b": new, "delta": delta})
    return rows


def compare_versions(a: ModelVersion, b: ModelVersion) -> dict:
    """Everything the comparison page and API show about two versions of one model.

    Args:
        a: the version in use (the one replaced).
        b: the version that replaces it.

    Returns:
        ``{"model", "a", "b"`` (version numbers), ``"signature"`` (:func:`compare_signatures`),
        ``"config"``, ``"lineage"``: ``[{"field", "a", "b", "changed"}]``, ``"files"``: ``{"a_size",
        "b_size"`` (bytes), ``"same_artifact"`` (equal sha256), ``"a_sha256", "b_sha256", "added",
        "removed"`` (paths in the version directory), ``"common"`` (how many)}, ``"metrics"``: offline
        metrics ``[{"name", "a", "b", "delta"}]`` (delta b − a, None unless both are numbers)}.

    Raises:
        ValueError: the versions belong to different models.
    """
    if a.model_id != b.model_id:
        raise ValueError("compare versions of one model")
    files_a, files_b = set(a.artifact_files or []), set(b.artifact_files or [])
    return {
        "model": a.model.name, "a": a.version, "b": b.version,
        "signature": compare_signatures(a.signature, b.signature),
        "config": _rows(config_facts(a), config_facts(b)),
        "files": {"a_size": a.artifact_size, "b_size": b.artifact_size,
                  "a_sha256": a.artifact_sha256, "b_sha256": b.artifact_sha256,
                  "same_artifact": a.artifact_sha256 == b.artifact_sha256,
                  "added": sorted(files_b - files_a), "removed": sorted(files_a - files_b),
                  "common": len(files_a & files_b)},
        "lineage": _rows(_lineage(a), _lineage(b)),
        "metrics": _metrics(a.metrics or {}, b.metrics or {}),
    }
