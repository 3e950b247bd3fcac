"""Deleting a version: soft delete, aliases removed with it, numbers never reused, refusals that name why."""

import pytest
from django.contrib.auth import get_user_model

from accounts.choices import Role
from accounts.services import default_team, set_membership
from audit.choices import AuditAction
from audit.models import AuditEvent
from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from modelyard.errors import NotFound
from registry.aliases import set_alias
from registry.choices import ArtifactFormat, VersionStatus
from registry.deletion import delete_version
from registry.models import Alias, EnsembleMember, ModelVersion, RegisteredModel
from tests.factories import api_client_for

pytestmark = pytest.mark.django_db


def add_version(model: RegisteredModel, number: int, creator=None, sha: str | None = None) -> ModelVersion:
    sha = sha or f"{number:064d}"
    version = ModelVersion.objects.create(
        model=model, version=number, format=ArtifactFormat.TRITON_MODEL_DIR, artifact_key=f"sha256/{sha[:2]}/{sha}",
        artifact_sha256=sha, artifact_size=1, created_by=creator,
    )
    model.next_version = max(model.next_version, number + 1)
    model.save(update_fields=["next_version"])
    return version


@pytest.fixture
def iris(user) -> RegisteredModel:
    model = RegisteredModel.objects.create(name="iris")
    for number in (1, 2, 3):
        add_version(model, number, creator=user)
    return model


def serve(version: ModelVersion, host_name: str, state: str = TargetState.READY) -> DeploymentTarget:
    host, _ = ServingHost.objects.get_or_create(name=host_name, defaults={"inference_url": "http://gpu-0:8000"})
    deployment = Deployment.objects.create(model=version.model, version=version)
    return DeploymentTarget.objects.create(deployment=deployment, host=host, state=state)


def test_deleting_a_version_removes_its_aliases_in_the_same_transaction_and_audits_each(api_client, iris, user):
    set_alias(model_name="iris", alias="production", version=3, actor=user)
    set_alias(model_name="iris", alias="staging", version=3, actor=user)
    set_alias(model_name="iris", alias="canary", version=2, actor=user)

    assert api_client.delete("/api/v1/models/iris/versions/3/").status_code == 204

    row = ModelVersion.objects.get(model=iris, version=3)
    assert (row.status, row.deleted_by) == (VersionStatus.DELETED, user) and row.deleted_at is not None
    assert list(Alias.objects.filter(model=iris).values_list("name", flat=True)) == ["canary"]
    removed = AuditEvent.objects.filter(action=AuditAction.ALIAS_DELETED).order_by("id")
    assert [(e.data["alias"], e.data["from"]) for e in removed] == [("production", 3), ("staging", 3)]
    assert AuditEvent.objects.get(action=AuditAction.VERSION_DELETED).data["version"] == 3
    assert api_client.get("/api/v1/models/iris/versions/3/").status_code == 404
    assert [v["version"] for v in api_client.get("/api/v1/models/iris/versions/").json()["results"]] == [2, 1]
    assert api_client.get("/api/v1/models/iris/aliases/latest/").json()["version"] == 2
    assert api_client.get("/api/v1/models/iris/").json()["latest_version"] == 2


def test_deleting_a_version_twice_is_a_404_and_writes_nothing_more(api_client, iris):
    assert api_client.delete("/api/v1/models/iris/versions/1/").status_code == 204
    again = api_client.delete("/api/v1/models/iris/versions/1/")
    assert again.status_code == 404 and "no version 1" in again.json()["detail"]
    assert api_client.delete("/api/v1/models/nope/versions/1/").status_code == 404
    assert AuditEvent.objects.filter(action=AuditAction.VERSION_DELETED).count() == 1


def test_a_number_is_never_reused_after_deletion(api_client, s3_endpoint, iris_archive):
    api_client.post("/api/v1/models/", {"name": "iris"}, format="json")
    for _ in range(2):
        with open(iris_archive, "rb") as fh:
            api_client.post("/api/v1/models/iris/versions/", {"artifact": fh}, format="multipart")
    assert api_client.delete("/api/v1/models/iris/versions/2/").status_code == 204
    with open(iris_archive, "rb") as fh:
        third = api_client.post("/api/v1/models/iris/versions/", {"artifact": fh}, format="multipart")
    assert third.json()["version"] == 3
    assert api_client.get("/api/v1/models/iris/versions/2/").status_code == 404


