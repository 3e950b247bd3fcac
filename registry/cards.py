"""Model cards: what a version is and what it may be used for, checked, saved (audited) and exported.

The fields follow Hugging Face's model card front matter: ``license``, ``datasets``, ``base_model``
and the evaluation results (``model-index``), with the intended use and the limitations as the
README's sections. :func:`readme` writes a README.md whose YAML front matter holds those fields.
"""

import math

import yaml
from django.db import transaction
from license_expression import ExpressionError, get_spdx_licensing

from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import InvalidInput
from registry.models import ModelCard, ModelVersion

CARD_FIELDS = ("license", "datasets", "base_model", "intended_use", "limitations", "evaluation_results")
OTHER_LICENSE = "other"  # Hugging Face's word for a license outside the SPDX list
TEXT_MAX_LENGTH = 10_000
NAME_MAX_LENGTH = 200
MAX_ITEMS = 100
RESULT_FIELDS = ("task", "dataset", "metric", "value")


def _name(value, field: str, limit: int = NAME_MAX_LENGTH) -> str:
    """``value`` stripped, once it is a string of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string")
    value = value.strip()
    if len(value) > limit:
        raise InvalidInput(f"{field} must be at most {limit} characters; it has {len(value)}")
    return value


def clean_license(value) -> str:
    """An SPDX license expression normalised (``apache-2.0`` → ``Apache-2.0``, ``MIT OR Apache-2.0``),
    ``other``, or empty.

    Raises:
        InvalidInput: not a string, too long, or not an SPDX expression.
    """
    value = _name(value, "license")
    if not value or value.lower() == OTHER_LICENSE:
        return value.lower()
    try:
        parsed = get_spdx_licensing().parse(value, validate=True, strict=True)
    except ExpressionError as exc:
        raise InvalidInput(f"license {value!r} is not an SPDX license expression ({exc}); use an SPDX "
                           f"identifier such as Apache-2.0 or MIT, or {OTHER_LICENSE!r}") from exc
    return parsed.render()


def _datasets(value) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise InvalidInput(f"datasets must be a list of at most {MAX_ITEMS} dataset names or URIs")
    if any(not isinstance(item, str) for item in value):
        raise InvalidInput("each dataset must be a string")
    names = [_name(item, "each dataset") for item in value]
    if not all(names):
        raise InvalidInput("a dataset name must not be empty")
    return list(dict.fromkeys(names))


def _results(value) -> list[dict]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise InvalidInput(f"evaluation_results must be a list of at most {MAX_ITEMS} results")
    results = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, dict) or set(item) - set(RESULT_FIELDS) or not {"metric", "value"} <= set(item):
            raise InvalidInput(f"evaluation result {number} must be an object with metric and value, and "
                               f"optionally task and dataset (no other fields)")
        score = item["value"]
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise InvalidInput(f"evaluation result {number}: value must be a finite number")
        metric = _name(item["metric"], f"evaluation result {number}'s metric")
        if not metric:
            raise InvalidInput(f"evaluation result {number}: metric must not be empty")
        results.append({"task": _name(item.get("task", ""), f"evaluation result {number}'s task"),
                        "dataset": _name(item.get("dataset", ""), f"evaluation result {number}'s dataset"),
                        "metric": metric, "value": score})
    return results


CLEANERS = {"license": clean_license, "datasets": _datasets, "base_model": lambda v: _name(v, "base_model"),
            "intended_use": lambda v: _name(v, "intended_use", TEXT_MAX_LENGTH),
            "limitations": lambda v: _name(v, "limitations", TEXT_MAX_LENGTH),
            "evaluation_results": _results}


def clean_card(fields: dict) -> dict:
    """Check a card's fields (any subset of ``CARD_FIELDS``) and return them normalised.

    Raises:
        InvalidInput: an unknown field, or a field that breaks its rule (the message names it).
    """
    unknown = sorted(set(fields) - set(CARD_FIELDS))
    if unknown:
        raise InvalidInput(f"unknown model card fields: {', '.join(unknown)}; a card has {', '.join(CARD_FIELDS)}")
    return {field: CLEANERS[field](value) for field, value in fields.items()}


def card_of(version: ModelVersion) -> ModelCard:
    """The version's card, or an unsaved empty one when it has none yet."""
    try:
        return version.card
    except ModelCard.DoesNotExist:
        return ModelCard(version=version)


