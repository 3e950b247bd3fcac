"""Registry pages: the models list, a model's page and the audit log."""

from datetime import timedelta
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from accounts.access import Action, Principal, check, scope_team_filter
from accounts.tokens import token_state
from audit.choices import AuditAction
from audit.models import AuditEvent
from modelyard.errors import DomainError
from monitoring.promql import PAGE_RANGES, page_range
from registry.access import model_for, visible_models
from registry.aliases import delete_alias, protect_alias, set_alias
from registry.cards import card_of, readme, update_card
from registry.choices import ArtifactFormat, VersionStatus
from registry.compare import compare_versions
from registry.deletion import delete_version, may_delete_version
from registry.filters import RegisteredModelFilter
from registry.formats import ACCEPTED_KINDS, ACCEPTED_SUFFIXES
from registry.forms import AliasForm, InferenceKeyForm, ModelCardForm, VersionUploadForm
from registry.inference_keys import create_inference_key, require_inference_key, revoke_inference_key
from registry.models import Alias, InferenceKey, ModelVersion, RegisteredModel
from registry.pages import forbidden_unless, model_or_404, version_or_404
from registry.registered_models import update_model
from registry.signals import comparison_panels, serving_lookup
from registry.versions import artifact_download_url

MODEL_PAGE_SIZE = 50
DESCRIPTION_MAX_LENGTH = 10_000  # as the API's


def keyset_page(queryset, *, after: str = "", before: str = "", size: int) -> tuple[list, bool, bool]:
    """One page of ``queryset`` by name: the ``size`` names after ``after`` (or just before ``before``).

    A position, not an offset: models registered while someone pages are neither skipped nor repeated.

    Returns:
        (rows in name order, whether a previous page exists, whether a next page exists).
    """
    if before:
        rows = list(queryset.filter(name__lt=before).order_by("-name")[: size + 1])
        return rows[:size][::-1], len(rows) > size, True
    if after:
        queryset = queryset.filter(name__gt=after)
    rows = list(queryset.order_by("name")[: size + 1])
    return rows[:size], bool(after), len(rows) > size


@login_required
def model_list(request):
    """Registered models with their latest version number and version count, the versions they serve
    (and on how many hosts) and their aliases; searchable (``search``, ``tag``, ``alias``,
    ``artifact_format``, ``created_after``, ``created_before``) and paged by name (``after``/``before``).
    A page costs the same SQL queries for one model as for fifty."""
    aliases = Prefetch("aliases", queryset=Alias.objects.select_related("version").order_by("name"))
    found = RegisteredModelFilter(
        request.GET, queryset=visible_models(Principal.of(request)).select_related("team").with_version_summary()
        .prefetch_related(aliases)
    )
    models, has_previous, has_next = [], False, False
    if found.is_valid():
        models, has_previous, has_next = keyset_page(
            found.qs, after=request.GET.get("after", ""), before=request.GET.get("before", ""), size=MODEL_PAGE_SIZE
        )
    attach_serving(models)
    query = urlencode({k: v for k, v in request.GET.items() if k not in ("after", "before") and v})
    return render(request, "registry/model_list.html", {
        "models": models, "has_previous": has_previous, "has_next": has_next,
        "filters": found.form.cleaned_data if found.is_valid() else request.GET, "errors": found.errors,
        "query": query, "formats": ArtifactFormat.choices,
    })


def attach_serving(models: list) -> None:
    """Set ``serving`` on each of ``models`` (RegisteredModel rows): ``[{"version": number, "hosts": [names]}]``,
    newest version first, empty where it serves nowhere, as the receivers of ``serving_lookup`` report."""
    found: dict[int, list[dict]] = {}
    if models:
        for _receiver, answer in serving_lookup.send(sender=RegisteredModel, models=models):
            for pk, rows in (answer or {}).items():
                found.setdefault(pk, []).extend(rows)
    for model in models:
        model.serving = found.get(model.pk, [])


@login_required
def model_detail(request, name: str):
    """A model's versions and aliases; its metrics, promotion policies and deployments (with per-host
    state) load into the page from the monitoring, promotions and deployments apps' panels."""
    model = model_or_404(request, name)
    versions = (
        model.versions.exclude(status=VersionStatus.DELETED).select_related("created_by")
        .prefetch_related("aliases").order_by("-version")
    )
    formats = {version.format for version in versions}
    context = {
        "model": model, "versions": versions, "ranges": PAGE_RANGES, "range": page_range(request.GET.get("range")),
        "aliases": model.aliases.select_related("version", "updated_by").order_by("name"),
        # Request capture and replays are the Triton gateway's: a BentoML model's page says what applies instead.
        "bentoml_only": bool(formats) and formats <= ArtifactFormat.bentoml_formats(),
    }
    # The metrics, promotion and deployment panels come from those apps' own URLs (htmx).
    return render(request, "registry/model_detail.html", context)


