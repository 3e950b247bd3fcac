"""What serves where, at a glance: the models list's serving and alias columns, and the serving panel
at the top of a model's page (each host, its version, that version's aliases, the canary batch of a
rollout in progress), with their SQL query counts pinned."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deployments import rollouts
from deployments.choices import DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.services import start_deployment
from deployments.targets import record_target_progress
from registry.choices import ArtifactFormat
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import page_with_panels, team_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(client):
    client.force_login(team_member(get_user_model().objects.create_user(username="ml-engineer"), "maintainer"))
    return client


def add_version(model: RegisteredModel, number: int) -> ModelVersion:
    return ModelVersion.objects.create(model=model, version=number, format=ArtifactFormat.TRITON_MODEL_DIR,
                                       artifact_key=f"k{model.pk}-{number}", artifact_sha256=f"{number:064d}",
                                       artifact_size=1)


def serve(version: ModelVersion, host: ServingHost) -> DeploymentTarget:
    deployment = Deployment.objects.create(model=version.model, version=version, status=DeploymentStatus.SUCCEEDED)
    return DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY)


def online_host(name: str, **fields) -> ServingHost:
    return ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000", last_heartbeat_at=timezone.now(),
                                      heartbeat={"runtime_live": True}, **fields)


def cells(page: str, row_start: str) -> list[str]:
    """The text of each cell of the first table row that starts with ``row_start``."""
    row = re.search(rf"<tr[^>]*>\s*<td>{re.escape(row_start)}(.*?)</tr>", page, re.S)
    assert row, f"no row starting {row_start!r}"
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split())
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", "<td>" + row_start + row.group(1), re.S)]


def test_the_models_list_shows_where_each_model_serves_and_its_aliases(browser):
    iris = RegisteredModel.objects.create(name="iris", next_version=3)
    v1, v2 = add_version(iris, 1), add_version(iris, 2)
    hosts = [online_host(f"gpu-{n}") for n in range(3)]
    serve(v1, hosts[0])
    serve(v2, hosts[1])
    serve(v2, hosts[2])
    Alias.objects.create(model=iris, name="production", version=v2)
    Alias.objects.create(model=iris, name="canary", version=v1)
    RegisteredModel.objects.create(name="idle")
    page = browser.get("/models/").content.decode()
    assert "<th>Serving</th><th>Aliases</th>" in page
    iris_row = cells(page, '<a href="/models/iris/">')
    assert iris_row[2:4] == ["v2 on 2 hosts v1 on gpu-0", "@canary v1 @production v2"]
    assert 'title="gpu-1, gpu-2"' in page
    assert cells(page, '<a href="/models/idle/">')[2:4] == ["—", "—"]


def queries_for(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def a_fleet_of(models: int) -> None:
    """``models`` models, each with two versions, both serving on a host of its own and aliased."""
    for n in range(models):
        model = RegisteredModel.objects.create(name=f"m{n:02d}", next_version=3)
        first, second = add_version(model, 1), add_version(model, 2)
        serve(first, online_host(f"a{n:02d}"))
        serve(second, online_host(f"b{n:02d}"))
        Alias.objects.create(model=model, name="production", version=second)
        Alias.objects.create(model=model, name="staging", version=first)


# The session and its user, the page of the models the user may see (teams in a subquery) with their
# version summary, their aliases with the versions, and what serves them (serving_now: two).
MODEL_LIST_QUERIES = 6


def test_the_models_list_costs_the_same_pinned_queries_for_one_model_or_fifty(browser):
    a_fleet_of(1)
    browser.get("/models/")  # the session's first use
    one = queries_for(browser, "/models/")
    a_fleet_of_more = [RegisteredModel.objects.create(name=f"z{n:02d}") for n in range(49)]
    for model in a_fleet_of_more:
        version = add_version(model, 1)
        serve(version, online_host(f"h{model.name}"))
        Alias.objects.create(model=model, name="production", version=version)
    fifty = queries_for(browser, "/models/")
    assert one == fifty == MODEL_LIST_QUERIES, (one, fifty)


@pytest.fixture
def iris_rolling_out(django_capture_on_commit_callbacks) -> Deployment:
    """iris v1 serving on gpu-0 (production) and gpu-1, @stable on v1 and @candidate on v2, and a
    rollout of v2 to both in two batches of one host: gpu-0 is its canary batch, dispatched."""
    iris = RegisteredModel.objects.create(name="iris", next_version=3)
    v1, v2 = add_version(iris, 1), add_version(iris, 2)
    for host in (online_host("gpu-0", production=True), online_host("gpu-1")):
        serve(v1, host)
    Alias.objects.create(model=iris, name="stable", version=v1)
    Alias.objects.create(model=iris, name="candidate", version=v2)
    with django_capture_on_commit_callbacks(execute=False):
        deployment = start_deployment(model_name="iris", version=2, host_names=["gpu-0", "gpu-1"], batch_size=1)
        rollouts.advance_rollout(deployment.pk)
    return deployment


def serving_row(panel: str, host: str) -> str:
    row = re.search(rf'<tr class="serving-row" data-host="{re.escape(host)}">(.*?)</tr>', panel, re.S)
    assert row, f"no row for {host}"
    return " ".join(re.sub(r"<[^>]+>", " ", row.group(1)).split())


def test_the_top_of_the_model_page_says_what_each_host_serves_and_where_the_canary_stands(browser, iris_rolling_out):
    rollout = iris_rolling_out.pk
    page = page_with_panels(browser, "/models/iris/")
    assert page.index("<h2>Serving now") < page.index("<h2>Serving metrics")
    assert serving_row(page, "gpu-0") == (f"gpu-0 production triton Online v1 @stable → v2: Pending batch 1 (canary) "
                                          f"of rollout {rollout}")
    assert serving_row(page, "gpu-1") == f"gpu-1 triton Online v1 @stable → v2: Pending batch 2 of rollout {rollout}"
    summary = " ".join(re.sub(r"<[^>]+>", " ", re.search(r'<p class="rollout-summary">(.*?)</p>', page, re.S)
                              .group(1)).split())
    assert summary.startswith(f"Rollout {rollout} of v2 Running : 0 of 2 hosts moved, in 2 batches; canary batch "
                              "gpu-0 in progress.")

    record_target_progress(iris_rolling_out.targets.get(host__name="gpu-0").pk, "ready")
    panel = browser.get("/deployments/serving/iris/").content.decode()
    assert "<html" not in panel  # the fragment alone, which the page polls
    assert serving_row(panel, "gpu-0") == "gpu-0 production triton Online v2 @candidate —"
    assert "1 of 2 hosts moved, in 2 batches; canary batch gpu-0 serves it." in " ".join(panel.split())


def test_a_model_served_nowhere_says_so(browser):
    RegisteredModel.objects.create(name="idle")
    assert "Not served anywhere yet." in browser.get("/deployments/serving/idle/").content.decode()
    assert browser.get("/deployments/serving/nope/").status_code == 404


def test_the_serving_panel_hides_models_of_other_teams(client, iris_rolling_out):
    from accounts.models import Team

    outsider = get_user_model().objects.create_user(username="outsider")
    team_member(outsider, "owner", team=Team.objects.create(name="other"))
    client.force_login(outsider)
    assert client.get("/deployments/serving/iris/").status_code == 404


# The session and its user, the model with the user's role in its team (one query), the model's aliases, what
# serves it (serving_now: two), its active rollouts with their targets and the targets' hosts (three), and its
# active traffic canaries (one; their targets, hosts and stable versions three more when there is one).
SERVING_PANEL_QUERIES = 10
# The session and its user, the model with the user's role in its team (one query), its aliases, and its
# versions with their creators and aliases (two). What serves where, and the other panels, load by htmx.
MODEL_PAGE_QUERIES = 6


def test_the_serving_panel_and_the_model_page_cost_pinned_queries_however_many_hosts_and_versions(
    browser, iris_rolling_out, django_capture_on_commit_callbacks
):
    browser.get("/models/iris/")  # the session's first use
    few = queries_for(browser, "/deployments/serving/iris/"), queries_for(browser, "/models/iris/")
    iris = iris_rolling_out.model
    for n in range(2, 12):
        serve(iris.versions.get(version=n % 2 + 1), online_host(f"gpu-{n}"))
    for number in range(3, 13):
        add_version(iris, number)
    with django_capture_on_commit_callbacks(execute=False):
        start_deployment(model_name="iris", version=1, host_names=[f"gpu-{n}" for n in range(2, 12)], batch_size=3)
    many = queries_for(browser, "/deployments/serving/iris/"), queries_for(browser, "/models/iris/")
    assert few == many == (SERVING_PANEL_QUERIES, MODEL_PAGE_QUERIES), (few, many)
