"""Searching and filtering models in the API and on the models page."""

import pytest
from django.db import connection

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
    from audit.models import AuditEvent

    answer = api_client.patch("/api/v1/models/iris/", {"description": "iris species", "tags": {"team": "ds"}},
                              format="json")
    assert answer.status_code == 200 and answer.json()["tags"] == {"team": "ds"}
    event = AuditEvent.objects.get(action="model.updated")
    assert event.data["description"] == {"from": "flower classifier", "to": "iris species"}
    assert api_client.patch("/api/v1/models/iris/", {"tags": {"": "x"}}, format="json").status_code == 400
    refused = api_client.patch("/api/v1/models/iris/", {"tags": {"a=b": "x"}}, format="json")
    assert refused.status_code == 400 and "must not contain '='" in refused.json()["detail"]
    assert api_client.patch("/api/v1/models/iris/", {"description": "x" * 10_001}, format="json").status_code == 400
    assert RegisteredModel.objects.get(name="iris").description == "iris species"
    assert api_client.patch("/api/v1/models/nope/", {"description": "x"}, format="json").status_code == 404
    client.force_login(user)
    client.post("/models/iris/edit/", {"description": "edited on the page"})
    assert "edited on the page" in client.get("/models/iris/").content.decode()
    refused = client.post("/models/iris/edit/", {"description": "y" * 10_001}, follow=True).content.decode()
    assert "10001 characters long; the limit is 10000. Nothing was saved." in refused
    assert RegisteredModel.objects.get(name="iris").description == "edited on the page"


def test_the_api_finds_models_by_name_substring_and_by_the_format_of_a_live_version(api_client, catalogue):
    resnet = RegisteredModel.objects.get(name="resnet50")
    ModelVersion.objects.create(model=resnet, version=1, format=ArtifactFormat.ONNX, artifact_key="k2",
                                artifact_sha256="1" * 64, artifact_size=1, status="deleted")
    assert names(api_client, "name=NET") == ["resnet50"]
    assert names(api_client, "artifact_format=triton") == ["iris"]
    assert names(api_client, "artifact_format=onnx") == []  # its only ONNX version is deleted
    assert api_client.get("/api/v1/models/?artifact_format=pickle").status_code == 400
    assert names(api_client, "created_after=2000-01-01&created_before=2999-01-01") == ["bert", "iris", "resnet50"]
    assert api_client.get("/api/v1/models/?tag=%3Dx").status_code == 400


@pytest.fixture
def versions(db):
    model = RegisteredModel.objects.create(name="iris")
    for number, (fmt, accuracy) in enumerate([("triton", 0.8), ("onnx", 0.95), ("onnx", None)], start=1):
        ModelVersion.objects.create(
            model=model, version=number, format=fmt, artifact_key=f"k{number}", artifact_sha256=f"{number:064d}",
            artifact_size=1, metrics={} if accuracy is None else {"accuracy": accuracy}, tags={"stage": str(number)},
            source_commit=f"abc{number}",
        )
    return model


def numbers(api_client, query: str) -> list[int]:
    answer = api_client.get(f"/api/v1/models/iris/versions/?{query}")
    assert answer.status_code == 200, answer.content
    return [v["version"] for v in answer.json()["results"]]


def test_the_api_filters_versions_by_format_metric_tag_and_commit(api_client, versions):
    assert numbers(api_client, "artifact_format=onnx") == [3, 2]
    assert numbers(api_client, "metric=accuracy%3E%3D0.9") == [2]
    assert numbers(api_client, "metric=accuracy%3C0.9") == [1]
    assert numbers(api_client, "metric=accuracy%3D0.8") == [1]
    assert numbers(api_client, "metric=f1%3E0") == []
    assert numbers(api_client, "tag=stage%3D3&source_commit=abc") == [3]
    assert numbers(api_client, "created_before=2000-01-01") == []


@pytest.mark.parametrize("query", ["metric=accuracy", "metric=accuracy%3E%3Dhigh", "metric=%3E%3D1", "tag=%3D1",
                                   "artifact_format=pickle", "created_after=tomorrow"])
def test_the_api_refuses_a_malformed_version_filter_with_a_400(api_client, versions, query):
    answer = api_client.get(f"/api/v1/models/iris/versions/?{query}")
    assert answer.status_code == 400 and answer.json()


