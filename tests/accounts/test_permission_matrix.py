"""Every API operation and every page, tried by a viewer, a maintainer, an owner, an outsider and an administrator.

The world: team ``vision`` owns model ``resnet`` (v1 and v2, ``@staging`` and ``@production`` on v1),
served by host ``gpu-dev`` and production host ``gpu-prod``, with a rollout to each, a promotion policy,
an evaluation awaiting approval, a webhook and an upload opened by the maintainer. The outsider owns
another team. Expected answers:

- ``ok``: allowed (anything but 401, 403 and 404: a 409 or a 503 from a missing Triton still means
  the access check let it through);
- ``403``: the user may see the object but not do this;
- ``404``: the user may not see the model at all (answered exactly like a missing one).

The completeness tests fail when an operation of the API schema or a page URL has no row here, so an
endpoint added later cannot skip its permission check unnoticed.
"""

import copy

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.choices import Role
from accounts.models import Team
from accounts.services import set_membership
from accounts.tokens import issue_token
from deployments.choices import TargetState
from deployments.models import DeploymentTarget, Profile, Replay, ServingHost
from deployments.services import start_deployment
from modelyard_agent.profiling.sweep import parse_sweep
from promotions.choices import Decision
from promotions.models import PromotionEvaluation, Webhook
from promotions.policies import create_policy
from registry.choices import ArtifactFormat
from registry.inference_keys import create_inference_key
from registry.models import Alias, ModelVersion, RegisteredModel, Upload

pytestmark = pytest.mark.django_db

USERS = ("viewer", "maintainer", "owner", "outsider", "admin")
RANK = {"viewer": 1, "maintainer": 2, "owner": 3, "admin": 4}


def needs(role: str, *, scoped: bool = True) -> dict[str, object]:
    """Expected answers when ``role`` (or more) is needed: users below get 403, and the outsider 404
    when the object belongs to the team (``scoped``), else 403."""
    expected = {user: "ok" if RANK[user] >= RANK[role] else 403 for user in RANK}
    expected["outsider"] = 404 if scoped else 403
    return expected


EVERYONE = dict.fromkeys(USERS, "ok")
ADMINS = {**dict.fromkeys(USERS, 403), "admin": "ok"}
# An upload, like an API token, is its creator's (the maintainer's) or an administrator's; others do not
# learn it exists.
UPLOADER = {**dict.fromkeys(USERS, 404), "maintainer": "ok", "admin": "ok"}
# What only administrators may see at all (a webhook of every team).
ADMINS_ONLY_SEE = {**dict.fromkeys(USERS, 404), "admin": "ok"}

