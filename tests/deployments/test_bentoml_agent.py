"""The BentoML host agent on real ``bentoml serve`` processes behind a real nginx: Bentos built by
BentoML itself are imported into the host's store and swapped blue/green without failing a request;
a version that cannot start, a killed agent and broken archives leave exactly one version serving."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from modelyard.errors import InvalidInput
from modelyard_agent.bentoml_host import deploy_bentoml_version, unload_bentoml_model
from modelyard_agent.bentoml_instances import ServeState, collect_bentoml_heartbeat, front_for, stop_host
from modelyard_agent.host_agents import host_agent
from modelyard_agent.runtimes import bentoml as serve
from modelyard_agent.runtimes.base import StagingError
from modelyard_agent.runtimes.bento_store import BentoStore
from tests.deployments.bentoml_host import (
    MODEL,
    SAMPLE,
    agent_root,
    artifact_server,
    make_payload,
    serving_homes,
)
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration
__all__ = ["agent_root", "artifact_server"]  # fixtures


def classify(url: str, session=None) -> requests.Response:
    return (session or requests).post(f"{url}/{MODEL}/classify", json=SAMPLE, timeout=30)


def deploy(bentos, artifact_server, agent_root, name: str, version: int, steps=None) -> dict:
    _, base_url = artifact_server
    root, url = agent_root
    return deploy_bentoml_version(make_payload(bentos[name], base_url, url, version), root=root,
                                  report=(steps.append if steps is not None else lambda step: None))


def test_a_bento_is_imported_under_its_exact_tag_and_served_through_nginx(bentos, artifact_server, agent_root):
    root, url = agent_root
    steps = []
    result = deploy(bentos, artifact_server, agent_root, "v1", 1, steps)
    assert result["state"] == "ready", result
    assert steps == ["staging", "loading", "verifying", "cutting_over"]
    tag = result["details"]["tag"]
    assert BentoStore(root).bento_dir(tag).is_dir() and not tag.endswith(":latest")
    answer = classify(url)
    assert answer.status_code == 200 and answer.json() == [1]
    assert answer.headers["X-Modelyard-Version"] == "1"
    heartbeat = collect_bentoml_heartbeat(inference_url=url, root=root, labels={})
    assert heartbeat["runtime_live"] and heartbeat["models"] == [{"name": MODEL, "version": 1, "state": "READY"}]

    again = deploy(bentos, artifact_server, agent_root, "v1", 1)
    assert again["state"] == "ready" and again["details"]["staged"] is False
    assert again["details"]["port"] == result["details"]["port"]
    assert len(serving_homes(root)) == 1


def test_a_swap_under_continuous_requests_fails_none(bentos, artifact_server, agent_root):
    root, url = agent_root
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    old = ServeState(root).read()[MODEL]["serving"]
    stop, failures, versions, counts = threading.Event(), [], set(), [0]

    def client(keepalive: bool) -> None:
        session = requests.Session() if keepalive else None
        while not stop.is_set():
            try:
                answer = classify(url, session)
                if answer.status_code != 200 or answer.json() != [1]:
                    failures.append(f"{answer.status_code}: {answer.text[:200]}")
                versions.add(answer.headers.get("X-Modelyard-Version"))
            except requests.RequestException as exc:
                failures.append(repr(exc))
            counts[0] += 1

    clients = [threading.Thread(target=client, args=(keepalive,)) for keepalive in (True, True, False)]
    for thread in clients:
        thread.start()
    try:
        result = deploy(bentos, artifact_server, agent_root, "v2", 2)
        sent_during_swap = counts[0]
        for _ in range(20):
            classify(url)
    finally:
        stop.set()
        for thread in clients:
            thread.join()
    assert result["state"] == "ready", result
    assert result["details"]["previous_versions"] == [1]
    assert failures == []
    assert sent_during_swap > 0 and versions == {"1", "2"}
    assert not serve.processes_of(old.home) and serve.port_is_free(old.port)
    assert serving_homes(root) == [ServeState(root).read()[MODEL]["serving"].home]
    # Prometheus's path for each version answers only with the metrics of the process serving it.
    assert requests.get(f"{url}/_metrics/{MODEL}/1", timeout=5).status_code == 404
    metrics = requests.get(f"{url}/_metrics/{MODEL}/2", timeout=5)
    assert metrics.status_code == 200 and 'endpoint="/classify"' in metrics.text


def test_a_version_whose_service_cannot_start_leaves_the_old_one_serving(bentos, artifact_server, agent_root):
    root, url = agent_root
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    result = deploy(bentos, artifact_server, agent_root, "refuses", 2)
    assert result["state"] == "failed"
    assert "exited before it was ready" in result["error"]
    assert "this service refuses to start" in result["error"]
    answer = classify(url)
    assert answer.status_code == 200 and answer.headers["X-Modelyard-Version"] == "1"
    state = ServeState(root).read()[MODEL]
    assert set(state) == {"serving"} and state["serving"].version == 1
    assert serving_homes(root) == [state["serving"].home]


def test_a_version_whose_port_another_process_took_before_serve_bound_it_starts_on_another_port(
        bentos, artifact_server, agent_root, monkeypatch):
    # The fault: a process binds the chosen port in the seconds before ``serve`` does (stop 52's CI
    # run lost a deployment to errno 98 this way). Choosing a taken port is the only way to have it on cue.
    root, url = agent_root
    thief = socket.create_server(("127.0.0.1", 0))
    taken, chosen, real = thief.getsockname()[1], [], serve.free_port

    def free_port() -> int:  # the taken port first, then the real choice
        chosen.append(real() if chosen else taken)
        return chosen[-1]

    monkeypatch.setattr(serve, "free_port", free_port)
    with thief:
        result = deploy(bentos, artifact_server, agent_root, "v1", 1)
        assert result["state"] == "ready", result
    assert chosen[0] == taken and result["details"]["port"] == chosen[1] != taken
    assert classify(url).headers["X-Modelyard-Version"] == "1"
    home = Path(ServeState(root).read()[MODEL]["serving"].home)
    assert "Address already in use" in (home / f"serve-{taken}.log").read_text()  # the first start's log, kept
    assert serving_homes(root) == [str(home)]


def test_an_instance_port_is_outside_the_ports_the_kernel_gives_outgoing_connections():
    ephemeral = serve.ephemeral_ports()
    ports = {serve.free_port() for _ in range(50)}
    assert not ports & set(ephemeral) and min(ports) >= serve.PORT_FLOOR


_AGENT_SCRIPT = """
import json, sys, time
from modelyard_agent.bentoml_host import deploy_bentoml_version
from modelyard_agent.runtimes.nginx import NginxFront
payload, root = json.loads(sys.argv[1]), sys.argv[2]
if sys.argv[3] == "reloading":  # held once nginx's files name the new version, before nginx reloads them
    def held(self, *args, **kwargs):
        print("reloading", flush=True)
        time.sleep(600)
    NginxFront._reload = held