AUDIT_PAGE_SIZE = 50


@login_required
def audit_log(request):
    """The audit log, newest first, filterable by action, model and actor (``?action=&model=&actor=``)."""
    events = AuditEvent.objects.select_related("model").order_by("-id")
    principal = Principal.of(request)
    if not principal.is_admin:  # events of no model (hosts, webhooks, teams) are for administrators
        events = scope_team_filter(principal, events.filter(model__isnull=False), "model__team")
    filters = {key: request.GET.get(key, "").strip() for key in ("action", "model", "actor")}
    if filters["action"]:
        events = events.filter(action=filters["action"])
    if filters["model"]:
        events = events.filter(model__name=filters["model"])
    if filters["actor"]:
        events = events.filter(actor_label=filters["actor"])
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "registry/audit_log.html", {
        "page": page, "filters": filters, "actions": AuditAction.choices,
        "query": urlencode({k: v for k, v in filters.items() if v}),
    })


@login_required
def version_detail(request, name: str, version: int):
    """One version: format, model card, inputs and outputs, ensemble members, config, files, metadata,
    aliases and its deployments."""
    model_version = version_or_404(request, name, version)
    return render(request, "registry/version_detail.html", {
        "model": model_version.model, "version": model_version,
        "aliases": model_version.aliases.order_by("name"),
        "members": model_version.members.select_related("member__model"),
        "may_delete": may_delete_version(model_version, Principal.of(request)),
        "card": card_of(model_version),
    })


def compare_choice(model, query, live: list[int]) -> tuple[ModelVersion | None, ModelVersion | None, str]:
    """The two versions ``?a=&b=`` of ``query`` name for comparing (by default the two newest of ``live``,
    the live version numbers newest first; older first), and an error sentence when they do not name
    two live versions of ``model``."""
    raw = {key: (query.get(key) or "").strip() for key in ("a", "b")}
    if not raw["a"] and not raw["b"]:
        if len(live) < 2:
            return None, None, f"{model.name} has fewer than two versions to compare"
        raw = {"a": str(live[1]), "b": str(live[0])}
    numbers = {}
    for key, text in raw.items():
        if not (text.isascii() and text.isdigit()):  # '²'.isdigit() is True, int('²') fails
            return None, None, f"{key} must be a version number, not {text!r}"
        numbers[key] = int(text)
        if numbers[key] not in live:
            return None, None, f"{model.name} has no version {numbers[key]}"
    rows = {v.version: v for v in model.versions.filter(version__in=numbers.values()).select_related(
        "model", "created_by")}
    return rows[numbers["a"]], rows[numbers["b"]], ""


@login_required
def version_compare(request, name: str):
    """Compare two versions of a model (``?a=3&b=4``, by default the two newest): signature changes marked
    compatible or breaking for the clients of ``a``, serving config, files, lineage and offline metrics;
    what other apps add through ``comparison_panels`` (the deployments app: both versions' performance
    cards); the serving metrics of both over one window load from the monitoring app's panel. Bad numbers answer
    400 with the chooser and the reason."""
    model = model_or_404(request, name)
    live = list(model.versions.exclude(status=VersionStatus.DELETED).order_by("-version")
                .values_list("version", flat=True))
    older, newer, error = compare_choice(model, request.GET, live)
    context = {"model": model, "error": error, "versions": live, "range": page_range(request.GET.get("range")),
               "ranges": PAGE_RANGES}
    if older is not None:
        panels = [answer for _receiver, answer in comparison_panels.send(sender=ModelVersion, a=older, b=newer)
                  if answer]
        context.update(a=older, b=newer, diff=compare_versions(older, newer), panels=panels)
    return render(request, "registry/version_compare.html", context, status=400 if error and request.GET else 200)


@login_required
def card_edit(request, name: str, version: int):
    """Edit a version's model card (maintainers): GET shows the form, a valid POST saves it (audited) and
    goes back to the version page; refusals stay on the form with the reason, nothing saved."""
    model_version = version_or_404(request, name, version)
    forbidden_unless(request, Action.CHANGE, model=model_version.model)
    card = card_of(model_version)
    form = ModelCardForm(request.POST or None, initial=ModelCardForm.initial_of(card))
    if request.method == "POST" and form.is_valid():
        try:
            update_card(model_version, actor=request.user, **form.cleaned_data)
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"The model card of v{version} is saved.")
            return redirect("registry:version-detail", name=name, version=version)
    return render(request, "registry/card_form.html", {"model": model_version.model, "version": model_version,
                                                       "form": form})