# (method, path template as in the schema, path values, JSON body, expected per user)
API = [
    ("GET", "/api/v1/models/", {}, None, EVERYONE),
    ("POST", "/api/v1/models/", {}, {"name": "efficientnet", "team": "vision"}, needs("maintainer", scoped=False)),
    ("GET", "/api/v1/models/{name}/", {}, None, needs("viewer")),
    ("PATCH", "/api/v1/models/{name}/", {}, {"description": "better"}, needs("maintainer")),
    ("PATCH", "/api/v1/models/{name}/", {}, {"inference_key_required": True}, needs("owner")),
    ("GET", "/api/v1/models/{model_name}/versions/", {}, None, needs("viewer")),
    ("POST", "/api/v1/models/{model_name}/versions/", {}, {}, needs("maintainer")),
    ("GET", "/api/v1/models/{model_name}/versions/{version}/", {"version": 2}, None, needs("viewer")),
    ("DELETE", "/api/v1/models/{model_name}/versions/{version}/", {"version": 2}, None, needs("owner")),
    ("GET", "/api/v1/models/{model_name}/versions/{version}/card/", {"version": 2}, None, needs("viewer")),
    ("PATCH", "/api/v1/models/{model_name}/versions/{version}/card/", {"version": 2}, {"license": "MIT"},
     needs("maintainer")),
    ("GET", "/api/v1/models/{model_name}/versions/{version}/card/readme/", {"version": 2}, None, needs("viewer")),
    ("GET", "/api/v1/models/{model_name}/capture/", {}, None, needs("viewer")),
    ("PATCH", "/api/v1/models/{model_name}/capture/", {}, {"fraction": 0.1}, needs("owner")),
    ("GET", "/api/v1/models/{model_name}/versions/{version}/profiles/", {"version": 2}, None, needs("viewer")),
    ("POST", "/api/v1/models/{model_name}/versions/{version}/profiles/", {"version": 2}, {"host": "gpu-dev"},
     needs("maintainer")),
    ("POST", "/api/v1/models/{model_name}/versions/{version}/profiles/", {"version": 2}, {"host": "gpu-prod"},
     needs("owner")),
    ("GET", "/api/v1/profiles/", {}, None, EVERYONE),
    ("GET", "/api/v1/profiles/{id}/", {"id": "profile_dev"}, None, needs("viewer")),
    ("POST", "/api/v1/profiles/{id}/cancel/", {"id": "profile_dev"}, None, needs("maintainer")),
    ("POST", "/api/v1/profiles/{id}/cancel/", {"id": "profile_prod"}, None, needs("owner")),
    ("GET", "/api/v1/models/{model_name}/versions/{version}/replays/", {"version": 2}, None, needs("viewer")),
    ("POST", "/api/v1/models/{model_name}/versions/{version}/replays/", {"version": 2},
     {"against": "1", "host": "gpu-dev"}, needs("maintainer")),
    ("POST", "/api/v1/models/{model_name}/versions/{version}/replays/", {"version": 2},
     {"against": "production", "host": "gpu-prod"}, needs("owner")),
    ("GET", "/api/v1/replays/", {}, None, EVERYONE),
    ("GET", "/api/v1/replays/{id}/", {"id": "replay_dev"}, None, needs("viewer")),
    ("POST", "/api/v1/replays/{id}/cancel/", {"id": "replay_dev"}, None, needs("maintainer")),
    ("POST", "/api/v1/replays/{id}/cancel/", {"id": "replay_prod"}, None, needs("owner")),
    ("GET", "/api/v1/models/{model_name}/aliases/", {}, None, needs("viewer")),
    ("GET", "/api/v1/models/{model_name}/aliases/{alias}/", {"alias": "production"}, None, needs("viewer")),
    ("PUT", "/api/v1/models/{model_name}/aliases/{alias}/", {"alias": "staging"}, {"version": 2},
     needs("maintainer")),
    ("PUT", "/api/v1/models/{model_name}/aliases/{alias}/", {"alias": "production"}, {"version": 2},
     needs("owner")),
    ("PATCH", "/api/v1/models/{model_name}/aliases/{alias}/", {"alias": "staging"}, {"protected": True},
     needs("owner")),
    ("DELETE", "/api/v1/models/{model_name}/aliases/{alias}/", {"alias": "staging"}, None, needs("maintainer")),
    ("DELETE", "/api/v1/models/{model_name}/aliases/{alias}/", {"alias": "production"}, None, needs("owner")),
    ("POST", "/api/v1/models/{model_name}/infer/", {}, {"host": "gpu-dev", "inputs": {"x": [[1.0]]}},
     needs("maintainer")),
    ("GET", "/api/v1/models/{model_name}/metrics/", {}, None, needs("viewer")),
    ("GET", "/api/v1/models/{model_name}/compare/", {}, None, needs("viewer")),  # no a, b: 400 once allowed
    ("GET", "/api/v1/models/{model_name}/metrics/series/", {}, None, needs("viewer")),
    ("POST", "/api/v1/models/{model_name}/uploads/", {}, {"filename": "big.tar.gz", "size": 10},
     needs("maintainer")),
    ("GET", "/api/v1/uploads/{upload_id}/", {}, None, UPLOADER),
    ("DELETE", "/api/v1/uploads/{upload_id}/", {}, None, UPLOADER),
    ("POST", "/api/v1/uploads/{upload_id}/parts/", {}, {"part_numbers": [1]}, UPLOADER),
    ("POST", "/api/v1/uploads/{upload_id}/complete/", {}, {}, UPLOADER),
    ("GET", "/api/v1/hosts/", {}, None, EVERYONE),
    ("POST", "/api/v1/hosts/", {}, {"name": "gpu-new", "inference_url": "http://gpu-new:8000"}, ADMINS),
    ("GET", "/api/v1/hosts/{name}/", {"name": "gpu-prod"}, None, EVERYONE),
    ("GET", "/api/v1/hosts/{name}/residency/", {"name": "gpu-prod"}, None, EVERYONE),
    ("PATCH", "/api/v1/hosts/{name}/", {"name": "gpu-spare"}, {"production": True}, ADMINS),
    ("DELETE", "/api/v1/hosts/{name}/", {"name": "gpu-spare"}, None, ADMINS),
    ("POST", "/api/v1/hosts/{name}/models/{model_name}/unload/", {"name": "gpu-dev"}, None, needs("maintainer")),
    ("POST", "/api/v1/hosts/{name}/models/{model_name}/unload/", {"name": "gpu-prod"}, None, needs("owner")),
    ("POST", "/api/v1/hosts/{name}/models/{model_name}/reload/", {"name": "gpu-dev"}, None, needs("maintainer")),
    ("POST", "/api/v1/hosts/{name}/models/{model_name}/reload/", {"name": "gpu-prod"}, None, needs("owner")),
    ("GET", "/api/v1/deployments/", {}, None, EVERYONE),
    ("POST", "/api/v1/deployments/", {}, {"model": "resnet", "version": 2, "hosts": ["gpu-dev"]},
     needs("maintainer")),
    ("POST", "/api/v1/deployments/", {}, {"model": "resnet", "version": 2, "hosts": ["gpu-prod"]}, needs("owner")),
    ("GET", "/api/v1/deployments/{id}/", {"id": "dev"}, None, needs("viewer")),
    *[("POST", f"/api/v1/deployments/{{id}}/{action}/", {"id": "dev"}, None, needs("maintainer"))
      for action in ("pause", "resume", "cancel", "rollback", "promote")],
    *[("POST", f"/api/v1/deployments/{{id}}/{action}/", {"id": "prod"}, None, needs("owner"))
      for action in ("pause", "resume", "cancel", "rollback", "promote")],
    ("PATCH", "/api/v1/deployments/{id}/", {"id": "dev"}, {"canary_percent": 20}, needs("maintainer")),
    ("PATCH", "/api/v1/deployments/{id}/", {"id": "prod"}, {"canary_percent": 20}, needs("owner")),
    ("GET", "/api/v1/audit/", {}, None, EVERYONE),
    ("GET", "/api/v1/prometheus/targets/", {}, None, EVERYONE),
    ("GET", "/api/v1/promotion-policies/", {}, None, EVERYONE),
    ("POST", "/api/v1/promotion-policies/", {},
     {"model": "resnet", "candidate_alias": "canary", "target_alias": "production"}, needs("owner")),
    ("GET", "/api/v1/promotion-policies/{id}/", {"id": "policy"}, None, needs("viewer")),
    ("PATCH", "/api/v1/promotion-policies/{id}/", {"id": "policy"}, {"dry_run": True}, needs("owner")),
    ("DELETE", "/api/v1/promotion-policies/{id}/", {"id": "policy"}, None, needs("owner")),
    ("POST", "/api/v1/promotion-policies/{id}/pause/", {"id": "policy"}, None, needs("owner")),
    ("POST", "/api/v1/promotion-policies/{id}/resume/", {"id": "policy"}, None, needs("owner")),
    ("POST", "/api/v1/promotion-policies/{id}/run/", {"id": "policy"}, None, needs("maintainer")),
    ("GET", "/api/v1/promotion-evaluations/", {}, None, EVERYONE),
    ("GET", "/api/v1/promotion-evaluations/{id}/", {"id": "evaluation"}, None, needs("viewer")),
    ("POST", "/api/v1/promotion-evaluations/{id}/approve/", {"id": "evaluation"}, None, needs("owner")),
    ("POST", "/api/v1/promotion-evaluations/{id}/reject/", {"id": "evaluation"}, {"reason": "no"}, needs("owner")),
    # Webhooks of every team are the administrators'; one of team vision is also its owners'. The list
    # shows everyone the webhooks they manage.
    ("GET", "/api/v1/webhooks/", {}, None, EVERYONE),
    ("POST", "/api/v1/webhooks/", {}, {"url": "https://example.com/hook"}, ADMINS),
    ("POST", "/api/v1/webhooks/", {}, {"url": "https://example.com/hook", "team": "vision"},
     needs("owner", scoped=False)),
    ("GET", "/api/v1/webhooks/{id}/", {"id": "webhook"}, None, ADMINS_ONLY_SEE),
    ("GET", "/api/v1/webhooks/{id}/", {"id": "team_webhook"}, None, needs("owner")),
    ("PATCH", "/api/v1/webhooks/{id}/", {"id": "webhook"}, {"enabled": False}, ADMINS_ONLY_SEE),
    ("PATCH", "/api/v1/webhooks/{id}/", {"id": "team_webhook"}, {"enabled": False}, needs("owner")),
    ("DELETE", "/api/v1/webhooks/{id}/", {"id": "webhook"}, None, ADMINS_ONLY_SEE),
    ("DELETE", "/api/v1/webhooks/{id}/", {"id": "team_webhook"}, None, needs("owner")),
    ("GET", "/api/v1/webhooks/{id}/deliveries/", {"id": "webhook"}, None, ADMINS_ONLY_SEE),
    ("GET", "/api/v1/webhooks/{id}/deliveries/", {"id": "team_webhook"}, None, needs("owner")),
    # Inference keys are the team's: its members read them, its owners make and revoke them.
    ("GET", "/api/v1/inference-keys/", {}, None, EVERYONE),
    ("POST", "/api/v1/inference-keys/", {}, {"name": "shop", "models": ["resnet"]}, needs("owner")),
    ("GET", "/api/v1/inference-keys/{id}/", {"id": "inference_key"}, None, needs("viewer")),
    ("POST", "/api/v1/inference-keys/{id}/revoke/", {"id": "inference_key"}, None, needs("owner")),
    ("GET", "/api/v1/teams/", {}, None, EVERYONE),
    ("POST", "/api/v1/teams/", {}, {"name": "audio"}, ADMINS),
    ("GET", "/api/v1/teams/{name}/", {"name": "vision"}, None, needs("viewer")),
    ("DELETE", "/api/v1/teams/{name}/", {"name": "empty"}, None, ADMINS),
    ("PUT", "/api/v1/teams/{name}/members/{username}/", {"name": "vision", "username": "outsider"},
     {"role": "viewer"}, ADMINS),
    ("DELETE", "/api/v1/teams/{name}/members/{username}/", {"name": "vision", "username": "viewer"}, None, ADMINS),
    ("GET", "/api/v1/tokens/", {}, None, EVERYONE),
    ("GET", "/api/v1/whoami/", {}, None, EVERYONE),
    ("POST", "/api/v1/tokens/", {}, {"name": "ci", "scopes": ["read"]}, EVERYONE),
    ("GET", "/api/v1/tokens/{id}/", {"id": "token"}, None, UPLOADER),
    ("DELETE", "/api/v1/tokens/{id}/", {"id": "token"}, None, UPLOADER),
    ("POST", "/api/v1/tokens/{id}/revoke/", {"id": "token"}, None, UPLOADER),
]


