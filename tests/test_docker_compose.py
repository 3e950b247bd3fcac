"""Static checks of docker-compose.yml, its Dockerfile and the Prometheus and Grafana files it mounts.

Docker cannot run on CI machines, so these read the files: every reference resolves,
every image is pinned, every app process gets its settings, and the serving host's
pieces (GPU, shared model repository, scrape targets) fit together. The Prometheus
configs and every dashboard query also go through promtool.
"""

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from django.urls import resolve

REPO_DIR = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_DIR / "docker-compose.yml"
DOCKERFILE = REPO_DIR / "Dockerfile"
LOCAL_PROMETHEUS_TEMPLATE = REPO_DIR / "deploy" / "prometheus" / "prometheus.local.yml.tmpl"
STACK_SCRIPT = REPO_DIR / "scripts" / "stack.sh"
SD_PATH = "/api/v1/prometheus/targets/"
GRAFANA_IMAGE = "grafana/grafana:11.2.2"
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
# Every series the web app exports on /metrics (monitoring/exporter.py); the dashboard shows each.
APP_SERIES = (
    "modelyard_registered_models",
    "modelyard_model_versions",
    "modelyard_deployments_total",
    "modelyard_deployment_targets",
    "modelyard_target_step_duration_seconds",
    "modelyard_celery_queue_length",
    "modelyard_celery_broker_up",
)
# Triton series the dashboard must chart (the product's model and host pages).
TRITON_SERIES = (
    "nv_inference_count",
    "nv_inference_request_summary_us",
    "nv_inference_request_failure",
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_pending_request_count",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_utilization",
)

APP_SERVICES = ("web", "orchestrator", "beat", "migrate")
AGENT_ENV = ("CELERY_BROKER_URL", "MODELYARD_AGENT_MODEL_REPOSITORY")
# The agent needs no Django secret key either: it loads no Django settings.
AGENT_FORBIDDEN_ENV = ("DATABASE_URL", "MODELYARD_S3_SECRET_ACCESS_KEY", "MODELYARD_S3_ACCESS_KEY_ID",
                       "MODELYARD_SECRET_KEY", "DJANGO_SETTINGS_MODULE")
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


def job(config: dict, name: str) -> dict:
    for scrape_config in config.get("scrape_configs") or []:
        if scrape_config["job_name"] == name:
            return scrape_config
    raise AssertionError(f"no scrape job {name!r} in {[j['job_name'] for j in config.get('scrape_configs') or []]}")


def check_serving_hosts_job(config: dict, web_address: str) -> dict:
    """Assert the config discovers serving hosts from the web app; return its http_sd config."""
    serving = job(config, "serving-hosts")
    assert not serving.get("static_configs"), "serving hosts must come from service discovery, not a static list"
    (sd,) = serving["http_sd_configs"]
    url = urlsplit(sd["url"])
    assert url.netloc == web_address and url.path == SD_PATH, sd["url"]
    assert resolve(url.path).func.view_class.__name__ == "ScrapeTargetsView"
    assert sd["refresh_interval"] == "15s"
    assert sd["authorization"]["type"] == "Token", "DRF token authentication expects 'Token <key>'"
    assert sd["authorization"]["credentials_file"].startswith("/"), sd["authorization"]
    for name, scrape_config in scrape_targets(config).items():
        assert not any(t.endswith(":8002") for t in scrape_config), f"job {name} still scrapes Triton statically"
    app = job(config, "modelyard")
    assert resolve(app["metrics_path"]).url_name == "metrics"
    assert scrape_targets(config)["modelyard"] == [web_address]
    return sd


def render_local_template(**values: str) -> str:
    """Render the local Prometheus template as scripts/stack.sh does: only the names it lists."""
    match = re.search(r"^\s*local names='([^']*)'", STACK_SCRIPT.read_text(), flags=re.MULTILINE)
    assert match, "scripts/stack.sh no longer lists the template's variable names"
    names = re.findall(r"\$\{(\w+)\}", match.group(1))
    assert sorted(names) == sorted(values), names
    rendered = LOCAL_PROMETHEUS_TEMPLATE.read_text()
    for name in names:
        rendered = rendered.replace("${" + name + "}", values[name])
    assert "${" not in rendered, "the template uses a variable scripts/stack.sh does not substitute"
    return rendered


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed (it comes with prometheus): run 'make install'")
    return binary


