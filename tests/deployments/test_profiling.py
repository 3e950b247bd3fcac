"""Performance cards without a running profile: sweeps, the card's reading, the load generators' reports,
the profiles API's refusals and bookkeeping, and where the rest of the fleet uses a card's figures."""

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.services import create_team
from deployments.choices import JobStatus
from deployments.models import Profile, ServingHost
from deployments.placement import measured_footprint
from deployments.profiles import (
    card_instance_bounds,
    fail_stalled_profiles,
    recommended_overrides,
    record_profile_report,
)
from deployments.services import check_autoscale
from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.profiling import perf_analyzer, wrk
from modelyard_agent.profiling.card import pareto_front, recommend, throughput_at
from modelyard_agent.profiling.sweep import PRESETS, ProfileConfig, SweepError, parse_sweep
from modelyard_agent.profiling.triton import profile_model_name
from registry.models import ModelVersion, RegisteredModel
from tests.factories import team_member, token_for

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
# Measured on the CPU Triton of scripts/install_triton.sh with the quick preset (see the data README).
CARD = json.loads((DATA / "profile_iris_cpu.json").read_text())
IRIS_CONFIG = """name: "iris"
backend: "python"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"""


# -- sweeps -------------------------------------------------------------------------------------------


def test_the_quick_preset_sweeps_instances_and_batching_of_a_batching_model():
    sweep = parse_sweep("quick", max_batch_size=8)
    assert [c.key for c in sweep.configs] == ["i1-nobatch", "i1-db8-q100", "i2-nobatch", "i2-db8-q100"]
    assert sweep.concurrency == (1, 4) and sweep.runs == 8
    assert sweep.request["preset"] == "quick" and sweep.time_budget_s == PRESETS["quick"]["time_budget_s"]


def test_a_model_that_does_not_batch_is_swept_over_instance_counts_only():
    sweep = parse_sweep({"instance_counts": [2, 1, 2], "dynamic_batching": [False, True]}, max_batch_size=0)
    assert [c.key for c in sweep.configs] == ["i1-nobatch", "i2-nobatch"]
    with pytest.raises(SweepError, match="does not batch"):
        parse_sweep({"max_batch_sizes": [4]}, max_batch_size=0)


@pytest.mark.parametrize(("sweep", "message"), [
    ({"concurrency": []}, "concurrency must be a list of 1 to 12"),
    ({"concurrency": [0]}, "from 1 to 1024"),
    ({"instance_counts": [65]}, "from 1 to 64"),
    ({"max_batch_sizes": [16]}, "from 1 to 8"),  # over the version's own limit
    ({"preferred_batch_sizes": [4, 8], "max_batch_sizes": [4]}, "must not exceed max_batch_size 4"),
    ({"dynamic_batching": "yes"}, "list of booleans"),
    ({"measurement_interval_ms": 50}, "from 200 to 30000"),
    ({"time_budget_s": 30, "concurrency": [1, 2, 4, 8]}, "needs at least"),
    ({"warmup": 3}, "unknown sweep field"),
    ({"preset": "huge"}, "unknown preset"),
    ("huge", "unknown preset"),
    ([1, 2], "JSON object or the name of a preset"),
])
def test_a_sweep_that_cannot_run_is_refused_naming_the_field(sweep, message):
    with pytest.raises(SweepError, match=message):
        parse_sweep(sweep, max_batch_size=8)


def test_a_bentoml_version_is_measured_as_it_serves_over_concurrency():
    sweep = parse_sweep({"concurrency": [1, 8]}, max_batch_size=0, runtime="bentoml")
    assert [c.key for c in sweep.configs] == ["served"] and sweep.concurrency == (1, 8)
    with pytest.raises(SweepError, match="instance_counts cannot be swept"):
        parse_sweep({"instance_counts": [2]}, max_batch_size=0, runtime="bentoml")


