"""``GET /api/v1/models/<name>/versions/<n>/`` answers from one query without the serializer on PostgreSQL
(``registry.api.reads``): the same JSON as ``ModelVersionSerializer`` for every kind of version (aliases,
ensemble members, lineage, a verified digest, no creator), the same 404 and 403 as before, and two SQL queries
in all (the token; the version with everything it shows) for a member and for an administrator."""

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.choices import Role
from accounts.models import Team
from accounts.services import default_team, set_membership
from registry.api.serializers import ModelVersionSerializer, RegisteredModelSerializer
from registry.choices import ArtifactFormat, VersionStatus
from registry.models import Alias, EnsembleMember, ModelVersion, RegisteredModel
from tests.factories import token_for

pytestmark = [pytest.mark.django_db,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-query read is PostgreSQL's")]


def version(model: RegisteredModel, number: int, **fields) -> ModelVersion:
    return ModelVersion.objects.create(model=model, version=number, format=fields.pop("format", ArtifactFormat.ONNX),
                                       artifact_key=f"k/{model.name}/{number}", artifact_sha256=f"{number:064x}",
                                       artifact_size=1234 * number, **fields)


@pytest.fixture
def versions(user):
    iris = RegisteredModel.objects.create(name="iris", team=default_team(), next_version=4)
    plain = version(iris, 1, created_by=None)
    lineage = version(iris, 2, created_by=user, tags={"stage": "ci", "empty": ""}, metadata={"a": [1, 2]},
                      signature={"inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]},
                      source_commit="abc123", ci_run_url="https://ci.example/run/7", training_data_uri="s3://d/x",
                      metrics={"accuracy": 0.97}, sha256_verified_at=datetime(2026, 12, 6, 1, 2, 3, 456789, UTC),
                      status=VersionStatus.CORRUPT, integrity_error="digest differs")
    for name in ("staging", "production", "canary"):
        Alias.objects.create(model=iris, name=name, version=lineage, updated_by=user)
    other = RegisteredModel.objects.create(name="bert", team=iris.team, next_version=3)
    member_b2, member_b1 = version(other, 2), version(other, 1)
    ensemble = version(iris, 3, format=ArtifactFormat.TRITON_ENSEMBLE, created_by=user)
    # Two steps of one model at two versions: ordered by model, then version, on both paths.
    EnsembleMember.objects.create(ensemble=ensemble, member=member_b2, requested_version=-1)
    EnsembleMember.objects.create(ensemble=ensemble, member=plain, requested_version=1)
    EnsembleMember.objects.create(ensemble=ensemble, member=member_b1, requested_version=1)
    return [plain, lineage, ensemble]


def expected(row: ModelVersion) -> dict:
    row = ModelVersion.objects.select_related("model", "created_by").prefetch_related(
        "members__member__model", "aliases").get(pk=row.pk)
    return ModelVersionSerializer(row).data


def counted(client, url: str):
    """``client.get(url)`` and the SQL it ran, after one request that stamps the token's last use (a write
    made at most once a minute)."""
    client.get("/api/v1/whoami/")
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(url)
    return answer, [query["sql"] for query in queries.captured_queries]


def test_each_version_reads_as_the_serializer_shows_it_in_two_queries(api_client, versions):
    for row in versions:
        answer, queries = counted(api_client, f"/api/v1/models/{row.model.name}/versions/{row.version}/")
        assert answer.status_code == 200, answer.content
        assert list(answer.json()) == list(expected(row))  # the same fields in the same order
        assert answer.json() == _as_json(expected(row)), row.version
        assert len(queries) == 2, queries  # the token; the version with all it shows
    # Ensemble members by model name, aliases by name, as the serializer orders them.
    ensemble = api_client.get("/api/v1/models/iris/versions/3/").json()
    assert [(m["model"], m["version"]) for m in ensemble["ensemble_members"]] == [("bert", 1), ("bert", 2),
                                                                                ("iris", 1)]
    assert api_client.get("/api/v1/models/iris/versions/2/").json()["aliases"] == ["canary", "production", "staging"]


def _as_json(data) -> dict:
    import json

    from rest_framework.renderers import JSONRenderer

    return json.loads(JSONRenderer().render(data))


def test_an_administrator_reads_it_in_two_queries_and_others_get_the_usual_404(versions):
    admin = get_user_model().objects.create_user(username="root", password="a-long-test-password", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(admin)}")
    answer, queries = counted(client, "/api/v1/models/iris/versions/2/")
    assert answer.status_code == 200 and len(queries) == 2, queries
    outsider = get_user_model().objects.create_user(username="outsider", password="a-long-test-password")
    set_membership(team=Team.objects.create(name="elsewhere"), user=outsider, role=Role.OWNER)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(outsider)}")
    hidden = client.get("/api/v1/models/iris/versions/2/")
    missing = client.get("/api/v1/models/nope/versions/2/")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["code"] == missing.json()["code"]
    ModelVersion.objects.filter(model__name="iris", version=1).update(status=VersionStatus.DELETED)
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {token_for(admin)}").get(
        "/api/v1/models/iris/versions/1/").status_code == 404


