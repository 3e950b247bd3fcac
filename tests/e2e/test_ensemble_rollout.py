"""An ensemble rolled out on a real Triton: its composing model goes first, then the ensemble answers."""

import numpy as np
import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from demo.iris import SAMPLE_INPUT, build_iris_archive, expected_labels
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.e2e.support import wait_deployment
from tests.factories import token_for
from tests.fixtures.services import wait_for
from tests.registry.format_builders import ensemble_config, write_triton_dir

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOST = "ens-host"


def test_an_ensemble_deploys_its_composing_model_first_and_answers(s3_endpoint, start_triton, start_celery_worker,
                                                                     tmp_path):
    triton = start_triton()
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    agent = start_celery_worker(f"host.{HOST}",
                                env={"MODELYARD_AGENT_MODEL_REPOSITORY": str(triton.model_repository)})
    user = get_user_model().objects.create_user(username="ci", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    for name in ("iris", "iris-ens"):
        assert client.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
    with open(build_iris_archive(tmp_path / "iris.tar.gz"), "rb") as fh:
        assert client.post("/api/v1/models/iris/versions/", {"artifact": fh}, format="multipart").status_code == 201
    archive = write_triton_dir(tmp_path / "iris-ens.tar.gz", ensemble_config("iris-ens", [("iris", -1)]))
    with open(archive, "rb") as fh:
        registered = client.post("/api/v1/models/iris-ens/versions/", {"artifact": fh}, format="multipart")
    assert registered.status_code == 201, registered.content
    assert client.post("/api/v1/hosts/", {
        "name": HOST, "runtime": "triton", "inference_url": triton.http_url,
        "config_overrides": {"parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}},
    }, format="json").status_code == 201

    started = client.post("/api/v1/deployments/", {"model": "iris-ens", "version": 1, "hosts": [HOST]},
                          format="json")
    assert started.status_code == 201, started.content
    rollout = wait_deployment(client, started.json()["id"], timeout=240)
    assert rollout["status"] == "succeeded", rollout
    iris_rollouts = client.get("/api/v1/deployments/?model__name=iris").json()["results"]
    assert [(d["version"], d["status"]) for d in iris_rollouts] == [(1, "succeeded")]  # deployed first, by itself

    runtime = TritonRuntime(triton.http_url)
    assert runtime.ready_versions("iris") == [1] and runtime.ready_versions("iris-ens") == [1]
    answer = runtime.infer("iris-ens", {"input": np.asarray(SAMPLE_INPUT, dtype=np.float32)}, ["label"])
    assert answer["label"].reshape(-1).tolist() == expected_labels()

    # A new version of the composing model rolls out; the host then checks the ensemble is READY.
    with open(build_iris_archive(tmp_path / "iris-2.tar.gz"), "rb") as fh:
        assert client.post("/api/v1/models/iris/versions/", {"artifact": fh}, format="multipart").status_code == 201
    swapped = client.post("/api/v1/deployments/", {"model": "iris", "version": 2, "hosts": [HOST]}, format="json")
    assert wait_deployment(client, swapped.json()["id"], timeout=240)["status"] == "succeeded"
    wait_for(lambda: "deployments.check_ensemble_on_host" in agent.log_text() and "succeeded" in
             agent.log_text().split("deployments.check_ensemble_on_host")[-1], timeout=60,
             what="the host to check the ensemble after iris moved")
    assert runtime.ready_versions("iris") == [2]

    def ensemble_answers() -> bool:
        # Triton reloads an ensemble whose composing model changed; on a busy machine that can
        # still be under way when the check ran, so ask until it answers.
        try:
            answer = runtime.infer("iris-ens", {"input": np.asarray(SAMPLE_INPUT, dtype=np.float32)}, ["label"])
        except Exception:  # a transient answer while Triton reloads; the wait's timeout is the assertion
            return False
        return answer["label"] is not None and answer["label"].reshape(-1).tolist() == expected_labels()

    wait_for(ensemble_answers, timeout=30, what="the ensemble to answer with iris v2 in place")
    assert runtime.ready_versions("iris-ens") == [1]
