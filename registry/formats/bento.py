"""BentoML models (``.bentomodel``) and Bentos (``.bento``), as BentoML exports them.

Both are xz-compressed tar archives (``bentoml.models.export_model`` / ``bentoml.export_bento``) with
``model.yaml`` or ``bento.yaml`` at the root. They are checked member by member without extracting
anything, the YAML is read with BentoML's own parsers (``yaml.safe_load`` underneath), and the tag
must follow BentoML's rules, be lower case as written, and carry the registered model's name. The
upload itself is what gets stored.
"""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from modelyard.errors import InvalidInput
from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, scan_archive
from registry.choices import ArtifactFormat
from registry.formats.prepared import PreparedArtifact
from registry.formats.single_file import parse_signature

__all__ = ["prepare_bentoml_archive"]

_YAML = {ArtifactFormat.BENTOML_MODEL: "model.yaml", ArtifactFormat.BENTO: "bento.yaml"}
_EXPORTER = {
    ArtifactFormat.BENTOML_MODEL: "bentoml.models.export_model",
    ArtifactFormat.BENTO: "bentoml.export_bento",
}
# What BentoML's YAML parsers raise on a malformed document (cattrs reports field errors in groups).
_PARSE_ERRORS = (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError, ExceptionGroup)


def prepare_bentoml_archive(
    path, kind: str, *, model_name: str, limits: ArchiveLimits, signature=None
) -> PreparedArtifact:
    """Check a BentoML export and describe what it serves.

    Args:
        path: the uploaded archive on local disk, or an open binary file over the stored object
            (read once, front to back; the returned artifact's ``path`` is then None).
        kind: ``ArtifactFormat.BENTOML_MODEL`` or ``ArtifactFormat.BENTO``.
        model_name: the registered model's name; the tag's name must equal it.
        limits: archive bounds.
        signature: optional, for a BentoML model whose model.yaml records no tensor types:
            ``{"inputs": [...], "outputs": [...]}`` as for single files.

    Returns:
        A PreparedArtifact (stored as uploaded) with the YAML as ``config_text``, the archive's files,
        the tag, and a signature with the model's methods or the Bento's API routes.

    Raises:
        InvalidInput: not an xz-compressed tar, unsafe or truncated, the YAML is missing or invalid,
            the tag breaks BentoML's rules or names another model, or a Bento lacks a model it uses.
    """
    from bentoml.exceptions import BentoMLException

    yaml_name = _YAML[kind]
    what = "a .bentomodel" if kind == ArtifactFormat.BENTOML_MODEL else "a .bento"
    try:
        listing = scan_archive(path, limits, wanted=lambda parts: parts == (yaml_name,))
    except ArchiveError as exc:
        raise InvalidInput(f"artifact refused: {exc}") from exc
    if (listing.kind, listing.compression) != ("tar", "xz"):
        raise InvalidInput(f"{what} must be the xz-compressed tar archive that {_EXPORTER[kind]} writes")
    raw = listing.contents.get(yaml_name)
    if raw is None:
        raise InvalidInput(f"{what} must hold {yaml_name} at its root (as {_EXPORTER[kind]} writes it)")
    try:
        text = raw.decode("utf-8")
        _check_tag_case(yaml.safe_load(text), yaml_name)
        info = _parse_info(kind, text)
    except (UnicodeDecodeError, BentoMLException, *_PARSE_ERRORS) as exc:
        raise InvalidInput(f"{yaml_name} is not valid: {_reason(exc)}") from exc
    tag = info.tag
    if tag.name != model_name:
        raise InvalidInput(
            f"{yaml_name} tags this {'model' if kind == ArtifactFormat.BENTOML_MODEL else 'Bento'} {str(tag)!r}, "
            f"but it is being registered as {model_name!r}; BentoML serves it under its tag name, so the two "
            "must be the same"
        )
    if kind == ArtifactFormat.BENTOML_MODEL:
        described = _describe_model(info, signature)
    else:
        if signature is not None:
            raise InvalidInput("a Bento declares its API in bento.yaml; signature applies to single-file uploads")
        described = _describe_bento(info, listing.files)
    return PreparedArtifact(
        format=kind,
        path=None if hasattr(path, "read") else Path(path),
        is_original=True,
        config_text=text,
        files=listing.files,
        signature=described,
        bento_tag=str(tag),
    )