@login_required
def card_readme(request, name: str, version: int):
    """The version's model card as a README.md with YAML front matter, downloaded."""
    model_version = version_or_404(request, name, version)
    response = HttpResponse(readme(card_of(model_version)), content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="README.md"'
    return response


@login_required
def version_delete(request, name: str, version: int):
    """Delete a version: GET asks for confirmation (naming the aliases that go with it), POST deletes.

    Refusals (not allowed, in use by an ensemble or a host) go back to the version page as messages.
    """
    model_version = version_or_404(request, name, version)
    forbidden_unless(request, Action.DELETE_VERSION, model=model_version.model, version=model_version)
    if request.method == "POST":
        try:
            delete_version(model_name=name, version=version, actor=request.user)
        except DomainError as exc:
            messages.error(request, exc.message)
            return redirect("registry:version-detail", name=name, version=version)
        messages.success(request, f"v{version} deleted; its number will not be reused.")
        return redirect("registry:model-detail", name=name)
    return render(request, "registry/version_confirm_delete.html", {
        "model": model_version.model, "version": model_version, "aliases": model_version.aliases.order_by("name"),
    })


@login_required
def version_download(request, name: str, version: int):
    """Redirect to a presigned S3 URL for the version's artifact."""
    model_version = version_or_404(request, name, version)
    return redirect(artifact_download_url(model_version))


@login_required
def alias_set(request, name: str):
    """Set or move an alias from the model page (POST); errors (refusals included) go back to the page as messages."""
    model = model_or_404(request, name)
    if request.method != "POST":
        return redirect("registry:model-detail", name=model.name)
    versions = model.versions.exclude(status=VersionStatus.DELETED).values_list("version", flat=True)
    form = AliasForm(request.POST, versions=list(versions))
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    else:
        try:
            model_for(Principal.of(request), model.name, Action.MOVE_ALIAS, alias=form.cleaned_data["alias"])
            alias = set_alias(model_name=model.name, alias=form.cleaned_data["alias"],
                              version=form.cleaned_data["version"], actor=request.user,
                              reason=form.cleaned_data["reason"])
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"@{alias.name} now points at v{alias.version.version}.")
    return redirect("registry:model-detail", name=model.name)


@login_required
def alias_delete(request, name: str, alias: str):
    """Delete an alias: GET asks for confirmation, POST deletes."""
    model = model_or_404(request, name, Action.MOVE_ALIAS, alias=alias)
    row = model.aliases.select_related("version").filter(name=alias).first()
    if row is None:
        raise Http404(f"model {name!r} has no alias {alias!r}")
    if request.method == "POST":
        try:
            delete_alias(model_name=model.name, alias=alias, actor=request.user)
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"@{alias} deleted; v{row.version.version} is unchanged.")
        return redirect("registry:model-detail", name=model.name)
    return render(request, "registry/alias_confirm_delete.html", {"model": model, "alias": row})


@login_required
def alias_protect(request, name: str, alias: str):
    """Lock (``protected=1``) or unlock (``protected=0``) an alias from the model page (POST, owners);
    refusals go back to the page as messages."""
    model = model_or_404(request, name, Action.PROTECT_ALIAS, alias=alias)
    if request.method == "POST":
        locking = request.POST.get("protected") == "1"
        try:
            protect_alias(model_name=model.name, alias=alias, protected=locking, actor=Principal.of(request),
                          reason=request.POST.get("reason", ""))
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"@{alias} locked: moving it needs a team owner and a reason." if locking
                             else f"@{alias} unlocked.")
    return redirect("registry:model-detail", name=model.name)