def test_a_config_turns_into_overrides_that_triton_loads_with_batching_off_or_on():
    off = ProfileConfig(instance_count=3, max_batch_size=8).config_overrides([{"kind": "KIND_CPU", "count": 1}])
    assert off == {"instance_group": [{"kind": "KIND_CPU", "count": 3}], "max_batch_size": 8,
                   "dynamic_batching": None}
    loaded = json.loads(render_load_config(IRIS_CONFIG, model_name="iris--profile-1", versions=[1], overrides=off))
    assert "dynamic_batching" not in loaded and loaded["instance_group"][0]["count"] == 3
    on = ProfileConfig(instance_count=1, dynamic_batching=True, max_batch_size=4, preferred_batch_sizes=(2, 4),
                       max_queue_delay_us=250).config_overrides([])
    loaded = json.loads(render_load_config(IRIS_CONFIG, model_name="iris", versions=[1], overrides=on))
    assert loaded["dynamic_batching"] == {"max_queue_delay_microseconds": "250", "preferred_batch_size": [2, 4]}
    assert loaded["max_batch_size"] == 4 and loaded["instance_group"] == [{"count": 1}]


def test_a_profile_copy_has_a_name_of_its_own_within_the_grammar():
    from modelyard_agent.formats.names import NAME_PATTERN

    assert profile_model_name("iris", 12) == "iris--profile-12"
    long = profile_model_name("a" * 63, 123456)
    assert len(long) <= 63 and NAME_PATTERN.match(long) and long.endswith("--profile-123456")


# -- reading a card -----------------------------------------------------------------------------------


def _row(key: str, concurrency: int, throughput: float, p99: float, instances: int = 1, **extra) -> dict:
    return {"config": {"key": key, "instance_count": instances, "label": key}, "concurrency": concurrency,
            "throughput": throughput, "p50_ms": p99 / 2, "p99_ms": p99, **extra}


def test_the_recommendation_is_the_highest_throughput_within_the_slo():
    rows = [_row("a", 1, 1000, 1.0), _row("a", 8, 5000, 30.0), _row("b", 4, 4000, 9.0, instances=2),
            _row("c", 4, 4000, 8.0, instances=3), {"config": {"key": "d"}, "concurrency": 2, "error": "unstable"}]
    best = recommend(rows, slo_p99_ms=10)
    assert (best["config"]["key"], best["concurrency"]) == ("c", 4)  # a tie goes to the lower p99
    assert recommend(rows, slo_p99_ms=None)["throughput"] == 5000
    assert recommend(rows, slo_p99_ms=0.5) is None
    assert throughput_at(rows, "b", 4) == 4000 and throughput_at(rows, "d", 2) is None


def test_the_pareto_front_keeps_only_rows_no_other_beats_on_both_axes():
    rows = [_row("a", 1, 1000, 1.0), _row("a", 4, 900, 2.0), _row("b", 1, 3000, 3.0), _row("b", 4, 2500, 4.0),
            _row("c", 8, 4000, 9.0)]
    assert [(r["config"]["key"], r["concurrency"]) for r in pareto_front(rows)] == [("a", 1), ("b", 1), ("c", 8)]


def test_the_real_card_recommends_a_measured_row_on_its_front():
    best = recommend(CARD["rows"], CARD["slo_p99_ms"])
    front = pareto_front(CARD["rows"])
    assert best is not None and best["p99_ms"] <= CARD["slo_p99_ms"]
    assert any(r["config"]["key"] == best["config"]["key"] and r["concurrency"] == best["concurrency"]
               for r in front)


# -- the load generators' reports ---------------------------------------------------------------------


def test_perf_analyzers_csv_is_read_in_milliseconds():
    row = perf_analyzer.read_csv(DATA / "perf_analyzer_iris_c2.csv")
    assert row == {"throughput": 7087.19, "p50_ms": 0.257, "p90_ms": 0.392, "p95_ms": 0.43, "p99_ms": 0.54,
                   "queue_ms": 0.053, "compute_ms": 0.096}