@pytest.fixture(scope="module")
def built_world(django_db_setup, django_db_blocker) -> dict:
    """The world, built once for the module in a transaction that is rolled back at the module's end.

    Each test's ``db`` opens its own transaction inside this one (a savepoint, rolled back after the
    test), so no test sees another's writes; built per test, it cost 0.1 s of each of the 904 tests.
    """
    with django_db_blocker.unblock(), transaction.atomic():
        yield _build_world()
        transaction.set_rollback(True)


@pytest.fixture
def world(built_world, db) -> dict:
    """The module's world, a copy of its Python objects per test (as ``TestCase.setUpTestData`` gives)."""
    return copy.deepcopy(built_world)


def _build_world() -> dict:
    """The team, its members, the outsider, the model, hosts, rollouts, policy, evaluation, webhook and upload."""
    users = get_user_model().objects
    vision, nlp = Team.objects.create(name="vision"), Team.objects.create(name="nlp")
    Team.objects.create(name="empty")
    people = {"admin": users.create_superuser(username="admin", password=None)}
    for name, role in (("viewer", Role.VIEWER), ("maintainer", Role.MAINTAINER), ("owner", Role.OWNER)):
        people[name] = users.create_user(username=name)  # no password: hashing one costs ~0.3 s
        set_membership(team=vision, user=people[name], role=role)
    people["outsider"] = users.create_user(username="outsider")
    set_membership(team=nlp, user=people["outsider"], role=Role.OWNER)

    model = RegisteredModel.objects.create(name="resnet", team=vision, next_version=3)
    versions = [
        ModelVersion.objects.create(
            model=model, version=n, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"sha256/{n:064d}",
            artifact_sha256=f"{n:064d}", artifact_size=1, created_by=people["owner"],
        )
        for n in (1, 2)
    ]
    for alias in ("staging", "production"):
        Alias.objects.create(model=model, name=alias, version=versions[0])
    for name, production in (("gpu-dev", False), ("gpu-prod", True), ("gpu-spare", False)):
        # A refused port, not an unresolvable name: the name's DNS lookup costs ~5 s per call on this machine.
        ServingHost.objects.create(name=name, inference_url="http://127.0.0.1:1", production=production)
    ids = {
        "dev": start_deployment(model_name="resnet", version=1, host_names=["gpu-dev"], actor=people["owner"]).pk,
        "prod": start_deployment(model_name="resnet", version=1, host_names=["gpu-prod"], actor=people["owner"]).pk,
    }
    DeploymentTarget.objects.update(state=TargetState.READY)  # both hosts serve v1 (their Triton is unreachable)
    policy = create_policy(model_name="resnet", candidate_alias="staging", target_alias="production")
    ids["policy"] = policy.pk
    ids["evaluation"] = PromotionEvaluation.objects.create(
        policy=policy, decision=Decision.AWAITING_APPROVAL, candidate_version=versions[0]).pk
    ids["webhook"] = Webhook.objects.create(url="https://example.com/hook", secret="s" * 32, model=model).pk
    ids["team_webhook"] = Webhook.objects.create(url="https://example.com/team", secret="s" * 32, team=vision).pk
    upload = Upload.objects.create(
        model=model, filename="big.tar.gz", size=10, part_size=5 * 1024 * 1024, staging_key="uploads/x",
        s3_upload_id="not-a-real-upload", created_by=people["maintainer"],
        expires_at=timezone.now() + timezone.timedelta(hours=1),
    )
    ids["upload"] = str(upload.pk)
    sweep = parse_sweep("quick", max_batch_size=0).as_dict()
    for key, host in (("profile_dev", "gpu-dev"), ("profile_prod", "gpu-prod")):
        ids[key] = Profile.objects.create(version=versions[1], host=ServingHost.objects.get(name=host), sweep=sweep).pk
    for key, host in (("replay_dev", "gpu-dev"), ("replay_prod", "gpu-prod")):
        ids[key] = Replay.objects.create(version=versions[1], against=versions[0], host=ServingHost.objects.get(
            name=host), tolerances={}, max_requests=10, pace=20, time_budget_s=600).pk
    ids["inference_key"] = create_inference_key(name="shop", models=[model])[0].pk
    ids["token"] = issue_token(user=people["maintainer"], name="ci", scopes=["read", "write"])[0].pk
    return {"users": people, "ids": ids}