def test_the_models_page_filters_by_format_and_creation_date_and_pages_by_name(client, user, catalogue):
    client.force_login(user)
    page = client.get("/models/?artifact_format=triton&created_after=2000-01-01").content.decode()
    assert page.count('class="model-row"') == 1 and 'value="triton" selected' in page
    assert client.get("/models/?created_before=2000-01-01").content.decode().count('class="model-row"') == 0

    RegisteredModel.objects.bulk_create(RegisteredModel(name=f"m{n:03d}") for n in range(0, 120, 2))
    first = client.get("/models/").content.decode()
    assert first.count('class="model-row"') == 50 and "after=m094" in first
    RegisteredModel.objects.create(name="a-new-one")  # sorts before the cursor: must not shift the next page
    second = client.get("/models/?after=m094").content.decode()
    assert second.count('class="model-row"') == 13 and "m096" in second and "m094<" not in second
    assert "before=m096" in second and "next →" not in second


def test_the_tag_value_filter_works_on_sqlite_too(tmp_path):
    """``make run`` uses SQLite by default; the key=value tag filter once compared JSON there (a 500)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'tags.sqlite3'}"}
    script = (
        "from django.core.management import call_command; call_command('migrate', verbosity=0)\n"
        "from registry.models import RegisteredModel\n"
        "from registry.filters import filter_by_tag\n"
        "RegisteredModel.objects.create(name='iris', tags={'team': 'ml'})\n"
        "RegisteredModel.objects.create(name='wine', tags={'team': 'bi'})\n"
        "print([m.name for m in filter_by_tag(RegisteredModel.objects.all(), 'team=ml')])\n"
    )
    answer = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr[-2000:]
    assert answer.stdout.strip().splitlines()[-1] == "['iris']"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the GIN indexes are PostgreSQL's")
def test_the_search_indexes_take_each_row_at_once_and_searches_find_rows_just_inserted():
    # A GIN pending list is read in full by each search (and by the planner): 3.7 ms instead of 0.02 ms in the
    # trigram index after a bulk fill of 10,000 models, so the planner scanned the table instead.
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)",
                       [["registry_model_name_trgm", "registry_model_description_trgm", "registry_model_tags_gin",
                         "registry_version_tags_gin"]])
        options = dict(cursor.fetchall())
    assert len(options) == 4 and all(value == ["fastupdate=off"] for value in options.values()), options
    RegisteredModel.objects.bulk_create(RegisteredModel(name=f"bulk-{n:04d}", tags={"n": str(n)}) for n in range(300))
    assert list(RegisteredModel.objects.filter(name__icontains="K-0042").values_list("name", flat=True)) == [
        "bulk-0042"]


def test_a_filter_form_class_is_built_once_and_each_request_validates_on_its_own():
    from registry.filters import ModelVersionFilter, RegisteredModelFilter

    bad = RegisteredModelFilter({"created_after": "yesterday"}, queryset=RegisteredModel.objects.all())
    good = RegisteredModelFilter({"created_after": "2026-01-01"}, queryset=RegisteredModel.objects.all())
    assert type(bad.form) is type(good.form) and bad.form is not good.form
    assert not bad.is_valid() and "created_after" in bad.form.errors
    assert good.is_valid() and not good.form.errors
    assert bad.form.fields["created_after"] is not good.form.fields["created_after"]  # each its own copy
    versions = ModelVersionFilter({}, queryset=ModelVersion.objects.all())
    assert type(versions.form) is not type(good.form) and "source_commit" in versions.form.fields


def test_each_filterset_has_its_own_filters_and_a_method_filter_calls_its_own_filterset():
    from registry.filters import RegisteredModelFilter

    RegisteredModel.objects.bulk_create([RegisteredModel(name="a", tags={"team": "x"}),
                                         RegisteredModel(name="b", tags={"team": "y"})])
    calls = []

    class Recording(RegisteredModelFilter):
        def filter_tag(self, queryset, name, value):
            calls.append(self)
            return super().filter_tag(queryset, name, value)

    first = Recording({"tag": "team=x"}, queryset=RegisteredModel.objects.all())
    second = Recording({"tag": "team=y"}, queryset=RegisteredModel.objects.all())
    assert first.filters["tag"] is not second.filters["tag"]
    assert first.filters["tag"] is not Recording.base_filters["tag"]
    assert first.filters["tag"].parent is first and second.filters["tag"].parent is second
    assert [m.name for m in second.qs] == ["b"] and [m.name for m in first.qs] == ["a"]
    assert calls == [second, first]  # each filter's method ran on the FilterSet that holds it
    assert not hasattr(Recording.base_filters["tag"], "parent")  # the class's filters are never handed out