def test_a_perf_analyzer_run_that_wrote_nothing_is_an_error(tmp_path):
    with pytest.raises(perf_analyzer.LoadGeneratorError, match="no measurement"):
        perf_analyzer.read_csv(tmp_path / "missing.csv")


def test_wrks_report_line_gives_throughput_and_percentiles(tmp_path):
    log = tmp_path / "wrk.log"
    log.write_text("Running 3s test @ http://127.0.0.1:3000/classify\n"
                   'MODELYARD-WRK {"requests": 3000, "duration_us": 3000000, "errors": 0, "non_2xx": 30, '
                   '"p50_us": 900, "p90_us": 1500, "p95_us": 1800, "p99_us": 2500}\n')
    assert wrk.read_report(log) == {"throughput": 990.0, "p50_ms": 0.9, "p90_ms": 1.5, "p95_ms": 1.8,
                                    "p99_ms": 2.5, "queue_ms": None, "compute_ms": None, "errors": 30}
    log.write_text('MODELYARD-WRK {"requests": 10, "duration_us": 1000000, "errors": 10, "non_2xx": 0, '
                   '"p50_us": 0, "p90_us": 0, "p95_us": 0, "p99_us": 0}\n')
    with pytest.raises(perf_analyzer.LoadGeneratorError, match="10 of 10 requests failed"):
        wrk.read_report(log)


def _perf_analyzer_that_settles_at(tmp_path: Path, interval_ms: int, *, message: str = perf_analyzer.UNSTABLE,
                                   ) -> tuple[str, Path]:
    """A stand-in for perf_analyzer (real perf_analyzer cannot be made to miss its stability rule on demand):
    with windows shorter than ``interval_ms`` it fails as perf_analyzer 2.41 does, printing ``message``;
    with longer ones it writes the recorded CSV. Each run's window goes to the returned file."""
    calls = tmp_path / "windows.txt"
    script = tmp_path / "perf_analyzer"
    script.write_text(f"""#!{sys.executable}
import shutil, sys
args = sys.argv[1:]
window = int(args[args.index("--measurement-interval") + 1])
with open({str(calls)!r}, "a") as calls:
    calls.write(f"{{window}}\\n")
if window < {interval_ms}:
    print("Request concurrency: 4")
    print({message!r} + " within 10 measurement windows for concurrency 4.")
    sys.exit(2)
shutil.copyfile({str(DATA / "perf_analyzer_iris_c2.csv")!r}, args[args.index("-f") + 1])
""")
    script.chmod(0o755)
    return str(script), calls


def _measure(binary: str, tmp_path: Path, *, deadline_s: float = 60) -> dict:
    return perf_analyzer.measure(binary, inference_url="http://127.0.0.1:1", model="iris--profile-1", version=1,
                                 concurrency=4, measurement_interval_ms=1000, stability_percentage=10,
                                 max_trials=10, csv_path=tmp_path / "c4.csv", input_args=[],
                                 deadline=time.monotonic() + deadline_s, should_stop=lambda: None)


def test_a_level_that_does_not_stabilise_is_measured_again_with_windows_twice_as_long(tmp_path):
    binary, calls = _perf_analyzer_that_settles_at(tmp_path, 2000)
    row = _measure(binary, tmp_path)
    assert calls.read_text().split() == ["1000", "2000"]
    assert row["measurement_interval_ms"] == 2000 and row["throughput"] == 7087.19 and row["p99_ms"] == 0.54


def test_a_level_that_settles_at_once_is_measured_once_with_the_sweeps_window(tmp_path):
    binary, calls = _perf_analyzer_that_settles_at(tmp_path, 1000)
    assert _measure(binary, tmp_path)["measurement_interval_ms"] == 1000
    assert calls.read_text().split() == ["1000"]


def test_a_level_unstable_twice_is_an_error_after_one_second_run(tmp_path):
    binary, calls = _perf_analyzer_that_settles_at(tmp_path, 10**9)
    with pytest.raises(perf_analyzer.LoadGeneratorError,
                       match=r"Failed to obtain stable measurement.*measured again with 2000 ms windows"):
        _measure(binary, tmp_path)
    assert calls.read_text().split() == ["1000", "2000"]


