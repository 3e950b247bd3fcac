"""The replay gate: judging a candidate on captured requests, with a real Triton answering them."""

import pytest
from django.utils import timezone

from deployments.models import Replay, ServingHost
from deployments.replays import build_replay_payload, record_replay_report
from modelyard_agent.contract import REPLAY_PROTOCOL
from modelyard_agent.formats.archives import sha256_file
from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.replay.triton import replay_triton_version
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_staging import AgentPaths, stage_version
from promotions import evaluations, gates, policies
from promotions.choices import Decision
from promotions.models import PromotionEvaluation
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.deployments.triton_host import agent_payload, artifacts, config_of
from tests.fixtures.replay_models import build_threshold_archive, inputs_with_share_above, record_captures

__all__ = ["artifacts"]  # fixture

# -- the pure judge ----------------------------------------------------------------------------------


EVIDENCE = {"id": 7, "compared": 1000, "agreement_rate": 0.8, "serving_p95_ms": 2.0, "candidate_p95_ms": 2.2}


def test_agreement_below_the_minimum_fails_and_at_it_passes():
    low = gates.judge(gates.Limits(min_agreement=0.95), None, None, has_target=True, replay=EVIDENCE)
    assert [c.passed for c in low] == [False] and "80.00 % (below the minimum of 95.00 %)" in low[0].message
    ok = gates.judge(gates.Limits(min_agreement=0.8), None, None, has_target=True, replay=EVIDENCE)
    assert ok[0].passed and "replay 7, 1000 captured requests" in ok[0].message


def test_latency_regression_compares_the_replayed_p95_of_both_versions():
    within = gates.judge(gates.Limits(max_latency_regression=0.2), None, None, has_target=True, replay=EVIDENCE)
    assert within[0].passed and within[0].value == pytest.approx(0.1)
    above = gates.judge(gates.Limits(max_latency_regression=0.05), None, None, has_target=True, replay=EVIDENCE)
    assert not above[0].passed and "+10.0 %" in above[0].message


def test_without_a_replay_the_gates_fail_with_the_reason_and_without_a_target_they_pass():
    waiting = {"missing": "replay 3 running, the next evaluation judges it"}
    checks = gates.judge(gates.Limits(min_agreement=0.9, max_latency_regression=0.1), None, None, has_target=True,
                         replay=waiting)
    assert [c.passed for c in checks] == [False, False] and checks[0].message == waiting["missing"]
    first = gates.judge(gates.Limits(min_agreement=0.9), None, None, has_target=False)
    assert first[0].passed and "no target version yet" in first[0].message


def test_policy_replay_settings_are_checked_naming_the_field(db):
    RegisteredModel.objects.create(name="thr")
    for bad, field in (({"min_agreement": 1.5}, "min_agreement"), ({"replay_atol": -1}, "replay_atol"),
                       ({"replay_max_requests": 0}, "replay_max_requests"),
                       ({"replay_argmax_outputs": "scores"}, "replay_argmax_outputs")):
        with pytest.raises(Exception, match=field):
            policies.create_policy(model_name="thr", candidate_alias="staging", target_alias="production", **bad)


# -- on a real Triton ---------------------------------------------------------------------------------