def api_as(world: dict, who: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(world["users"][who])
    return client


def fill(template: str, values: dict, ids: dict) -> str:
    values = {"name": "resnet", "model_name": "resnet", "upload_id": ids["upload"], **values}
    if "id" in values:
        values["id"] = ids[values["id"]]
    return template.format(**values)


def verdict(status: int) -> object:
    assert status < 500 or status in (502, 503), f"unexpected {status}"
    return status if status in (401, 403, 404) else "ok"


@pytest.mark.parametrize("who", USERS)
@pytest.mark.parametrize(("method", "template", "values", "body", "expected"), API,
                         ids=[f"{m} {t} {v}" for m, t, v, _, _ in API])
def test_each_api_operation_answers_each_kind_of_user_as_their_role_allows(world, who, method, template, values,
                                                                            body, expected):
    path = fill(template, values, world["ids"])
    answer = getattr(api_as(world, who), method.lower())(path, body, format="json")
    assert verdict(answer.status_code) == expected[who], (answer.status_code, answer.content[:300])
    if expected[who] == 403:
        assert answer.json()["detail"]  # a sentence that says which role or scope is missing


def test_every_operation_of_the_api_schema_has_a_row_in_the_matrix(api_client):
    schema = api_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operations = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops
                  if method in ("get", "post", "put", "patch", "delete")}
    covered = {(method, template) for method, template, *_ in API}
    assert operations - covered == set()