def test_a_page_of_models_reads_as_the_serializer_shows_it(api_client, user, versions):
    # The JSON PostgreSQL writes: text that JSON escapes, tags of more than ASCII, a time on a whole second (which
    # DRF writes without microseconds) and one with them.
    RegisteredModel.objects.create(name="alpha", team=default_team(), description='a "quoted" \\ line\n\t\x01 é 😀',
                                   tags={"team": "ml", "ünïcode": "ja 日本"}, created_by=user)
    RegisteredModel.objects.filter(name="alpha").update(created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
                                                        updated_at=datetime(2026, 1, 2, 3, 4, 5, 60, tzinfo=UTC))
    answer = api_client.get("/api/v1/models/?page_size=2")
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    rows = answer.json()["results"] + api_client.get(answer.json()["next"]).json()["results"]
    models = RegisteredModel.objects.select_related("created_by", "team").with_version_summary().order_by("name")
    assert rows == [_as_json(RegisteredModelSerializer(m).data) for m in models]
    assert (rows[0]["created_at"], rows[0]["updated_at"]) == ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05.000060Z")
    assert [row["latest_version"] for row in rows] == [None, 2, 3]  # alpha has none; iris's 3 is its newest
    assert api_client.get("/api/v1/models/?tag=team%3Dml").json()["results"] == rows[:1]
    # JSON indented at the client's asking comes through DRF's renderer, to the same rows.
    indented = api_client.get("/api/v1/models/?page_size=2", HTTP_ACCEPT="application/json; indent=4")
    assert indented.content.startswith(b'{\n    "next"') and indented.json()["results"] == rows[:2]
    # The browsable API renders the same page through the serializer's path.
    browsable = api_client.get("/api/v1/models/?page_size=2", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200 and "text/html" in browsable["Content-Type"]
    assert "&quot;created_at&quot;: &quot;2026-01-02T03:04:05Z&quot;" in browsable.content.decode()


def test_a_page_of_versions_reads_as_the_serializer_shows_it_in_two_queries(api_client, versions):
    answer, queries = counted(api_client, "/api/v1/models/iris/versions/?page_size=2")
    rows = answer.json()["results"] + api_client.get(answer.json()["next"]).json()["results"]
    assert [row["version"] for row in rows] == [3, 2, 1]
    assert rows == [_as_json(expected(row)) for row in sorted(versions, key=lambda v: -v.version)]
    # The token; the page of the versions the caller may read, each version's JSON written by the query (the
    # model's own lookup is left for a page that comes back empty).
    assert len(queries) == 2, queries
    assert api_client.get("/api/v1/models/iris/versions/?tag=stage%3Dci").json()["results"] == rows[1:2]
    # The browsable API takes the keys' and rows' path (registry.api.reads.versions_json) to the same rows.
    browsable = api_client.get("/api/v1/models/iris/versions/?page_size=3", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200 and "&quot;aliases&quot;: [" in browsable.content.decode()


def test_a_version_number_past_the_column_or_a_nul_in_the_name_is_a_404_not_a_server_error(api_client, versions):
    assert api_client.get(f"/api/v1/models/iris/versions/{2**63}/").status_code == 404
    assert api_client.get("/api/v1/models/ir%00is/versions/1/").status_code in (400, 404)


def test_a_tag_filter_with_a_nul_is_a_400(api_client, versions):
    answer = api_client.get("/api/v1/models/?tag=a%00b")
    assert answer.status_code == 400 and "NUL" in answer.content.decode()


def test_a_page_of_versions_that_comes_back_empty_says_why(api_client, user, versions):
    from accounts.models import Team

    RegisteredModel.objects.create(name="fresh", team=default_team())
    empty, queries = counted(api_client, "/api/v1/models/fresh/versions/")
    assert (empty.status_code, empty.json()["results"]) == (200, [])  # a model without versions
    assert len(queries) == 3, queries  # the token, the empty page, the model's lookup
    unknown = api_client.get("/api/v1/models/nosuch/versions/")
    assert unknown.status_code == 404 and "nosuch" in unknown.json()["detail"], unknown.content
    # A model of a team the caller is not in reads as one that does not exist, its versions included.
    RegisteredModel.objects.filter(name="iris").update(team=Team.objects.create(name="elsewhere"))
    hidden = api_client.get("/api/v1/models/iris/versions/")
    assert hidden.status_code == 404
    assert hidden.json() == {key: value.replace("nosuch", "iris") if isinstance(value, str) else value
                             for key, value in unknown.json().items()}
    # A crafted cursor for an unknown model: the model is named, not the cursor.
    crafted = api_client.get("/api/v1/models/nosuch/versions/?cursor=cD1hYmM%3D")
    assert crafted.status_code == 404 and "nosuch" in crafted.json()["detail"], crafted.content
    invalid = api_client.get("/api/v1/models/fresh/versions/?cursor=cD1hYmM%3D")
    assert invalid.status_code == 404 and "cursor" in invalid.json()["detail"].lower(), invalid.content


@pytest.mark.parametrize("query", ["metric=bad", "page_size=0", "tag=%3Dx", "created_after=yesterday",
                                   "artifact_format=nope"])
def test_a_refused_filter_or_page_size_on_an_unknown_or_hidden_models_versions_is_its_404(api_client, versions,
                                                                                          query):
    # As on the path that looks the model up first (another renderer, here indented JSON): the model is named,
    # whatever the query string, and a model the caller may read gets the 400 naming the parameter.
    for name in ("nosuch", "iris"):
        if name == "iris":
            RegisteredModel.objects.filter(name="iris").update(team=Team.objects.create(name="elsewhere"))
        for accept in ("application/json", "application/json; indent=2"):
            answer = api_client.get(f"/api/v1/models/{name}/versions/?{query}", HTTP_ACCEPT=accept)
            assert answer.status_code == 404, (name, accept, answer.status_code, answer.content)
            assert answer.json() == {"detail": f"no model named '{name}'", "code": "not_found"}, answer.content
    RegisteredModel.objects.create(name="fresh", team=default_team())
    refused = api_client.get(f"/api/v1/models/fresh/versions/?{query}")
    assert refused.status_code == 400 and refused.json()["code"] == "invalid", refused.content