def test_no_second_run_for_another_failure_or_past_the_profiles_deadline(tmp_path):
    binary, calls = _perf_analyzer_that_settles_at(tmp_path, 10**9, message="Failed to retrieve results")
    with pytest.raises(perf_analyzer.LoadGeneratorError, match="Failed to retrieve results"):
        _measure(binary, tmp_path)
    assert calls.read_text().split() == ["1000"]
    calls.unlink()
    binary, calls = _perf_analyzer_that_settles_at(tmp_path, 2000)
    with pytest.raises(perf_analyzer.LoadGeneratorError, match="stable"):
        _measure(binary, tmp_path, deadline_s=5)  # three 2 s windows no longer fit
    assert calls.read_text().split() == ["1000"]


def test_a_missing_load_generator_names_its_install_step():
    with pytest.raises(perf_analyzer.LoadGeneratorError, match="install_perf_analyzer.sh"):
        perf_analyzer.find_binary("/nowhere/perf_analyzer", "perf_analyzer")


# -- the API and the bookkeeping ----------------------------------------------------------------------


@pytest.fixture
def world(db):
    """iris v1 (a Triton version) in the default team, a maintainer's API client, and a host whose agent
    reported with protocol 3."""
    maintainer = team_member(get_user_model().objects.create_user(username="ml"), role="maintainer")
    model = RegisteredModel.objects.create(name="iris")
    version = ModelVersion.objects.create(model=model, version=1, format="triton", artifact_key="k",
                                          artifact_sha256="0" * 64, artifact_size=1, config_text=IRIS_CONFIG)
    host = ServingHost.objects.create(name="staging", inference_url="http://staging:8000",
                                      last_heartbeat_at=timezone.now(),
                                      heartbeat={"runtime_live": True, "agent": {"protocol": 3}})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(maintainer)}")
    return client, version, host


URL = "/api/v1/models/iris/versions/1/profiles/"


def test_a_profile_is_queued_with_its_checked_sweep_and_audited(world, django_capture_on_commit_callbacks):
    client, version, host = world
    with django_capture_on_commit_callbacks() as sent:
        answer = client.post(URL, {"host": "staging", "sweep": "quick", "slo_p99_ms": 20}, format="json")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["status"] == "queued" and body["progress"] == {"done": 0, "total": 8, "step": ""}
    assert len(sent) == 1  # the dispatch, once committed
    assert body["sweep"]["request"]["preset"] == "quick" and body["recommended"] is None
    from audit.models import AuditEvent

    assert AuditEvent.objects.get(action="profile.started").data["host"] == "staging"
    assert client.get(URL).json()["results"][0]["id"] == body["id"]


@pytest.mark.parametrize(("change", "status", "message"), [
    ({"heartbeat": {"runtime_live": True, "agent": {"protocol": 2}}}, 409, "speaks protocol 2"),
    ({"last_heartbeat_at": None}, 409, "never reported"),
    ({"runtime": "bentoml"}, 409, "cannot serve"),
])
def test_a_host_that_cannot_run_the_profile_is_refused(world, change, status, message):
    client, _, host = world
    ServingHost.objects.filter(pk=host.pk).update(**change)
    answer = client.post(URL, {"host": "staging"}, format="json")
    assert answer.status_code == status and message in answer.json()["detail"]
    assert not Profile.objects.exists()


def test_bad_input_is_a_400_that_writes_nothing(world):
    client, _, _ = world
    bad_sweep = client.post(URL, {"host": "staging", "sweep": {"concurrency": [0]}}, format="json")
    assert bad_sweep.status_code == 400 and "sweep: concurrency" in bad_sweep.json()["detail"]
    unknown = client.post(URL, {"host": "staging", "sweep": "quick", "warmup": 1}, format="json")
    assert unknown.status_code == 400
    assert client.post(URL, {"host": "nowhere"}, format="json").status_code == 404
    assert client.post("/api/v1/models/iris/versions/9/profiles/", {"host": "staging"},
                       format="json").status_code == 404
    assert not Profile.objects.exists()