@login_required
def model_edit(request, name: str):
    """Edit a model's description from its page, or whether calling it needs an inference key
    (``inference_key_required`` = ``1`` or ``0``, the team's owners) from its inference keys page (POST)."""
    model = model_or_404(request, name, Action.CHANGE)
    if request.method == "POST" and "inference_key_required" in request.POST:
        forbidden_unless(request, Action.MANAGE_INFERENCE_KEYS, model=model)
        required = request.POST["inference_key_required"] == "1"
        require_inference_key(name=model.name, required=required, actor=request.user)
        messages.success(request, "Calls to this model now need an inference key." if required else
                         "Calls to this model no longer need an inference key.")
        return redirect("registry:inference-keys", name=model.name)
    if request.method == "POST":
        description = request.POST.get("description", "")
        if len(description) > DESCRIPTION_MAX_LENGTH:
            messages.error(request, f"The description is {len(description)} characters long; the limit is "
                                    f"{DESCRIPTION_MAX_LENGTH}. Nothing was saved.")
        else:
            update_model(name=model.name, description=description, actor=request.user)
            messages.success(request, "Description saved.")
    return redirect("registry:model-detail", name=model.name)


KEY_PAGE_SIZE = 50


@login_required
@never_cache
def inference_keys(request, name: str):
    """The inference keys of the model's team that open the model, newest first (50 a page), whether calling the
    model needs one, and (for the team's owners) a form that makes a key: a valid POST shows its secret this once."""
    model = model_or_404(request, name)
    can_manage = check(Principal.of(request), Action.MANAGE_INFERENCE_KEYS, model=model) is None
    team_models = list(RegisteredModel.objects.filter(team_id=model.team_id).order_by("name")
                       .values_list("name", flat=True))
    form = InferenceKeyForm(request.POST or None, model_names=team_models, initial={"models": [model.name]})
    if request.method == "POST":
        forbidden_unless(request, Action.MANAGE_INFERENCE_KEYS, model=model)
        if form.is_valid():
            days = form.cleaned_data["expires_in_days"]
            try:
                key, plaintext = create_inference_key(
                    name=form.cleaned_data["name"],
                    models=list(RegisteredModel.objects.filter(team_id=model.team_id,
                                                               name__in=form.cleaned_data["models"])),
                    expires_at=timezone.now() + timedelta(days=days) if days else None, actor=request.user)
            except DomainError as exc:
                form.add_error(None, exc.message)
            else:
                return render(request, "registry/inference_key_created.html",
                              {"model": model, "key": key, "plaintext": plaintext})
    keys = (InferenceKey.objects.filter(team_id=model.team_id, scoped_models=model)
            .prefetch_related("scoped_models").order_by("-id"))
    page = Paginator(keys, KEY_PAGE_SIZE).get_page(request.GET.get("page"))
    now = timezone.now()
    for key in page.object_list:
        key.state = token_state(key, now)  # active, expired or revoked, as for an API token
    return render(request, "registry/inference_keys.html", {
        "model": model, "keys": page.object_list, "page": page, "form": form, "can_manage": can_manage})


@login_required
def inference_key_revoke(request, name: str, key_id: int):
    """Revoke one of the model's inference keys: GET asks for confirmation, POST revokes (the row stays for
    the audit trail); the team's owners only."""
    model = model_or_404(request, name, Action.MANAGE_INFERENCE_KEYS)
    key = InferenceKey.objects.filter(pk=key_id, team_id=model.team_id, scoped_models=model).first()
    if key is None:
        raise Http404(f"model {name!r} has no inference key {key_id}")
    if request.method == "POST":
        revoke_inference_key(key, request.user)
        messages.success(request, f"Inference key {key.name} (myk_{key.prefix}…) revoked.")
        return redirect("registry:inference-keys", name=model.name)
    return render(request, "registry/inference_key_confirm_revoke.html", {"model": model, "key": key})


@login_required
def version_upload(request, name: str):
    """The upload page: a form whose file static/registry/upload.js hashes (whole and per part) and
    sends straight to S3 in parts (presigned URLs from the uploads API) with a progress bar, then
    completes the upload and opens the new version's page. The file's name is checked against the
    accepted suffixes (``data-accepted-suffixes``) as soon as it is chosen, and again by the uploads
    API before any part URL is signed. The page may connect to the S3 endpoint
    (CSP ``connect-src``) and compile WebAssembly (``'wasm-unsafe-eval'``, which allows
    ``WebAssembly`` and nothing like ``eval``) for the vendored hash-wasm digests."""
    model = model_or_404(request, name, Action.CHANGE)
    response = render(request, "registry/version_upload.html", {
        "model": model, "form": VersionUploadForm(), "suffixes": " ".join(ACCEPTED_SUFFIXES),
        "accepted": ACCEPTED_KINDS})
    endpoint = urlsplit(settings.S3_ENDPOINT_URL or "https://s3.amazonaws.com")
    response._csp_update = {"connect-src": [f"{endpoint.scheme}://{endpoint.netloc}"],
                            "script-src": ["'wasm-unsafe-eval'"]}
    return response
