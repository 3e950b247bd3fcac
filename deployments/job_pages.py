"""The profile and replay pages of a model version: its performance card panel and the form that starts a
profile, a profile's cancellation, and its replays with each replay's page.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from accounts.access import Action, Principal, check, require
from deployments import profiles, replays
from deployments.choices import ACTIVE_JOB_STATES, RUNTIME_FORMATS
from deployments.forms import ProfileForm
from deployments.models import Profile, Replay, ServingHost
from modelyard.errors import DomainError
from registry.pages import model_or_404

PROFILES_LISTED = 10


def _profile_hosts(version) -> list[tuple[str, str]]:
    """(name, label) of the hosts whose runtime serves the version's format, production ones marked."""
    hosts = ServingHost.objects.filter(runtime__in=[r for r, formats in RUNTIME_FORMATS.items()
                                                    if version.format in formats]).order_by("name")
    return [(h.name, f"{h.name}{' (production)' if h.production else ''}{'' if h.is_online() else ' — offline'}")
            for h in hosts]


@login_required
def version_profiles(request, model_name: str, version: int):
    """The performance card panel of a version's page (loaded by htmx; it polls itself while a
    profile runs): the newest profile (or ``?profile=<id>``) with its chart of throughput against
    p99 per config, the Pareto front, the table and the recommendation; the form to start one."""
    model = model_or_404(request, model_name)
    version_row = get_object_or_404(model.versions.exclude(status="deleted"), version=version)
    listed = list(Profile.objects.filter(version=version_row).select_related("host", "created_by")
                  .order_by("-id")[:PROFILES_LISTED])
    chosen = request.GET.get("profile", "")
    numeric = chosen.isascii() and chosen.isdigit()  # '²'.isdigit() is True, int('²') fails
    profile = next((p for p in listed if str(p.pk) == chosen), None) if numeric else None
    if profile is None and numeric:
        profile = get_object_or_404(Profile.objects.select_related("host"), pk=int(chosen), version=version_row)
    profile = profile or (listed[0] if listed else None)
    may_profile = check(Principal.of(request), Action.DEPLOY, model=model) is None
    context = {"model": model, "version": version_row, "profiles": listed, "profile": profile,
               "may_profile": may_profile,
               "form": ProfileForm(hosts=_profile_hosts(version_row)) if may_profile else None}
    if profile is not None:
        context.update(profiles.card_context(profile))
        context["active"] = profile.status in ACTIVE_JOB_STATES
    return render(request, "deployments/partials/version_profiles.html", context)


@login_required
def version_profile_start(request, model_name: str, version: int):
    """Start a profile from the version page's form (POST; rights of a rollout to the host)."""
    if request.method != "POST":
        return redirect("registry:version-detail", model_name, version)
    model = model_or_404(request, model_name, Action.DEPLOY, doing="profiling a version")
    version_row = get_object_or_404(model.versions.exclude(status="deleted"), version=version)
    form = ProfileForm(request.POST, hosts=_profile_hosts(version_row))
    principal = Principal.of(request)
    if form.is_valid():
        data = form.cleaned_data
        try:
            profile = profiles.start_profile(
                model_name=model.name, version=version, host_name=data["host"], sweep=data["preset"],
                slo_p99_ms=data["slo_p99_ms"], actor=request.user,
                authorize=lambda v, hosts: require(principal, Action.DEPLOY, model=model, hosts=hosts))
        except DomainError as exc:
            messages.error(request, f"The profile was not started: {exc.message}")
        else:
            messages.success(request, f"Profile {profile.pk} queued on {data['host']}.")
    else:
        messages.error(request, "The profile was not started: " + "; ".join(
            f"{name}: {' '.join(errors)}" for name, errors in form.errors.items()))
    return redirect("registry:version-detail", model_name, version)


@login_required
def profile_cancel(request, pk: int):
    """Cancel a profile: GET asks for confirmation, POST cancels (rights of a rollout to its host)."""
    profile = get_object_or_404(Profile.objects.select_related("version__model", "host"), pk=pk)
    model = model_or_404(request, profile.version.model.name, Action.DEPLOY, hosts=[profile.host],
                         doing="cancelling a profile")
    if request.method == "POST":
        try:
            profiles.cancel_profile(profile.pk, actor=request.user)
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Profile {profile.pk} is being stopped; what it measured is kept.")
        return redirect("registry:version-detail", model.name, profile.version.version)
    return render(request, "deployments/profile_confirm_cancel.html", {"profile": profile, "model": model})


REPLAYS_LISTED = 20


@login_required
def version_replays(request, model_name: str, version: int):
    """The replays panel of a version's page (loaded by htmx; it polls itself while one is queued or
    running): the version's newest replays as a candidate, with status, progress and agreement, each
    linked to its page."""
    model = model_or_404(request, model_name)
    version_row = get_object_or_404(model.versions.exclude(status="deleted"), version=version)
    listed = list(Replay.objects.filter(version=version_row).select_related("against", "host")
                  .order_by("-id")[:REPLAYS_LISTED])
    return render(request, "deployments/partials/version_replays.html", {
        "model": model, "version": version_row, "replays": listed,
        "active": any(r.status in ACTIVE_JOB_STATES for r in listed)})


def _replay_context(request, pk: int) -> dict:
    """The replay page's context; Http404 when there is no such replay or the user cannot read its model.
    The worst disagreements (users' data) are in it for owners of the model's team only."""
    replay = get_object_or_404(Replay.objects.select_related("version__model__team", "against", "host",
                                                              "created_by"), pk=pk)
    model = model_or_404(request, replay.version.model.name)
    principal = Principal.of(request)
    view = replays.replay_view(replay, may_read=replays.may_read_captured(principal, model))
    return {"replay": replay, "model": model, "view": view, "active": replay.status in ACTIVE_JOB_STATES}


@login_required
def replay_detail(request, pk: int):
    """A replay: status and progress (refreshed by htmx while it runs), agreement, the differences'
    quantiles and histogram, both versions' latency, and the worst disagreements for owners of the
    model's team (members see the aggregates; others get 404)."""
    return render(request, "deployments/replay_detail.html", _replay_context(request, pk))


@login_required
def replay_progress(request, pk: int):
    """The htmx fragment of the replay page (the same partial the page includes), polled while it runs."""
    return render(request, "deployments/partials/replay_progress.html", _replay_context(request, pk))
