"""``?model=<name>`` (and ``?host=``) filter every list the CLI and CI scripts read, beside the long names."""

import pytest
from django.contrib.auth import get_user_model

from deployments.models import Deployment, Profile, Replay, ServingHost
from promotions.models import PromotionEvaluation, PromotionPolicy
from registry.models import ModelVersion, RegisteredModel
from tests.factories import api_client_for, team_member


@pytest.fixture
def two_models(db):
    """Models "iris" and "wine", each with one version, one deployment, one profile, one replay (on hosts
    "a" and "b" respectively), one promotion policy and one evaluation; an owner's API client."""
    hosts = {name: ServingHost.objects.create(name=name, inference_url=f"http://{name}:8000") for name in ("a", "b")}
    for name, host in (("iris", hosts["a"]), ("wine", hosts["b"])):
        model = RegisteredModel.objects.create(name=name)
        version = ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key=f"{name}/1",
                                              artifact_sha256="0" * 64, artifact_size=1)
        Deployment.objects.create(model=model, version=version)
        Profile.objects.create(version=version, host=host, sweep={})
        Replay.objects.create(version=version, against=version, host=host, tolerances={}, max_requests=10, pace=20,
                              time_budget_s=600)
        policy = PromotionPolicy.objects.create(model=model, candidate_alias="staging", target_alias="production")
        PromotionEvaluation.objects.create(policy=policy)
    return api_client_for(team_member(get_user_model().objects.create_user(username="owner")))


@pytest.mark.parametrize("path", ["deployments", "profiles", "replays", "promotion-policies",
                                  "promotion-evaluations"])
def test_model_filters_every_list_and_the_long_name_still_works(two_models, path):
    client = two_models
    everything = client.get(f"/api/v1/{path}/").json()["results"]
    assert len(everything) == 2
    only_iris = client.get(f"/api/v1/{path}/?model=iris").json()["results"]
    only_wine = client.get(f"/api/v1/{path}/?model=wine").json()["results"]
    assert len(only_iris) == len(only_wine) == 1
    assert {only_iris[0]["id"], only_wine[0]["id"]} == {row["id"] for row in everything}
    assert client.get(f"/api/v1/{path}/?model=nothing").json()["results"] == []
    long_name = {"deployments": "model__name", "profiles": "version__model__name", "replays": "version__model__name",
                 "promotion-policies": "model__name", "promotion-evaluations": "policy__model__name"}[path]
    assert [row["id"] for row in client.get(f"/api/v1/{path}/?{long_name}=iris").json()["results"]] == [
        only_iris[0]["id"]]


@pytest.mark.parametrize("path", ["profiles", "replays"])
def test_host_filters_agent_jobs(two_models, path):
    client = two_models
    on_a = client.get(f"/api/v1/{path}/?host=a").json()["results"]
    assert [row["host"] for row in on_a] == ["a"]
    assert client.get(f"/api/v1/{path}/?model=iris&host=b").json()["results"] == []


@pytest.mark.parametrize(("path", "name"), [("deployments", "deployment"), ("profiles", "profile"),
                                            ("replays", "replay"), ("promotion-evaluations", "promotion evaluation")])
def test_an_unknown_id_is_a_404_naming_what_was_looked_for(two_models, path, name):
    answer = two_models.get(f"/api/v1/{path}/999/")
    assert answer.status_code == 404 and answer.json() == {"detail": f"no {name} 999", "code": "not_found"}