deploy_bentoml_version(payload, root=root, report=lambda step: print(step, flush=True))
print("done", flush=True)
"""


@pytest.mark.parametrize("recovery", ["redelivery", "heartbeat"])
@pytest.mark.parametrize("kill_at", ["loading", "cutting_over", "reloading"])
def test_an_agent_killed_during_a_swap_leaves_exactly_one_serving_version_after_recovery(
    bentos, artifact_server, agent_root, agent_settings, kill_at, recovery
):
    root, url = agent_root
    _, base_url = artifact_server
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    payload = make_payload(bentos["v2"], base_url, url, 2)
    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT_SCRIPT, json.dumps(payload), str(root), kill_at], stdout=subprocess.PIPE,
        text=True, cwd=Path(__file__).parents[2],
    )
    for line in agent.stdout:
        if line.strip() == kill_at:
            if kill_at == "loading":  # once the new service process exists
                wait_for(lambda: ServeState(root).read()[MODEL]["starting"].pid, timeout=60,
                         what="the new bentoml serve process")
            agent.send_signal(signal.SIGKILL)
            break
    agent.wait()
    assert agent.returncode == -signal.SIGKILL
    assert len(ServeState(root).read()[MODEL]) == 2  # the swap was cut short: serving and starting recorded

    if recovery == "redelivery":  # the broker hands the unacknowledged task out again
        redelivered = deploy_bentoml_version(payload, root=root)
        assert redelivered["state"] == "ready", redelivered
        assert classify(url).headers["X-Modelyard-Version"] == "2"
    else:  # the next heartbeat tidies up, under the model's lock
        agent_settings(bentoml_root=root)
        report = host_agent("bentoml").heartbeat({"host": "bento-host", "inference_url": url})
        assert report["tidied"] == [MODEL]
        assert [(m["name"], m["state"]) for m in report["models"]] == [(MODEL, "READY")]
    kept = ServeState(root).read()[MODEL]
    assert set(kept) == {"serving"} and serving_homes(root) == [kept["serving"].home]
    answer = classify(url)
    assert answer.status_code == 200 and answer.headers["X-Modelyard-Version"] == str(kept["serving"].version)


def test_a_first_canary_killed_before_nginx_reloaded_its_split_is_recovered_onto_the_split(
    bentos, artifact_server, agent_root
):
    """The agent wrote the split location of a model's first canary and was killed before the reload that serves
    it: the running nginx still had the plain location. Recovery reloads, so the canary that follows takes its
    share and its promotion stops the old version without a 502 (the plain location named its process)."""
    root, url = agent_root
    _, base_url = artifact_server
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    payload = {**make_payload(bentos["v2"], base_url, url, 2), "canary_percent": 100}
    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT_SCRIPT, json.dumps(payload), str(root), "reloading"], stdout=subprocess.PIPE,
        text=True, cwd=Path(__file__).parents[2],
    )
    for line in agent.stdout:
        if line.strip() == "reloading":
            agent.send_signal(signal.SIGKILL)
            break
    agent.wait()
    assert agent.returncode == -signal.SIGKILL

    redelivered = deploy_bentoml_version(payload, root=root)
    assert redelivered["state"] == "ready", redelivered
    assert classify(url).headers["X-Modelyard-Version"] == "2"  # 100 %: the split serves
    promoted = deploy_bentoml_version(make_payload(bentos["v2"], base_url, url, 2), root=root)
    assert promoted["state"] == "ready", promoted
    answer = classify(url)
    assert answer.status_code == 200 and answer.headers["X-Modelyard-Version"] == "2"


def test_a_truncated_or_corrupt_archive_is_refused_with_a_clear_error(bentos, tmp_path):
    store = BentoStore(tmp_path / "store")
    data = bentos["v1"].read_bytes()
    truncated, corrupt = tmp_path / "truncated", tmp_path / "corrupt"
    truncated.write_bytes(data[: len(data) // 2])
    corrupt.write_bytes(data[:4096] + bytes(len(data) - 4096))
    for archive in (truncated, corrupt):
        with pytest.raises(StagingError, match="truncated or corrupt"):
            store.import_archive(archive, kind="bento", tag=f"{MODEL}:abc", sha256="0" * 64)
    assert not list((tmp_path / "store" / "store").glob("bentos/*/*"))


def test_an_archive_holding_another_tag_than_the_registry_recorded_is_refused(bentos, artifact_server, agent_root,
                                                                                  tmp_path):
    store = BentoStore(tmp_path / "store")
    with pytest.raises(StagingError, match="the registry recorded clf:other"):
        store.import_archive(bentos["v1"], kind="bento", tag=f"{MODEL}:other", sha256="0" * 64)
    with pytest.raises(StagingError, match="exact tag"):
        store.import_archive(bentos["v1"], kind="bento", tag=f"{MODEL}:latest", sha256="0" * 64)


def test_a_download_that_differs_from_the_registered_archive_is_refused(bentos, artifact_server, agent_root):
    root, url = agent_root
    _, base_url = artifact_server
    payload = {**make_payload(bentos["v1"], base_url, url, 1), "sha256": "0" * 64}
    result = deploy_bentoml_version(payload, root=root)
    assert result["state"] == "failed" and "does not match the registered" in result["error"]
    assert not serving_homes(root)


def test_a_bentoml_model_is_imported_into_the_store_without_being_served(bentos, artifact_server, agent_root):
    root, url = agent_root
    _, base_url = artifact_server
    result = deploy_bentoml_version(make_payload(bentos["v1-model"], base_url, url, 1), root=root)
    assert result["state"] == "ready" and result["details"]["served"] is False
    name, version = result["details"]["tag"].split(":")
    assert (root / "store" / "models" / name / version / "model.yaml").is_file()
    assert not serving_homes(root)


def test_an_unloaded_model_stops_being_routed_and_its_processes_stop(bentos, artifact_server, agent_root):
    root, url = agent_root
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    served = ServeState(root).read()[MODEL]["serving"]
    assert unload_bentoml_model({"model": MODEL, "inference_url": url}, root=root) == 1
    assert classify(url).status_code == 404
    assert not serving_homes(root) and serve.port_is_free(served.port)
    assert collect_bentoml_heartbeat(inference_url=url, root=root, labels={})["models"] == []
    assert BentoStore(root).bento_dir(served.tag).is_dir()  # the store keeps it for a reload


@pytest.mark.django_db
@pytest.mark.parametrize("route", ["agent", "direct"])
def test_try_it_on_a_bentoml_host_answers_from_the_served_version(bentos, artifact_server, agent_root, settings,
                                                                   route, request):
    from django.utils import timezone

    from deployments.inference import try_inference
    from deployments.models import Deployment, DeploymentTarget, ServingHost
    from registry.models import ModelVersion, RegisteredModel

    root, url = agent_root
    settings.TRY_IT_ROUTE = route
    if route == "agent":  # the host's agent, which sends the request to its nginx
        request.getfixturevalue("start_celery_worker")("host.bento-host", runtime="bentoml",
                                                       env={"MODELYARD_AGENT_BENTOML_ROOT": str(root)})
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    signature = make_payload(bentos["v1"], "", url, 1)["signature"]
    model = RegisteredModel.objects.create(name=MODEL, next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format="bento", artifact_key="sha256/01/x",
                                          artifact_sha256="1" * 64, artifact_size=10, signature=signature)
    host = ServingHost.objects.create(name="bento-host", runtime="bentoml", inference_url=url,
                                      last_heartbeat_at=timezone.now())  # its agent reports in
    deployment = Deployment.objects.create(model=model, version=version)
    DeploymentTarget.objects.create(deployment=deployment, host=host, state="ready")

    result = try_inference(model_name=MODEL, host_name="bento-host", inputs=SAMPLE)
    assert (result["version"], result["outputs"], result["shapes"]) == (1, {"output": [1]}, {"output": [1]})
    assert result["route"] == route
    with pytest.raises(InvalidInput, match="HTTP 400"):
        try_inference(model_name=MODEL, host_name="bento-host", inputs={"nonsense": 1})


def test_stopping_the_host_stops_every_bento_process_and_nginx_and_records_nothing_serving(
    bentos, artifact_server, agent_root
):
    root, url = agent_root
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    serving = ServeState(root).read()[MODEL]["serving"]

    assert stop_host(root, url) == [serving.home]

    assert serving_homes(root) == [] and serve.port_is_free(serving.port)
    assert front_for(root, url).master_pid() is None
    assert ServeState(root).read() == {}
    assert collect_bentoml_heartbeat(inference_url=url, root=root, labels={})["models"] == []
    assert stop_host(root, url) == []


def test_the_heartbeat_of_a_host_serving_nothing_yet_starts_its_nginx_so_the_host_is_online(agent_root, agent_settings):
    root, url = agent_root
    agent_settings(bentoml_root=root)

    report = host_agent("bentoml").heartbeat({"host": "bento-host", "inference_url": url})

    assert report["runtime_live"] is True and report["errors"] == [] and report["models"] == []
    assert front_for(root, url).is_live()


def test_a_serving_process_whose_arbiter_is_killed_is_replaced_blue_green_without_a_failed_request(
    bentos, artifact_server, agent_root
):
    from modelyard_agent.bentoml_instances import tidy_models
    from modelyard_agent.coordination import host_model_lock

    root, url = agent_root
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    crashed = ServeState(root).read()[MODEL]["serving"]
    stop, failures, answered = threading.Event(), [], [0]

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    answer = classify(url, session)
                    if answer.status_code != 200:
                        failures.append(f"{answer.status_code}: {answer.text[:200]}")
                    answered[0] += 1
                except requests.RequestException as exc:
                    failures.append(repr(exc))

    thread = threading.Thread(target=client)
    thread.start()
    try:
        os.kill(crashed.pid, signal.SIGKILL)  # the arbiter alone: its worker is orphaned and still answers
        wait_for(lambda: not serve.is_running(crashed), timeout=10, what="the arbiter to be gone")
        assert serve.processes_of(crashed.home), "the orphaned worker is the premise of this test"
        tidied = tidy_models(root, url, lambda model: host_model_lock("bento-host", model))
        for _ in range(20):
            classify(url)
    finally:
        stop.set()
        thread.join()
    assert tidied == [MODEL]
    replacement = ServeState(root).read()[MODEL]["serving"]
    assert replacement.home != crashed.home and replacement.version == 1 and serve.is_running(replacement)
    assert not serve.processes_of(crashed.home)
    assert answered[0] > 0 and failures == []


def test_a_bento_is_profiled_with_wrk_beside_the_served_version_which_fails_no_request(
    bentos, artifact_server, agent_root, perf_analyzer
):
    """BentoML's card: a profiling instance of its own (never routed to by nginx), measured with Debian's
    wrk over the sweep's concurrency levels, then stopped; clients of the served version notice nothing."""
    from modelyard_agent.profiling.bentoml import profile_bentoml_version
    from modelyard_agent.profiling.sweep import parse_sweep

    root, url = agent_root
    _, base_url = artifact_server
    assert deploy(bentos, artifact_server, agent_root, "v1", 1)["state"] == "ready"
    served_before = serving_homes(root)
    payload = {**make_payload(bentos["v2"], base_url, url, 2), "profile_id": 5,
               "sweep": parse_sweep({"concurrency": [1, 4], "measurement_interval_ms": 500}, max_batch_size=0,
                                    runtime="bentoml").as_dict()}
    failures, answered, stop = [], [], threading.Event()

    def clients():
        with requests.Session() as session:
            while not stop.is_set():
                answer = classify(url, session)
                (answered if answer.status_code == 200 else failures).append(answer.headers.get("X-Modelyard-Version"))

    thread = threading.Thread(target=clients, daemon=True)
    thread.start()
    steps = []
    try:
        result = profile_bentoml_version(payload, root=root, wrk_binary="wrk", progress=lambda rows, step:
                                         steps.append((len(rows), step)), should_stop=lambda: None,
                                         load_timeout=120, unload_timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert result["status"] == "succeeded", result
    assert [row["concurrency"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert "error" not in row and row["config"]["key"] == "served" and row["throughput"] > 0, row
        assert 0 < row["p50_ms"] <= row["p99_ms"] and row["errors"] == 0, row
        assert row["memory_kind"] == "cpu" and row["memory_bytes"] > 0, row
    assert (1, "concurrency 4") in steps
    assert answered and failures == [] and set(answered) == {"1"}  # only the served version answered clients
    assert serving_homes(root) == served_before  # the profiling instance is gone
    assert not list((root / "instances").glob("clf--profile-5-*"))