def test_an_outsider_lists_none_of_the_teams_models_deployments_policies_or_audit_events(world):
    outsider, viewer = api_as(world, "outsider"), api_as(world, "viewer")
    for path in ("/api/v1/models/", "/api/v1/deployments/", "/api/v1/promotion-policies/",
                 "/api/v1/promotion-evaluations/", "/api/v1/audit/?model=resnet"):
        assert outsider.get(path).json()["results"] == [], path
        assert viewer.get(path).json()["results"] != [], path
    assert [t["name"] for t in outsider.get("/api/v1/teams/").json()["results"]] == ["nlp"]


def test_a_refusal_names_the_role_needed_and_the_role_held(world):
    answer = api_as(world, "maintainer").put("/api/v1/models/resnet/aliases/production/", {"version": 2},
                                             format="json")
    assert answer.json()["detail"] == ("moving the alias 'production' needs the owner role in team 'vision' "
                                       "(you are maintainer)")
    assert Alias.objects.get(name="production").version.version == 1
    answer = api_as(world, "maintainer").post("/api/v1/deployments/", {"model": "resnet", "version": 2,
                                                                       "hosts": ["gpu-prod"]}, format="json")
    assert answer.status_code == 403 and "deploying to production hosts needs the owner role" in answer.json()["detail"]


def test_a_model_registered_without_a_team_goes_to_the_only_team_the_user_maintains(world):
    answer = api_as(world, "maintainer").post("/api/v1/models/", {"name": "mobilenet"}, format="json")
    assert answer.status_code == 201 and answer.json()["team"] == "vision"
    Team.objects.get(name="nlp").memberships.create(user=world["users"]["maintainer"], role=Role.MAINTAINER)
    answer = api_as(world, "maintainer").post("/api/v1/models/", {"name": "bert"}, format="json")
    assert answer.status_code == 400 and "one of nlp, vision" in answer.json()["detail"]
    assert not RegisteredModel.objects.filter(name="bert").exists()
    answer = api_as(world, "viewer").post("/api/v1/models/", {"name": "bert"}, format="json")
    assert answer.status_code == 403 and not RegisteredModel.objects.filter(name="bert").exists()


