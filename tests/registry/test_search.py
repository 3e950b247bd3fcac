"""Searching and filtering models in the API and on the models page."""

import pytest

from registry.choices import ArtifactFormat
from registry.models import Alias, ModelVersion, RegisteredModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalogue(db):
    iris = RegisteredModel.objects.create(name="iris", description="flower classifier", tags={"team": "ml"})
    RegisteredModel.objects.create(name="resnet50", description="image classifier", tags={"team": "vision"})
    RegisteredModel.objects.create(name="bert", description="text", tags={"a__contains": "x"})
    version = ModelVersion.objects.create(model=iris, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    Alias.objects.create(model=iris, name="production", version=version)


def names(api_client, query: str) -> list[str]:
    answer = api_client.get(f"/api/v1/models/?{query}")
    assert answer.status_code == 200, answer.content
    return [m["name"] for m in answer.json()["results"]]


def test_the_api_searches_names_and_descriptions(api_client, catalogue):
    assert names(api_client, "search=classifier") == ["iris", "resnet50"]
    assert names(api_client, "search=RESNET") == ["resnet50"]


def test_the_api_filters_by_tag_alias_and_creation_time(api_client, catalogue):
    assert names(api_client, "tag=team") == ["iris", "resnet50"]
    assert names(api_client, "tag=team%3Dvision") == ["resnet50"]
    assert names(api_client, "tag=a__contains%3Dx") == ["bert"]  # a key, never a lookup
    assert names(api_client, "alias=production") == ["iris"]
    assert names(api_client, "created_after=2999-01-01T00:00:00Z") == []
    assert api_client.get("/api/v1/models/?created_after=soon").status_code == 400


def test_the_models_page_searches_and_filters(client, user, catalogue):
    client.force_login(user)
    page = client.get("/models/?search=classifier&tag=team%3Dml").content.decode()
    assert page.count('class="model-row"') == 1 and "iris" in page
    assert "No model matches" in client.get("/models/?search=nothing-like-this").content.decode()


def test_a_model_description_and_tags_are_edited_through_the_api_and_the_page(api_client, client, user, catalogue):
    from registry.models import AuditEvent

    answer = api_client.patch("/api/v1/models/iris/", {"description": "iris species", "tags": {"team": "ds"}},
                              format="json")
    assert answer.status_code == 200 and answer.json()["tags"] == {"team": "ds"}
    event = AuditEvent.objects.get(action="model.updated")
    assert event.data["description"] == {"from": "flower classifier", "to": "iris species"}
    assert api_client.patch("/api/v1/models/iris/", {"tags": {"": "x"}}, format="json").status_code == 400
    assert api_client.patch("/api/v1/models/nope/", {"description": "x"}, format="json").status_code == 404
    client.force_login(user)
    client.post("/models/iris/edit/", {"description": "edited on the page"})
    assert "edited on the page" in client.get("/models/iris/").content.decode()