def test_only_an_owner_or_the_maintainer_who_registered_a_version_may_delete_it(client, iris, user):
    users = get_user_model().objects
    outsider = api_client_for(users.create_user(username="outsider", password="a-long-test-password"))
    colleague = users.create_user(username="colleague", password="a-long-test-password")
    set_membership(team=default_team(), user=colleague, role=Role.MAINTAINER)
    admin = api_client_for(users.create_user(username="admin", password="a-long-test-password", is_staff=True))
    owner = api_client_for(user)
    mine = add_version(iris, 4, creator=colleague)

    assert outsider.delete("/api/v1/models/iris/versions/3/").status_code == 404  # another team's model is unseen
    maintainer = api_client_for(colleague)
    refused = maintainer.delete("/api/v1/models/iris/versions/3/")
    assert refused.status_code == 403 and "owner role in team 'default'" in refused.json()["detail"]
    assert client.delete("/api/v1/models/iris/versions/3/").status_code in (401, 403)
    assert ModelVersion.objects.get(model=iris, version=3).status == VersionStatus.READY
    assert maintainer.delete("/api/v1/models/iris/versions/4/").status_code == 204
    assert ModelVersion.objects.get(pk=mine.pk).status == VersionStatus.DELETED
    assert owner.delete("/api/v1/models/iris/versions/3/").status_code == 204
    assert admin.delete("/api/v1/models/iris/versions/2/").status_code == 204


def test_a_version_a_live_ensemble_composes_cannot_be_deleted(api_client, iris, user):
    pipeline = RegisteredModel.objects.create(name="pipeline")
    ensemble = add_version(pipeline, 1, creator=user)
    EnsembleMember.objects.create(ensemble=ensemble, member=ModelVersion.objects.get(model=iris, version=2))

    refused = api_client.delete("/api/v1/models/iris/versions/2/")
    assert refused.status_code == 409 and "pipeline v1" in refused.json()["detail"]
    assert ModelVersion.objects.get(model=iris, version=2).status == VersionStatus.READY

    assert api_client.delete("/api/v1/models/pipeline/versions/1/").status_code == 204
    assert api_client.delete("/api/v1/models/iris/versions/2/").status_code == 204


def test_a_version_a_host_serves_or_is_deploying_cannot_be_deleted(api_client, iris):
    v1, v2, v3 = (ModelVersion.objects.get(model=iris, version=n) for n in (1, 2, 3))
    serve(v1, "gpu-a")
    serve(v2, "gpu-b", state=TargetState.LOADING)

    refused = api_client.delete("/api/v1/models/iris/versions/1/")
    assert refused.status_code == 409 and "gpu-a" in refused.json()["detail"]
    assert "gpu-b" in api_client.delete("/api/v1/models/iris/versions/2/").json()["detail"]

    serve(v3, "gpu-a")  # gpu-a now serves v3: no host is left without a serving version
    assert api_client.delete("/api/v1/models/iris/versions/1/").status_code == 204
    assert api_client.delete("/api/v1/models/iris/versions/3/").status_code == 409


def test_a_deleted_version_cannot_be_deployed_or_aliased(iris, user):
    from deployments.services import start_deployment

    ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-0:8000")
    delete_version(model_name="iris", version=1, actor=user)
    with pytest.raises(NotFound):
        start_deployment(model_name="iris", version=1, host_names=["gpu-a"], actor=user)
    with pytest.raises(NotFound):
        set_alias(model_name="iris", alias="production", version=1, actor=user)
    assert not Deployment.objects.exists() and not Alias.objects.exists()


def test_a_version_is_deleted_from_its_page_after_confirmation(client, iris, user):
    set_alias(model_name="iris", alias="production", version=3, actor=user)
    client.force_login(user)
    assert 'href="/models/iris/versions/3/delete/"' in client.get("/models/iris/versions/3/").content.decode()

    confirm = client.get("/models/iris/versions/3/delete/").content.decode()
    assert "Delete iris v3?" in confirm and "@production" in confirm
    assert ModelVersion.objects.get(model=iris, version=3).status == VersionStatus.READY  # nothing before the POST

    answer = client.post("/models/iris/versions/3/delete/", follow=True)
    assert answer.redirect_chain[-1][0] == "/models/iris/"
    assert "v3 deleted" in answer.content.decode()
    assert ModelVersion.objects.get(model=iris, version=3).status == VersionStatus.DELETED
    assert client.get("/models/iris/versions/3/delete/").status_code == 404


def test_the_version_page_explains_a_refused_deletion_and_hides_the_button_from_others(client, iris, user):
    serve(ModelVersion.objects.get(model=iris, version=3), "gpu-a")
    client.force_login(user)
    answer = client.post("/models/iris/versions/3/delete/", follow=True)
    assert "gpu-a" in answer.content.decode()
    assert ModelVersion.objects.get(model=iris, version=3).status == VersionStatus.READY

    colleague = get_user_model().objects.create_user(username="colleague", password="a-long-test-password")
    set_membership(team=default_team(), user=colleague, role=Role.MAINTAINER)
    client.force_login(colleague)
    assert "/delete/" not in client.get("/models/iris/versions/2/").content.decode()
    answer = client.post("/models/iris/versions/2/delete/", follow=True)
    assert answer.status_code == 403 and "owner role" in answer.content.decode()
    assert ModelVersion.objects.get(model=iris, version=2).status == VersionStatus.READY