# Pages: (method, URL name, kwargs, form data, expected per user)
PAGES = [
    ("GET", "registry:model-list", {}, None, EVERYONE),
    ("GET", "registry:model-detail", {"name": "resnet"}, None, needs("viewer")),
    ("POST", "registry:model-edit", {"name": "resnet"}, {"description": "x"}, needs("maintainer")),
    ("POST", "registry:model-edit", {"name": "resnet"}, {"inference_key_required": "1"}, needs("owner")),
    ("GET", "registry:inference-keys", {"name": "resnet"}, None, needs("viewer")),
    ("POST", "registry:inference-keys", {"name": "resnet"}, {"name": "shop", "models": "resnet"}, needs("owner")),
    ("GET", "registry:inference-key-revoke", {"name": "resnet", "key_id": "inference_key"}, None, needs("owner")),
    ("POST", "registry:inference-key-revoke", {"name": "resnet", "key_id": "inference_key"}, None,
     needs("owner")),
    ("GET", "registry:version-upload", {"name": "resnet"}, None, needs("maintainer")),
    # refusals of the alias form come back to the model page as a message (see the test below)
    ("POST", "registry:alias-set", {"name": "resnet"}, {"alias": "staging", "version": 2}, needs("viewer")),
    ("GET", "registry:alias-delete", {"name": "resnet", "alias": "staging"}, None, needs("maintainer")),
    ("GET", "registry:alias-delete", {"name": "resnet", "alias": "production"}, None, needs("owner")),
    ("POST", "registry:alias-protect", {"name": "resnet", "alias": "staging"}, {"protected": "1"}, needs("owner")),
    ("GET", "registry:card-edit", {"name": "resnet", "version": 2}, None, needs("maintainer")),
    ("GET", "registry:version-compare", {"name": "resnet"}, None, needs("viewer")),
    ("GET", "registry:card-readme", {"name": "resnet", "version": 2}, None, needs("viewer")),
    ("GET", "registry:version-detail", {"name": "resnet", "version": 2}, None, needs("viewer")),
    ("GET", "registry:version-delete", {"name": "resnet", "version": 2}, None, needs("owner")),
    ("GET", "registry:version-download", {"name": "resnet", "version": 2}, None, needs("viewer")),
    ("GET", "audit-log", {}, None, EVERYONE),
    ("GET", "deployments:host-list", {}, None, EVERYONE),
    ("GET", "deployments:host-create", {}, None, ADMINS),
    ("GET", "deployments:host-detail", {"name": "gpu-dev"}, None, EVERYONE),
    ("GET", "deployments:host-delete", {"name": "gpu-dev"}, None, ADMINS),
    ("GET", "deployments:host-model-unload", {"name": "gpu-dev", "model_name": "resnet"}, None,
     needs("maintainer")),
    ("GET", "deployments:host-model-unload", {"name": "gpu-prod", "model_name": "resnet"}, None, needs("owner")),
    ("POST", "deployments:host-model-reload", {"name": "gpu-prod", "model_name": "resnet"}, None, needs("owner")),
    ("GET", "deployments:rollout-create", {"model_name": "resnet"}, None, needs("maintainer")),
    ("GET", "deployments:try-it", {"model_name": "resnet"}, None, needs("maintainer")),
    ("GET", "deployments:model-deployments", {"model_name": "resnet"}, None, needs("viewer")),
    ("GET", "deployments:model-serving", {"model_name": "resnet"}, None, needs("viewer")),
    ("GET", "deployments:model-capture", {"model_name": "resnet"}, None, needs("viewer")),
    ("POST", "deployments:model-capture", {"model_name": "resnet"},
     {"fraction": "0", "max_mib": "256", "retention_days": "7"}, needs("owner")),
    ("GET", "deployments:rollout-detail", {"pk": "dev"}, None, needs("viewer")),
    ("GET", "deployments:version-profiles", {"model_name": "resnet", "version": 2}, None, needs("viewer")),
    ("POST", "deployments:version-profile-start", {"model_name": "resnet", "version": 2},
     {"host": "gpu-dev", "preset": "quick"}, needs("maintainer")),
    ("GET", "deployments:profile-cancel", {"pk": "profile_dev"}, None, needs("maintainer")),
    ("GET", "deployments:profile-cancel", {"pk": "profile_prod"}, None, needs("owner")),
    ("GET", "deployments:rollout-progress", {"pk": "dev"}, None, needs("viewer")),
    ("GET", "deployments:version-replays", {"model_name": "resnet", "version": 2}, None, needs("viewer")),
    ("GET", "deployments:replay-detail", {"pk": "replay_dev"}, None, needs("viewer")),
    ("GET", "deployments:replay-progress", {"pk": "replay_dev"}, None, needs("viewer")),
    ("POST", "deployments:rollout-action", {"pk": "dev", "action": "pause"}, None, needs("maintainer")),
    ("POST", "deployments:rollout-action", {"pk": "prod", "action": "pause"}, None, needs("owner")),
    ("POST", "deployments:rollout-canary", {"pk": "dev"}, {"percent": "20"}, needs("maintainer")),
    ("POST", "deployments:rollout-canary", {"pk": "prod"}, {"percent": "20"}, needs("owner")),
    ("GET", "promotions:model-policies", {"model_name": "resnet"}, None, needs("viewer")),
    ("GET", "promotions:policy-create", {"model_name": "resnet"}, None, needs("owner")),
    ("GET", "promotions:policy-detail", {"policy_id": "policy"}, None, needs("viewer")),
    ("GET", "promotions:policy-edit", {"policy_id": "policy"}, None, needs("owner")),
    ("POST", "promotions:policy-run", {"policy_id": "policy"}, None, needs("maintainer")),
    ("POST", "promotions:policy-pause", {"policy_id": "policy"}, None, needs("owner")),
    ("POST", "promotions:policy-resume", {"policy_id": "policy"}, None, needs("owner")),
    ("POST", "promotions:evaluation-approve", {"evaluation_id": "evaluation"}, None, needs("owner")),
    ("POST", "promotions:evaluation-reject", {"evaluation_id": "evaluation"}, None, needs("owner")),
    ("GET", "monitoring:overview", {}, None, EVERYONE),
    ("GET", "monitoring:overview-table", {}, None, EVERYONE),
    ("GET", "monitoring:overview-by-host", {}, None, EVERYONE),
    ("GET", "monitoring:model-metrics-panel", {"name": "resnet"}, None, needs("viewer")),
    ("GET", "monitoring:model-traffic", {"name": "resnet"}, None, needs("viewer")),
    ("GET", "monitoring:model-on-demand", {"name": "resnet"}, None, needs("viewer")),
    ("GET", "monitoring:rollout-canary-traffic", {"pk": "dev"}, None, needs("viewer")),
    ("GET", "monitoring:host-traffic", {"name": "gpu-dev"}, None, EVERYONE),
    ("GET", "accounts:team-list", {}, None, EVERYONE),
    ("GET", "accounts:token-list", {}, None, EVERYONE),
    ("GET", "accounts:token-create", {}, None, EVERYONE),
    # the page is for your own tokens only (administrators revoke others' through the API or the admin)
    ("GET", "accounts:token-revoke", {"token_id": "token"}, None, {**UPLOADER, "admin": 404}),
]
PAGE_IDS = {"pk", "policy_id", "evaluation_id", "token_id", "key_id"}