@pytest.fixture
def fleet(db, triton_server, artifacts):
    """``thr`` v1 @production served by a real Triton whose gateway "captured" 1000 real requests (20 % of them
    with a first feature above 7), a host row reporting that, and a way to register candidates."""
    root, base_url = artifacts
    paths = AgentPaths(triton_server.model_repository)
    serving = build_threshold_archive(root / "thr-1.tar.gz", name="thr", version=1)
    payload = agent_payload(serving, base_url, triton_server, model="thr", version=1)
    stage_version(payload, paths)
    TritonRuntime(triton_server.http_url, load_timeout=120).load("thr", render_load_config(
        payload["config_text"], model_name="thr", versions=[1], parameters=payload["parameters"]))
    capture_dir = root.parent / "gateway" / "capture" / "thr"
    record_captures(triton_server.http_url, "thr", 1, inputs_with_share_above(1000, 0.2, 7.0, seed=3), capture_dir)
    model = RegisteredModel.objects.create(name="thr", next_version=2)

    def register(number: int, archive) -> ModelVersion:
        sha256, size = sha256_file(archive)
        version = ModelVersion.objects.create(model=model, version=number, format="triton",
                                              artifact_key=archive.name, artifact_sha256=sha256, artifact_size=size,
                                              config_text=config_of(archive))
        Alias.objects.update_or_create(model=model, name="production" if number == 1 else "staging",
                                       defaults={"version": version})
        return version

    register(1, serving)
    ServingHost.objects.create(
        name="edge", inference_url=triton_server.http_url, last_heartbeat_at=timezone.now(),
        config_overrides={"parameters": payload["parameters"]},
        heartbeat={"runtime_live": True, "agent": {"protocol": REPLAY_PROTOCOL},
                   "models": [{"name": "thr", "version": 1, "state": "READY"}],
                   "gateway": {"live": True, "routes": {}, "capture": {"thr": {"requests": 1000}}}})

    def candidate(number: int, **model_args) -> ModelVersion:
        return register(number, build_threshold_archive(root / f"thr-{number}.tar.gz", name="thr", version=number,
                                                        **model_args))

    def run_agent(replay: Replay) -> dict:
        """What the host's agent does with the replay's payload (paced faster than the default for the test)."""
        sent = build_replay_payload(replay, download_url=f"{base_url}/thr-{replay.version.version}.tar.gz")
        result = replay_triton_version({**sent, "pace": 1000.0, "protocol": REPLAY_PROTOCOL}, paths=paths,
                                       triton_url=triton_server.http_url, capture_dir=capture_dir,
                                       progress=lambda report: None, should_stop=lambda: None, load_timeout=120)
        assert record_replay_report(replay.pk, result)
        return result

    return candidate, run_agent


def evaluate(policy, prometheus):
    evaluation = PromotionEvaluation.objects.create(policy=policy)
    return evaluations.evaluate(evaluation.pk, client=prometheus.client)


def test_a_candidate_that_differs_on_a_known_share_is_reported_at_that_share_and_held_and_an_identical_one_passes(
        fleet, prometheus, django_capture_on_commit_callbacks):
    candidate, run_agent = fleet
    candidate(2, flip_above=7.0)
    policy = policies.create_policy(model_name="thr", candidate_alias="staging", target_alias="production",
                                    min_requests=None, min_agreement=0.95, max_latency_regression=2.0)

    first = evaluate(policy, prometheus)
    replay = Replay.objects.get()
    assert first.decision == Decision.HELD
    assert f"replay {replay.pk} running, the next evaluation judges it" in first.reason
    assert evaluate(policy, prometheus).decision == Decision.HELD and Replay.objects.count() == 1  # no second one

    result = run_agent(replay)
    assert result["status"] == "succeeded" and result["summary"]["compared"] == 1000
    assert abs((1 - result["summary"]["agreement_rate"]) - 0.2) <= 0.01
    held = evaluate(policy, prometheus)
    assert held.decision == Decision.HELD and "below the minimum of 95.00 %" in held.reason
    assert held.metrics["replay"]["id"] == replay.pk

    candidate(3)  # identical to the serving version
    waiting = evaluate(policy, prometheus)
    second = Replay.objects.exclude(pk=replay.pk).get()
    assert waiting.decision == Decision.HELD and second.version.version == 3
    assert run_agent(second)["summary"]["agreement_rate"] == 1.0
    passed = evaluate(policy, prometheus)
    assert passed.decision == Decision.PROMOTED, passed.reason
    assert {c["gate"]: c["passed"] for c in passed.checks} == {"min_agreement": True, "max_latency_regression": True}
    assert Alias.objects.get(name="production").version.version == 3