def grafana_mount_sources(services: dict) -> dict[str, Path]:
    """Return {container path: repository path} of the grafana service's bind mounts."""
    return {target: REPO_DIR / source for source, target in mounts(services["grafana"]) if source.startswith("./")}


def provisioning_files(services: dict, kind: str) -> list[dict]:
    """Parse every YAML file mounted into Grafana's provisioning/<kind> directory."""
    source = grafana_mount_sources(services).get(f"{GRAFANA_PROVISIONING}/{kind}")
    assert source is not None and source.is_dir(), f"grafana mounts no {GRAFANA_PROVISIONING}/{kind} directory"
    files = sorted(source.glob("*.yml")) + sorted(source.glob("*.yaml"))
    assert files, f"{source} holds no provisioning file"
    parsed = [yaml.safe_load(path.read_text()) for path in files]
    for path, document in zip(files, parsed, strict=True):
        assert isinstance(document, dict) and document.get("apiVersion") == 1, path
    return parsed


def dashboards(services: dict) -> list[tuple[Path, dict]]:
    """Every dashboard JSON file the provisioned dashboard providers load, parsed."""
    sources = grafana_mount_sources(services)
    found = []
    for provisioning in provisioning_files(services, "dashboards"):
        for provider in provisioning["providers"]:
            assert provider["type"] == "file", provider
            directory = sources.get(provider["options"]["path"])
            assert directory is not None, f"no mount provides the dashboards path {provider['options']['path']}"
            found += [(path, json.loads(path.read_text())) for path in sorted(directory.glob("*.json"))]
    assert found, "no dashboard is provisioned"
    return found


def dashboard_panels(dashboard: dict) -> list[dict]:
    """The dashboard's panels, those inside rows included, rows themselves left out."""
    result = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            result += panel.get("panels") or []
        else:
            result.append(panel)
    return result


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
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert stages, "Dockerfile has no FROM line"
    named = {name for _, name in stages if name}
    images = [image for image, _ in stages if image not in named]  # a stage built on an earlier one
    for image in images:
        assert image_is_pinned(image), f"Dockerfile base image {image} is not pinned"
    assert images == [stages[0][0]] and images[0].startswith("python:3.11") and "slim" in images[0], stages
    assert stages[-1][1] == "app", "the last stage (the default target) is the application"


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


def _volume_and_path(service: dict, path: str) -> tuple[str, str]:
    """The named volume under ``path`` in ``service`` and the path inside that volume."""
    for source, target in mounts(service):
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source, path[len(target):].strip("/")
    return "", path


def test_the_agent_stages_into_the_model_repository_that_triton_serves_on_the_same_volume(services):
    from modelyard_agent.config import default_staging_dir

    agent, triton = services["agent"], services["triton"]
    agent_repo = environment(agent)["MODELYARD_AGENT_MODEL_REPOSITORY"]
    agent_volume, inside = _volume_and_path(agent, agent_repo)
    assert is_named_volume(agent_volume), f"the agent's {agent_repo} is not on a named volume"

    repo_args = [arg.split("=", 1)[1] for arg in command_args(triton) if arg.startswith("--model-repository=")]
    assert len(repo_args) == 1, command_args(triton)
    assert _volume_and_path(triton, repo_args[0]) == (agent_volume, inside)
    # Staging renames version directories into the repository: the staging directory must be on that volume too.
    staging = str(default_staging_dir(Path(agent_repo)))  # an absolute path: the same on any machine
    assert _volume_and_path(agent, staging)[0] == agent_volume, staging
    init = " ".join(command_args(services["model-repository-init"]))
    assert f"mkdir -p {repo_args[0]}" in init and "chown 10001:10001" in init


def test_the_agent_is_the_agent_package_alone_started_with_modelyard_agent_and_waits_for_triton(services):
    agent = services["agent"]
    assert agent["build"]["target"] == "agent", agent["build"]
    stage = DOCKERFILE.read_text().split("FROM base AS agent", 1)[1].split("\nFROM ", 1)[0]
    installs = re.findall(r"pip install (.+?)(?: \\|$)", stage, flags=re.MULTILINE)
    assert installs == ["./modelyard_agent"], installs  # not requirements.txt: no Django, boto3 or psycopg
    assert 'ENTRYPOINT ["modelyard-agent"]' in stage
    args = command_args(agent)
    assert args[args.index("--host") + 1] == "gpu-0" and args[args.index("--runtime") + 1] == "triton", args
    assert depends_on(agent)["triton"]["condition"] == "service_healthy"