@pytest.mark.parametrize("who", USERS)
@pytest.mark.parametrize(("method", "name", "kwargs", "data", "expected"), PAGES,
                         ids=[f"{m} {n} {k}" for m, n, k, _, _ in PAGES])
def test_each_page_answers_each_kind_of_user_as_their_role_allows(client, world, who, method, name, kwargs, data,
                                                                   expected):
    from django.urls import reverse

    kwargs = {k: world["ids"][v] if k in PAGE_IDS else v for k, v in kwargs.items()}
    client.force_login(world["users"][who])
    answer = getattr(client, method.lower())(reverse(name, kwargs=kwargs), data or {})
    assert verdict(answer.status_code) == expected[who], answer.status_code


def test_the_alias_form_refuses_a_maintainer_moving_production_with_a_message(client, world):
    client.force_login(world["users"]["maintainer"])
    page = client.post("/models/resnet/aliases/", {"alias": "production", "version": 2}, follow=True)
    assert "needs the owner role in team &#x27;vision&#x27;" in page.content.decode()
    assert Alias.objects.get(name="production").version.version == 1


def _page_patterns(resolver=None, prefix: str = "") -> set[str]:
    names = set()
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace in ("registry", "deployments", "promotions", "monitoring", "accounts"):
                names |= {f"{entry.namespace}:{n}" for n in _page_patterns(entry)}
        elif isinstance(entry, URLPattern) and entry.name:
            names.add(entry.name)
    return names


def test_every_page_of_the_apps_has_a_row_in_the_matrix():
    covered = {name for _, name, *_ in PAGES} | {"audit-log"}
    pages = {n for n in _page_patterns() if ":" in n} | {"audit-log"}
    assert pages - covered == set()


def test_the_admin_site_is_for_administrators_only(client, world):
    client.force_login(world["users"]["owner"])
    assert client.get("/admin/accounts/team/").status_code == 302  # to the admin login
    client.force_login(world["users"]["admin"])
    assert client.get("/admin/accounts/team/").status_code == 200


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_a_tokens_scopes_narrow_its_users_role(world):
    from tests.factories import token_for

    owner = world["users"]["owner"]
    read_only = bearer(token_for(owner, ["read"]))
    assert read_only.get("/api/v1/models/resnet/").status_code == 200
    refused = read_only.put("/api/v1/models/resnet/aliases/staging/", {"version": 2}, format="json")
    assert refused.status_code == 403 and "'write' scope" in refused.json()["detail"]
    deployer = bearer(token_for(owner, ["deploy"]))
    answer = deployer.post("/api/v1/deployments/", {"model": "resnet", "version": 2, "hosts": ["gpu-prod"]},
                           format="json")
    assert answer.status_code == 201
    assert deployer.put("/api/v1/models/resnet/aliases/staging/", {"version": 2}, format="json").status_code == 403
    assert Alias.objects.get(name="staging").version.version == 1