def test_with_the_task_queue_down_a_profile_is_a_503_that_writes_nothing(world, queue_down):
    from audit.models import AuditEvent

    client, _, _ = world
    answer = client.post(URL, {"host": "staging", "sweep": "quick"}, format="json")
    assert answer.status_code == 503 and "the profile was not started" in answer.json()["detail"]
    assert not Profile.objects.exists() and not AuditEvent.objects.filter(action="profile.started").exists()


def test_one_profile_at_a_time_runs_on_a_host(world):
    client, _, _ = world
    first = client.post(URL, {"host": "staging"}, format="json")
    second = client.post(URL, {"host": "staging"}, format="json")
    assert first.status_code == 202 and second.status_code == 409
    assert f"profile {first.json()['id']}" in second.json()["detail"]


def test_a_viewer_may_read_profiles_but_not_start_them_and_other_teams_see_none(world):
    client, version, host = world
    viewer = team_member(get_user_model().objects.create_user(username="viewer"), role="viewer")
    viewing = APIClient()
    viewing.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(viewer)}")
    assert viewing.post(URL, {"host": "staging"}, format="json").status_code == 403
    Profile.objects.create(version=version, host=host, sweep=parse_sweep("quick", max_batch_size=8).as_dict())
    assert viewing.get("/api/v1/profiles/").json()["results"][0]["model"] == "iris"
    outsider = team_member(get_user_model().objects.create_user(username="other"), team=create_team(name="other"))
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(outsider)}")
    assert other.get("/api/v1/profiles/").json()["results"] == []
    assert other.get(URL).status_code == 404


