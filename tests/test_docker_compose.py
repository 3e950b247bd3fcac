"""Static checks of docker-compose.yml, its Dockerfile and the Prometheus configs it mounts.

Docker cannot run on CI machines, so these read the files: every reference resolves,
every image is pinned, every app process gets its settings, and the serving host's
pieces (GPU, shared model repository, scrape targets) fit together.
"""

import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO_DIR = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_DIR / "docker-compose.yml"
DOCKERFILE = REPO_DIR / "Dockerfile"
LOCAL_PROMETHEUS_TEMPLATE = REPO_DIR / "deploy" / "prometheus" / "prometheus.local.yml.tmpl"

APP_SERVICES = ("web", "orchestrator", "beat", "migrate")
AGENT_ENV = ("CELERY_BROKER_URL", "MODELYARD_SECRET_KEY", "MODELYARD_AGENT_MODEL_REPOSITORY")
AGENT_FORBIDDEN_ENV = ("DATABASE_URL", "MODELYARD_S3_SECRET_ACCESS_KEY", "MODELYARD_S3_ACCESS_KEY_ID")
REQUIRED_APP_ENV = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "MODELYARD_SECRET_KEY",
    "MODELYARD_DEBUG",
    "MODELYARD_ALLOWED_HOSTS",
    "MODELYARD_S3_ENDPOINT_URL",
    "MODELYARD_S3_BUCKET",
    "MODELYARD_S3_ACCESS_KEY_ID",
    "MODELYARD_S3_SECRET_ACCESS_KEY",
    "MODELYARD_PROMETHEUS_URL",
)
DEPENDENCY_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def depends_on(service: dict) -> dict[str, dict]:
    """Return a service's dependencies as {name: {"condition": ...}} from either syntax."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: {"condition": "service_started"} for name in deps}
    return deps


def environment(service: dict) -> dict[str, str]:
    """Return a service's environment as a dict from either the map or the list syntax."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def mounts(service: dict) -> list[tuple[str, str]]:
    """Return (source, target) for each volume of a service, short or long syntax."""
    result = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            result.append((str(volume.get("source", "")), str(volume["target"])))
        else:
            parts = volume.split(":")
            if len(parts) == 1:
                result.append(("", parts[0]))  # anonymous volume
            else:
                result.append((parts[0], parts[1]))
    return result


def is_named_volume(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~", "$"))


def image_is_pinned(image: str) -> bool:
    """True for ``name:tag`` with a tag other than ``latest``, or ``name@sha256:...``."""
    if "@sha256:" in image:
        return True
    last_segment = image.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return False
    tag = last_segment.rsplit(":", 1)[1]
    return bool(tag) and tag != "latest" and "$" not in tag


def command_args(service: dict) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def mounted_prometheus_config(services: dict) -> Path:
    for source, target in mounts(services["prometheus"]):
        if target == "/etc/prometheus/prometheus.yml":
            return REPO_DIR / source
    raise AssertionError("prometheus mounts no /etc/prometheus/prometheus.yml")


def scrape_targets(config: dict) -> dict[str, list[str]]:
    """Return {job_name: [static target, ...]} of a Prometheus config."""
    jobs = {}
    for job in config.get("scrape_configs") or []:
        targets = [t for static in job.get("static_configs") or [] for t in static.get("targets") or []]
        jobs[job["job_name"]] = targets
    return jobs


def test_every_depends_on_target_is_a_defined_service(services):
    for name, service in services.items():
        for dependency, spec in depends_on(service).items():
            assert dependency in services, f"{name} depends on undefined service {dependency}"
            assert spec.get("condition", "service_started") in DEPENDENCY_CONDITIONS, (name, dependency)


def test_every_service_healthy_dependency_has_a_healthcheck(services):
    for name, service in services.items():
        for dependency, spec in depends_on(service).items():
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], (
                    f"{name} waits for {dependency} to be healthy, but {dependency} has no healthcheck"
                )


def test_every_long_running_service_has_a_healthcheck_or_is_beat(services):
    for name, service in services.items():
        one_shot = service.get("restart") == "no"
        if not one_shot and name != "beat":
            assert "healthcheck" in service, f"{name} has no healthcheck"


def test_every_named_volume_used_is_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for source, _target in mounts(service):
            if is_named_volume(source):
                assert source in declared, f"{name} mounts undeclared volume {source}"


def test_every_network_used_is_declared(compose, services):
    declared = set(compose.get("networks") or {}) | {"default"}
    for name, service in services.items():
        networks = service.get("networks") or []
        for network in networks if isinstance(networks, list) else networks.keys():
            assert network in declared, f"{name} joins undeclared network {network}"


def test_every_bind_mounted_file_exists_in_the_repository(services):
    for name, service in services.items():
        for source, _target in mounts(service):
            if source.startswith("./"):
                assert (REPO_DIR / source).exists(), f"{name} mounts {source}, which is not in the repository"