def update_card(version: ModelVersion, *, actor, **fields) -> ModelCard:
    """Set some or all fields of a version's card (a field left out stays as it is), creating the card.

    Audited as ``version.card_updated`` with each changed field's before and after; a change that
    changes nothing writes nothing (idempotent).

    Args:
        version: the (live) model version; callers check the actor may change its model.
        actor: the requesting user.
        fields: any of ``CARD_FIELDS``.

    Returns:
        The saved (or unchanged) ModelCard.

    Raises:
        InvalidInput: as :func:`clean_card`.
    """
    clean = clean_card(fields)
    with transaction.atomic():
        ModelVersion.objects.select_for_update().get(pk=version.pk)
        card = ModelCard.objects.filter(version=version).first() or ModelCard(version=version)
        changes = {field: {"from": getattr(card, field), "to": value} for field, value in clean.items()
                   if getattr(card, field) != value}
        if not changes:
            return card
        for field, value in clean.items():
            setattr(card, field, value)
        card.updated_by = acting_user(actor)
        card.save()
        record_audit_event(action=AuditAction.CARD_UPDATED, actor=actor, obj_type="version", obj_id=version.pk,
                           model=version.model, data={"version": version.version, **changes})
    return card


def front_matter(card: ModelCard) -> dict:
    """The card as Hugging Face model card metadata: ``license`` (an SPDX identifier in lower case, as the
    Hub spells them), ``datasets``, ``base_model``, ``tags`` and ``model-index`` with the evaluation results;
    empty fields are left out."""
    version = card.version
    meta: dict = {}
    if card.license:
        meta["license"] = card.license.lower() if " " not in card.license else card.license
    if card.datasets:
        meta["datasets"] = list(card.datasets)
    if card.base_model:
        meta["base_model"] = card.base_model
    meta["tags"] = ["modelyard", version.format, *(f"{k}={v}" for k, v in sorted(version.tags.items()))]
    if card.evaluation_results:
        meta["model-index"] = [{"name": version.model.name, "results": [
            {"task": {"type": r["task"] or "other"},
             **({"dataset": {"name": r["dataset"], "type": r["dataset"]}} if r["dataset"] else {}),
             "metrics": [{"type": r["metric"], "value": r["value"]}]}
            for r in card.evaluation_results]}]
    return meta


def readme(card: ModelCard) -> str:
    """The card as a README.md: YAML front matter (:func:`front_matter`) between ``---`` lines, then the
    version's name, intended use, limitations, evaluation results and lineage as Markdown."""
    version = card.version
    header = yaml.safe_dump(front_matter(card), sort_keys=False, allow_unicode=True, default_flow_style=False)
    lines = ["---", header.rstrip("\n"), "---", "", f"# {version.model.name} v{version.version}", ""]
    if version.model.description:
        lines += [version.model.description, ""]
    lines += ["## Intended use", "", card.intended_use or "Not stated.", "",
              "## Limitations", "", card.limitations or "Not stated.", ""]
    if card.evaluation_results:
        lines += ["## Evaluation results", "", "| task | dataset | metric | value |", "|---|---|---|---|"]
        lines += [f"| {_cell(r['task'])} | {_cell(r['dataset'])} | {_cell(r['metric'])} | {r['value']} |"
                  for r in card.evaluation_results]
        lines.append("")
    lines += ["## Lineage", "",
              f"- format: {version.get_format_display()}",
              f"- artifact sha256: `{version.artifact_sha256}` ({version.artifact_size} bytes)"]
    for label, value in (("source commit", version.source_commit), ("CI run", version.ci_run_url),
                         ("training data", version.training_data_uri)):
        if value:
            lines.append(f"- {label}: {value}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, line breaks as spaces; "—" when empty."""
    return (text or "—").replace("|", "\\|").replace("\n", " ")