def test_a_queued_profile_is_cancelled_at_once_and_a_late_report_does_not_revive_it(world):
    client, _, _ = world
    profile_id = client.post(URL, {"host": "staging"}, format="json").json()["id"]
    cancelled = client.post(f"/api/v1/profiles/{profile_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert not record_profile_report(profile_id, {"status": "running", "rows": [], "step": "config 1 of 4"})
    assert Profile.objects.get(pk=profile_id).status == JobStatus.CANCELLED
    assert client.post(f"/api/v1/profiles/{profile_id}/cancel/").status_code == 409


def test_reports_fill_rows_and_progress_and_the_result_ends_the_profile(world):
    client, version, host = world
    profile = Profile.objects.create(version=version, host=host, sweep=CARD["sweep"], slo_p99_ms=CARD["slo_p99_ms"])
    assert record_profile_report(profile.pk, {"status": "running", "rows": CARD["rows"][:3], "step": "config 2 of 4"})
    body = client.get(f"/api/v1/profiles/{profile.pk}/").json()
    assert body["status"] == "running" and body["progress"] == {"done": 3, "total": 8, "step": "config 2 of 4"}
    assert record_profile_report(profile.pk, {"status": "succeeded", "rows": CARD["rows"], "details": {"seconds": 60}})
    body = client.get(f"/api/v1/profiles/{profile.pk}/").json()
    assert body["status"] == "succeeded" and body["finished_at"] and len(body["rows"]) == 8
    best = recommend(CARD["rows"], CARD["slo_p99_ms"])
    assert body["recommended"]["config"]["key"] == best["config"]["key"]
    assert body["recommended"]["config_overrides"] == recommended_overrides(version)
    assert not record_profile_report(profile.pk, {"status": "failed", "rows": []})  # ended: ignored


def test_a_profile_whose_agent_stopped_reporting_is_failed_after_its_budget(world):
    _, version, host = world
    sweep = parse_sweep("quick", max_batch_size=8).as_dict()
    stale = Profile.objects.create(version=version, host=host, sweep=sweep, status=JobStatus.RUNNING)
    fresh = Profile.objects.create(version=version, host=ServingHost.objects.create(
        name="other", inference_url="http://other:8000"), sweep=sweep)
    Profile.objects.filter(pk=stale.pk).update(updated_at=timezone.now() - timedelta(seconds=301 + 300))
    assert fail_stalled_profiles() == [stale.pk]
    stale.refresh_from_db()
    assert stale.status == JobStatus.FAILED and "sent no report" in stale.message
    assert Profile.objects.get(pk=fresh.pk).status == JobStatus.QUEUED


# -- where the card's figures are used ----------------------------------------------------------------


def _card(version, host, rows, slo=None):
    return Profile.objects.create(version=version, host=host, sweep=CARD["sweep"], rows=rows, slo_p99_ms=slo,
                                  status=JobStatus.SUCCEEDED, finished_at=timezone.now())


def test_placement_takes_the_cards_gpu_memory_before_any_load_measured_one(world):
    _, version, host = world
    assert measured_footprint(version) is None
    _card(version, host, [_row("i1-nobatch", 1, 900, 2.0, memory_bytes=700_000_000, memory_kind="gpu"),
                          _row("i2-nobatch", 4, 1800, 3.0, instances=2, memory_bytes=1_400_000_000,
                               memory_kind="gpu")], slo=5)
    assert measured_footprint(version) == 1_400_000_000  # the recommended config's
    cpu_only = ModelVersion.objects.create(model=version.model, version=2, format="triton", artifact_key="k2",
                                           artifact_sha256="1" * 64, artifact_size=1, config_text=IRIS_CONFIG)
    _card(cpu_only, host, [_row("i1-nobatch", 1, 900, 2.0, memory_bytes=30_000_000, memory_kind="cpu")])
    assert measured_footprint(cpu_only) is None  # host memory is no GPU footprint


def test_autoscale_bounds_default_from_the_card(world):
    _, version, host = world
    limits = {"queue_ms_high": 20, "queue_ms_low": 2}
    with pytest.raises(Exception, match="no performance card"):
        check_autoscale(limits, version=version)
    _card(version, host, [_row("i1-nobatch", 4, 1000, 4.0), _row("i2-nobatch", 4, 2000, 6.0, instances=2),
                          _row("i4-nobatch", 4, 2100, 9.0, instances=4), _row("i8-nobatch", 4, 2200, 40.0,
                                                                              instances=8)], slo=10)
    assert card_instance_bounds(version) == (4, 4)
    assert check_autoscale(limits, version=version) == {"min_instances": 4, "max_instances": 4, **limits}
    given = {"min_instances": 1, "max_instances": 3, **limits}
    assert check_autoscale(given, version=version) == given  # explicit bounds win


def test_a_rollout_asks_for_the_recommended_config(world):
    client, version, host = world
    answer = client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["staging"],
                                                  "config": "recommended"}, format="json")
    assert answer.status_code == 400 and "no performance card" in answer.json()["detail"]
    _card(version, host, [_row("i2-db8-q100", 4, 2000, 3.0, instances=2) | {"config": {
        "key": "i2-db8-q100", "instance_count": 2, "dynamic_batching": True, "max_batch_size": 8,
        "max_queue_delay_us": 100}}], slo=5)
    both = client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["staging"],
                                                "config": "recommended", "config_overrides": {"max_batch_size": 4}},
                       format="json")
    assert both.status_code == 400 and "not both" in both.json()["detail"]
    answer = client.post("/api/v1/deployments/", {"model": "iris", "version": 1, "hosts": ["staging"],
                                                  "config": "recommended"}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["config_overrides"] == {
        "instance_group": [{"kind": "KIND_CPU", "count": 2}], "max_batch_size": 8,
        "dynamic_batching": {"max_queue_delay_microseconds": "100"}}


def test_no_model_may_take_the_name_a_profile_copy_is_loaded_under(world):
    client, _, _ = world
    answer = client.post("/api/v1/models/", {"name": "iris--profile-3"}, format="json")
    assert answer.status_code == 400 and "--profile-" in json.dumps(answer.json())
    assert client.post("/api/v1/models/", {"name": "iris-profile-3"}, format="json").status_code == 201