def test_an_administrators_token_limited_to_one_team_sees_and_acts_only_there(world):
    from tests.factories import token_for

    nlp = Team.objects.get(name="nlp")
    RegisteredModel.objects.create(name="bert", team=nlp)
    limited = bearer(token_for(world["users"]["admin"], ["read", "write"], team=nlp))
    assert [m["name"] for m in limited.get("/api/v1/models/").json()["results"]] == ["bert"]
    assert limited.get("/api/v1/models/resnet/").status_code == 404
    assert limited.patch("/api/v1/models/bert/", {"description": "nlp"}, format="json").status_code == 200
    assert limited.post("/api/v1/hosts/", {"name": "gpu-x", "inference_url": "http://gpu-x:8000"},
                        format="json").status_code == 403


def test_the_teams_page_lists_your_teams_with_every_members_role(client, world):
    client.force_login(world["users"]["viewer"])
    page = client.get("/account/teams/").content.decode()
    assert page.count('class="team-row"') == 1 and "maintainer: maintainer" in page and "owner: owner" in page
    client.force_login(world["users"]["outsider"])
    page = client.get("/account/teams/").content.decode()
    assert page.count('class="team-row"') == 1 and "vision" not in page and "nlp" in page
    client.force_login(world["users"]["admin"])
    assert client.get("/account/teams/").content.decode().count('class="team-row"') == Team.objects.count()


def test_a_hosts_report_names_only_the_models_the_user_may_read(client, world):
    ServingHost.objects.filter(name="gpu-dev").update(heartbeat={"runtime_live": True, "models": [
        {"name": "resnet", "version": 1, "state": "READY"}, {"name": "bert", "version": 3, "state": "READY"}]})
    RegisteredModel.objects.create(name="bert", team=Team.objects.get(name="nlp"))

    def reported(who: str) -> list[str]:
        host = api_as(world, who).get("/api/v1/hosts/gpu-dev/").json()
        return [m["name"] for m in host["heartbeat"]["models"]]

    assert reported("viewer") == ["resnet"] and reported("outsider") == ["bert"]
    assert reported("admin") == ["resnet", "bert"]
    client.force_login(world["users"]["outsider"])
    page = client.get("/hosts/gpu-dev/").content.decode()
    assert "bert" in page and "resnet" not in page


def test_team_and_membership_changes_are_audited_and_a_team_with_usable_tokens_is_kept(world):
    from audit.models import AuditEvent

    admin = api_as(world, "admin")
    assert admin.post("/api/v1/teams/", {"name": "audio"}, format="json").status_code == 201
    assert admin.put("/api/v1/teams/audio/members/bob/", {"role": "owner"}, format="json").status_code == 404
    assert admin.put("/api/v1/teams/audio/members/viewer/", {"role": "owner"}, format="json").status_code == 200
    audio = Team.objects.get(name="audio")
    _token, _secret = issue_token(user=world["users"]["viewer"], name="ci", scopes=["read"], team=audio)
    refused = admin.delete("/api/v1/teams/audio/")
    assert refused.status_code == 409 and "revoke them first" in refused.json()["detail"]
    _token.revoked_at = timezone.now()
    _token.save()
    assert admin.delete("/api/v1/teams/audio/members/viewer/").status_code == 204
    assert admin.delete("/api/v1/teams/audio/").status_code == 204
    assert not Team.objects.filter(name="audio").exists()
    actions = list(AuditEvent.objects.filter(object_type="team").order_by("id").values_list("action", flat=True))
    assert actions[-4:] == ["team.created", "membership.set", "membership.removed", "team.deleted"]
    assert AuditEvent.objects.get(action="membership.removed", data__team="audio").data == {
        "team": "audio", "user": "viewer", "from": "owner", "to": None}


def test_the_admin_site_holds_team_names_to_the_grammar(client, world):
    client.force_login(world["users"]["admin"])
    answer = client.post("/admin/accounts/team/add/", {
        "name": "UPPER", "description": "", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    assert answer.status_code == 200 and not Team.objects.filter(name__iexact="upper").exists()
    assert "upper-case" in answer.content.decode()


def test_the_host_list_filters_every_hosts_report_with_the_same_queries_however_many_hosts(world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    report = {"runtime_live": True, "models": [{"name": "resnet", "version": 1, "state": "READY"}]}
    client = api_as(world, "viewer")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/api/v1/hosts/").status_code == 200
        return len(captured)

    ServingHost.objects.update(heartbeat=report)
    few = queries()
    for n in range(5):
        ServingHost.objects.create(name=f"gpu-extra-{n}", inference_url=f"http://gpu-extra-{n}:8000", heartbeat=report)
    assert queries() == few