def test_the_mounted_prometheus_config_discovers_serving_hosts_from_the_web_app_and_scrapes_it(compose, services):
    config_path = mounted_prometheus_config(services)
    assert config_path.is_file(), f"{config_path} is not in the repository"
    sd = check_serving_hosts_job(yaml.safe_load(config_path.read_text()), "web:8080")

    secret_path = Path(sd["authorization"]["credentials_file"])
    assert secret_path.parent == Path("/run/secrets"), "the API token is a compose secret"
    assert secret_path.name in (services["prometheus"].get("secrets") or []), "prometheus does not get the secret"
    assert secret_path.name in (compose.get("secrets") or {}), f"secret {secret_path.name} is not declared"
    assert depends_on(services["prometheus"])["web"]["condition"] == "service_healthy"


def test_the_prometheus_api_token_secret_comes_from_the_environment_and_is_given_to_an_api_user(compose, services):
    (secret_name,) = compose["secrets"]
    assert compose["secrets"][secret_name] == {"environment": "MODELYARD_PROMETHEUS_API_TOKEN"}
    one_shot = services["prometheus-api-token"]
    assert one_shot["restart"] == "no" and secret_name in one_shot["secrets"]
    assert depends_on(one_shot)["migrate"]["condition"] == "service_completed_successfully"
    assert depends_on(services["prometheus"])["prometheus-api-token"]["condition"] == "service_completed_successfully"
    env = environment(one_shot)
    assert env["DATABASE_URL"] and env["MODELYARD_SECRET_KEY"]


@pytest.mark.django_db
def test_the_api_token_one_shot_gives_the_prometheus_user_exactly_the_secret_and_can_run_again(services, tmp_path):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from accounts.models import ApiToken
    from accounts.tokens import TokenRejected, authenticate_token, token_digest

    args = command_args(services["prometheus-api-token"])
    assert args[:4] == ["python", "manage.py", "shell", "-c"], args
    script = args[4]
    assert script.count("/run/secrets/prometheus_api_token") == 1
    secret = tmp_path / "prometheus_api_token"

    def run(key: str) -> None:
        secret.write_text(key + "\n")
        call_command("shell", command=script.replace("/run/secrets/prometheus_api_token", str(secret)))

    first, second = "my_0123456789ab_" + "a" * 64, "my_ba9876543210_" + "b" * 64
    run(first)
    run(first)
    user = get_user_model().objects.get(username="prometheus")
    assert authenticate_token(first).user == user and authenticate_token(first).scopes == ["read"]
    assert list(ApiToken.objects.filter(user=user).values_list("digest", flat=True)) == [token_digest(first)]
    assert not user.has_usable_password() and not user.is_staff and not user.is_superuser
    run(second)
    assert authenticate_token(second).user == user
    with pytest.raises(TokenRejected, match="revoked"):
        authenticate_token(first)
    with pytest.raises(SystemExit, match="my_<prefix>_<secret>"):
        run("a" * 40)


def test_the_local_prometheus_template_renders_to_a_config_that_discovers_serving_hosts():
    rendered = render_local_template(
        MODELYARD_WEB_PORT="8080", MODELYARD_PROMETHEUS_PORT="9090", MODELYARD_API_TOKEN_FILE="/srv/my yard/admin.token"
    )
    config = yaml.safe_load(rendered)
    sd = check_serving_hosts_job(config, "127.0.0.1:8080")
    assert sd["authorization"]["credentials_file"] == "/srv/my yard/admin.token"
    assert config["global"]["scrape_interval"] == "5s"
    assert job(config, "serving-hosts").get("scrape_interval", "5s") == "5s"
    assert scrape_targets(config)["prometheus"] == ["127.0.0.1:9090"]


def test_promtool_accepts_both_shipped_prometheus_configs(services, tmp_path):
    token_file = tmp_path / "admin.token"
    token_file.write_text("0" * 40 + "\n")
    local = tmp_path / "prometheus.local.yml"
    local.write_text(render_local_template(
        MODELYARD_WEB_PORT="8080", MODELYARD_PROMETHEUS_PORT="9090", MODELYARD_API_TOKEN_FILE=str(token_file)
    ))
    for config in (local, mounted_prometheus_config(services)):
        result = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, f"{config}: {result.stdout}{result.stderr}"