def _check_tag_case(document, yaml_name: str) -> None:
    """BentoML lowercases a tag it reads, with a warning; refuse instead, so names never drift."""
    if not isinstance(document, dict):
        raise ValueError(f"{yaml_name} must be a mapping")
    for key in ("name", "version"):
        value = document.get(key)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{yaml_name} has no {key}")
        if value != value.lower():
            raise ValueError(f"the tag {key} {value!r} has upper-case letters; BentoML tags are lower case")


def _parse_info(kind: str, text: str):
    if kind == ArtifactFormat.BENTOML_MODEL:
        from bentoml._internal.models.model import ModelInfo

        return ModelInfo.from_yaml_file(io.StringIO(text))
    from bentoml._internal.bento.bento import BaseBentoInfo

    return BaseBentoInfo.from_yaml_file(io.StringIO(text))


def _reason(exc: Exception) -> str:
    while isinstance(exc, ExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return str(exc) or type(exc).__name__


def _describe_model(info, signature) -> dict:
    inputs, outputs = parse_signature(signature) if signature is not None else ([], [])
    methods = [
        {"name": name, "batchable": bool(sig.batchable), "batch_dim": list(sig.batch_dim)}
        for name, sig in sorted(info.signatures.items())
    ]
    return {
        "inputs": inputs,
        "outputs": outputs,
        "bentoml": {"tag": str(info.tag), "module": info.module, "methods": methods},
    }


def _describe_bento(info, files: tuple[str, ...]) -> dict:
    present = set(files)
    models = []
    for service in getattr(info, "services", []):
        models.extend(service.models)
    models.extend(getattr(info, "models", []))
    tags = sorted({str(model.tag) for model in models if getattr(model, "registry", "bentoml") == "bentoml"})
    missing = [tag for tag in tags if f"models/{tag.replace(':', '/')}/model.yaml" not in present]
    if missing:
        raise InvalidInput(f"the Bento uses models it does not hold: {', '.join(missing)}")
    inputs, outputs, apis = [], [], []
    schema = getattr(info, "schema", None) or {}
    for route in schema.get("routes", []) if isinstance(schema, dict) else []:
        if not isinstance(route, dict):
            continue
        api = str(route.get("name", ""))
        apis.append({"name": api, "route": str(route.get("route", "")), "batchable": bool(route.get("batchable"))})
        properties = (route.get("input") or {}).get("properties") or {}
        for name, spec in properties.items():
            inputs.append({"api": api, "name": str(name), **_tensor_type(spec)})
        if isinstance(route.get("output"), dict):
            outputs.append({"api": api, "name": "output", **_tensor_type(route["output"])})
    return {
        "inputs": inputs,
        "outputs": outputs,
        "bentoml": {
            "tag": str(info.tag), "service": str(getattr(info, "service", "")), "apis": apis, "models": tags,
        },
    }


def _tensor_type(spec) -> dict:
    """Data type and shape of one JSON-schema property of a BentoML API, as far as it says."""
    if not isinstance(spec, dict):
        return {"data_type": "any", "dims": []}
    data_type = spec.get("dtype") or spec.get("format") or spec.get("type") or str(spec.get("$ref", "any"))
    shape = spec.get("shape")
    dims = [d if isinstance(d, int) and not isinstance(d, bool) else -1 for d in shape] if isinstance(
        shape, list | tuple) else []
    return {"data_type": str(data_type).rsplit("/", 1)[-1], "dims": dims}