def test_every_image_is_pinned_to_a_tag_other_than_latest_or_a_digest(services):
    for name, service in services.items():
        if "build" in service:
            continue  # built here; its base images are checked in the Dockerfile test
        assert "image" in service, f"{name} has neither an image nor a build"
        assert image_is_pinned(service["image"]), f"{name} uses an unpinned image {service['image']}"


def test_the_app_image_is_built_from_a_pinned_python_slim_base():
    bases = re.findall(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert bases, "Dockerfile has no FROM line"
    for base in bases:
        assert image_is_pinned(base), f"Dockerfile base image {base} is not pinned"
    assert bases[-1].startswith("python:3.11"), bases[-1]
    assert "slim" in bases[-1], bases[-1]


def test_the_image_pinning_check_refuses_latest_and_untagged_images():
    assert image_is_pinned("nvcr.io/nvidia/tritonserver:24.10-py3")
    assert image_is_pinned("localhost:5000/app@sha256:" + "0" * 64)
    assert not image_is_pinned("redis")
    assert not image_is_pinned("redis:latest")
    assert not image_is_pinned("localhost:5000/app")


@pytest.mark.parametrize("service_name", APP_SERVICES)
def test_every_app_process_sets_each_required_setting(services, service_name):
    env = environment(services[service_name])
    missing = [name for name in REQUIRED_APP_ENV if not env.get(name)]
    assert not missing, f"{service_name} does not set {', '.join(missing)}"
    assert env["MODELYARD_DEBUG"].lower() == "false"


@pytest.mark.parametrize("service_name", APP_SERVICES)
def test_every_app_process_takes_its_secrets_from_the_environment_not_the_file(services, service_name):
    env = environment(services[service_name])
    for name in ("MODELYARD_SECRET_KEY", "MODELYARD_S3_SECRET_ACCESS_KEY"):
        assert env[name].startswith("${") and ":?" in env[name], f"{service_name} hard-codes {name}"
    assert "${POSTGRES_PASSWORD:?" in env["DATABASE_URL"]


def test_the_triton_service_reserves_an_nvidia_gpu(services):
    devices = services["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), devices


def test_triton_runs_with_explicit_model_control(services):
    assert "--model-control-mode=explicit" in command_args(services["triton"])


def test_the_agent_stages_into_the_model_repository_that_triton_serves(services):
    agent, triton = services["agent"], services["triton"]
    agent_repo = environment(agent)["MODELYARD_AGENT_MODEL_REPOSITORY"]
    agent_volume = {target: source for source, target in mounts(agent)}.get(agent_repo)
    assert is_named_volume(agent_volume or ""), f"the agent's {agent_repo} is not a named volume"

    repo_args = [arg.split("=", 1)[1] for arg in command_args(triton) if arg.startswith("--model-repository=")]
    assert len(repo_args) == 1, command_args(triton)
    triton_volume = {target: source for source, target in mounts(triton)}.get(repo_args[0])
    assert triton_volume == agent_volume, (agent_volume, triton_volume)


def test_the_agent_consumes_its_serving_hosts_queue_and_waits_for_triton(services):
    args = command_args(services["agent"])
    assert args[args.index("-Q") + 1].startswith("host."), args
    assert depends_on(services["agent"])["triton"]["condition"] == "service_healthy"


def test_the_mounted_prometheus_config_exists_and_scrapes_triton_and_the_web_app(services):
    config_path = mounted_prometheus_config(services)
    assert config_path.is_file(), f"{config_path} is not in the repository"
    jobs = scrape_targets(yaml.safe_load(config_path.read_text()))
    assert "triton:8002" in jobs.get("triton", []), jobs
    assert any(t.startswith("web:") for t in jobs.get("modelyard", [])), jobs


def test_the_local_prometheus_template_renders_to_a_config_with_the_same_jobs():
    rendered = LOCAL_PROMETHEUS_TEMPLATE.read_text()
    for name, value in {
        "MODELYARD_TRITON_METRICS_PORT": "8002",
        "MODELYARD_WEB_PORT": "8080",
        "MODELYARD_PROMETHEUS_PORT": "9090",
    }.items():
        rendered = rendered.replace("${" + name + "}", value)
    assert "${" not in rendered
    jobs = scrape_targets(yaml.safe_load(rendered))
    assert jobs["triton"] == ["127.0.0.1:8002"]
    assert jobs["modelyard"] == ["127.0.0.1:8080"]


def test_the_host_agent_gets_its_settings_but_no_database_or_s3_credentials(services):
    env = environment(services["agent"])
    for name in AGENT_ENV:
        assert env.get(name), f"agent lacks {name}"
    for name in AGENT_FORBIDDEN_ENV:
        assert name not in env, f"agent must not receive {name}"