def test_grafana_is_pinned_protected_and_reaches_prometheus(services):
    grafana = services["grafana"]
    assert grafana["image"] == GRAFANA_IMAGE
    assert environment(grafana)["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert depends_on(grafana)["prometheus"]["condition"] == "service_healthy"
    assert set(grafana["networks"]) & set(services["prometheus"]["networks"]), "grafana cannot reach prometheus"
    for source, target in mounts(grafana):
        if target.startswith(("/etc/grafana/provisioning", "/etc/grafana/dashboards")):
            assert source.startswith("./deploy/grafana/"), (source, target)


def test_the_provisioned_datasource_is_the_compose_prometheus(services):
    (provisioning,) = provisioning_files(services, "datasources")
    (datasource,) = provisioning["datasources"]
    assert datasource["type"] == "prometheus" and datasource["uid"]
    url = urlsplit(datasource["url"])
    assert url.hostname == "prometheus" and url.port == 9090, datasource["url"]
    assert "prometheus" in services


def test_every_provisioned_dashboard_panel_has_a_datasource_a_unit_and_a_query(services):
    (provisioning,) = provisioning_files(services, "datasources")
    uids = {datasource["uid"] for datasource in provisioning["datasources"]}
    for path, dashboard in dashboards(services):
        panels = dashboard_panels(dashboard)
        assert panels, path
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), f"{path}: duplicate panel ids"
        for panel in panels:
            where = f"{path.name}: panel {panel.get('title')!r}"
            assert panel.get("datasource", {}).get("uid") in uids, where
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
            assert panel.get("targets"), f"{where} has no query"
            for target in panel["targets"]:
                assert target.get("expr", "").strip(), f"{where} has an empty query"
                assert target.get("datasource", panel["datasource"])["uid"] in uids, where
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert {"host", "model"} <= set(variables), variables.keys()
        for variable in variables.values():
            assert variable["datasource"]["uid"] in uids, variable["name"]


def test_the_dashboard_charts_the_serving_metrics_and_every_series_the_app_exports(services):
    expressions = " ".join(
        target["expr"] for _path, dashboard in dashboards(services)
        for panel in dashboard_panels(dashboard) for target in panel["targets"]
    )
    for series in TRITON_SERIES + APP_SERIES:
        assert re.search(rf"\b{series}", expressions), f"no panel charts {series}"
    for quantile in ("0.5", "0.95", "0.99"):
        assert f'quantile="{quantile}"' in expressions
    assert "sum by (model, version)(rate(nv_inference_count" in expressions


def test_every_dashboard_query_is_valid_promql(services, tmp_path):
    rules = []
    for path, dashboard in dashboards(services):
        for panel in dashboard_panels(dashboard):
            for target in panel["targets"]:
                expr = target["expr"]
                for variable, value in (("$__rate_interval", "1m"), ("$__range", "1h"), ("$host", ".*"),
                                        ("$model", ".*")):
                    expr = expr.replace(variable, value)
                assert "$" not in expr, f"{path.name}: unknown variable in {target['expr']}"
                rules.append({"record": f"dashboard:panel_{panel['id']}_{target['refId']}", "expr": expr})
    rules_file = tmp_path / "dashboard-rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_host_agent_gets_its_settings_but_no_database_or_s3_credentials(services):
    env = environment(services["agent"])
    for name in AGENT_ENV:
        assert env.get(name), f"agent lacks {name}"
    for name in AGENT_FORBIDDEN_ENV:
        assert name not in env, f"agent must not receive {name}"


def test_try_it_goes_through_the_agent_because_the_web_tier_cannot_reach_the_serving_network(services):
    """The route tests/deployments/test_try_it.py runs as ``agent`` against a real agent and Triton."""
    assert environment(services["web"])["MODELYARD_TRY_IT_ROUTE"] == "agent"
    assert "serving" not in services["web"]["networks"] and "serving" in services["triton"]["networks"]
    assert "control" in services["agent"]["networks"] and "serving" in services["agent"]["networks"]


def test_the_orchestrator_runs_two_replicas_and_beat_and_the_agent_one(services):
    assert services["orchestrator"]["deploy"]["replicas"] == 2
    assert "%h" in " ".join(services["orchestrator"]["command"])  # each replica its own Celery node name
    for single in ("beat", "agent", "web"):  # one beat; one agent per host; web publishes one host port
        assert services[single].get("deploy", {}).get("replicas", 1) == 1, single
