"""The host agent is a package of its own: it imports without Django, boto3 or a database driver,
its settings are checked, and it refuses payloads of a protocol newer than its own."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard_agent import contract
from modelyard_agent.config import AgentConfig, ConfigError

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("django", "rest_framework", "boto3", "botocore", "psycopg", "psycopg2")

# Runs in a fresh interpreter: every blocked name in sys.modules set to None makes importing it
# raise ImportError, then every module of the agent package is imported.
_IMPORT_ALL = f"""
import importlib, pkgutil, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None
import modelyard_agent
names = sorted(m.name for m in pkgutil.walk_packages(modelyard_agent.__path__, "modelyard_agent."))
for name in names:
    importlib.import_module(name)
loaded = sorted(n for n in sys.modules if n.split(".")[0] in {{"registry", "deployments", "accounts",
                "monitoring", "promotions", "modelyard"}})
print(len(names), loaded)
"""


def test_every_agent_module_imports_with_django_boto3_and_psycopg_blocked():
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, loaded = done.stdout.split(" ", 1)
    assert int(count) >= 20 and loaded.strip() == "[]", done.stdout


def test_the_block_is_real_an_agent_that_imported_django_would_fail():
    script = _IMPORT_ALL.replace("import modelyard_agent\n", "import modelyard_agent\nimport django\n", 1)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "import of django halted; None in sys.modules" in done.stderr, done.stderr


def test_settings_come_from_flags_then_the_environment_then_defaults():
    config = AgentConfig.from_values({"host": "gpu-0", "load_deadline": "30"},
                                     {"MODELYARD_AGENT_LOAD_TIMEOUT": "99", "MODELYARD_AGENT_UNLOAD_TIMEOUT": "45",
                                      "MODELYARD_AGENT_LABELS": '{"zone": "a"}'})
    assert (config.host, config.load_deadline, config.unload_deadline) == ("gpu-0", 30.0, 45.0)
    assert config.labels == {"zone": "a"} and config.runtime == "triton" and config.concurrency == 4
    assert AgentConfig.from_values({}, config.as_environ()) == config
    gateway = AgentConfig.from_values({"host": "gpu-0", "triton_url": "http://127.0.0.1:8000",
                                       "triton_grpc_url": "127.0.0.1:8001", "gateway_grpc_listen": "0.0.0.0:8011"}, {})
    assert gateway.gateway_grpc_listen == "0.0.0.0:8011"
    assert AgentConfig.from_values({}, gateway.as_environ()) == gateway
    listening = AgentConfig.from_values({"host": "gpu-0", "triton_url": "http://127.0.0.1:8000"},
                                        {"MODELYARD_AGENT_GATEWAY_LISTEN": "10.0.0.5:08080"})
    assert listening.gateway_listen == "10.0.0.5:8080"
    assert AgentConfig.from_values({}, listening.as_environ()) == listening


def test_the_nginx_keepalive_and_the_log_level_are_settings_like_the_others():
    config = AgentConfig.from_values({"host": "gpu-0", "loglevel": "debug"}, {"MODELYARD_AGENT_NGINX_KEEPALIVE": "0"})
    assert (config.loglevel, config.nginx_keepalive) == ("DEBUG", 0.0)
    assert AgentConfig.from_values({}, config.as_environ()) == config
    unset = AgentConfig.from_values({"host": "gpu-0"}, {})
    assert (unset.loglevel, unset.nginx_keepalive) == ("INFO", None)
    assert AgentConfig.from_values({}, unset.as_environ()) == unset


def test_a_bentoml_hosts_nginx_keeps_clients_alive_as_long_as_its_setting_says(agent_settings, monkeypatch, tmp_path):
    from modelyard_agent.bentoml_instances import DEFAULT_KEEPALIVE, front_for
    from modelyard_agent.runtimes.routes import lua_available

    url = "http://127.0.0.1:8100"
    monkeypatch.delenv("MODELYARD_AGENT_NGINX_KEEPALIVE", raising=False)
    agent_settings()
    assert front_for(tmp_path, url).client_keepalive == (DEFAULT_KEEPALIVE if lua_available() else 0)
    agent_settings(nginx_keepalive=5)
    assert front_for(tmp_path, url).client_keepalive == 5
    assert front_for(tmp_path, url, client_keepalive=0.0).client_keepalive == 0


@pytest.mark.parametrize("values,says", [
    ({}, "--host (MODELYARD_AGENT_HOST) is required"),
    ({"host": ""}, "--host (MODELYARD_AGENT_HOST) is required"),
    ({"host": "GPU/0"}, "--host (MODELYARD_AGENT_HOST) must be a registry name (1-63 characters"),
    ({"host": "gpu-0", "runtime": "vllm"}, "must be one of triton, bentoml"),
    ({"host": "gpu-0", "load_deadline": "soon"}, "--load-deadline (MODELYARD_AGENT_LOAD_TIMEOUT) must be a number"),
    ({"host": "gpu-0", "load_deadline": "inf"}, "from 1 to 86400"),
    ({"host": "gpu-0", "heartbeat_interval": "1e-9"}, "from 0.5 to 86400"),
    ({"host": "gpu-0", "load_deadline": "2000"}, "must be shorter than --task-time-limit"),
    ({"host": "gpu-0", "broker_url": "amqp://x"}, "must be a Redis URL"),
    ({"host": "gpu-0", "gateway_grpc_listen": "grpc://x:1"},
     "--gateway-grpc-listen (MODELYARD_AGENT_GATEWAY_GRPC_LISTEN) must be a port or host:port"),
    ({"host": "gpu-0", "gateway_grpc_listen": "70000"}, "must be a port or host:port"),
    ({"host": "gpu-0", "gateway_grpc_listen": "8011"}, "needs --triton-url (MODELYARD_AGENT_TRITON_URL)"),
    ({"host": "gpu-0", "gateway_listen": "8080"},
     "--gateway-listen (MODELYARD_AGENT_GATEWAY_LISTEN) needs --triton-url"),
    ({"host": "gpu-0", "triton_url": "http://127.0.0.1:8000", "gateway_listen": "http://x:1"},
     "--gateway-listen (MODELYARD_AGENT_GATEWAY_LISTEN) must be a port or host:port"),
    ({"host": "gpu-0", "broker_url": "redis://"}, "must be a Redis URL"),
    ({"host": "gpu-0", "broker_url": "redis://h:notaport/0"}, "must be a Redis URL"),
    ({"host": "gpu-0", "broker_url": "redis://h:6379/abc"}, "must end in a database number"),
    ({"host": "gpu-0", "triton_grpc_url": "http://127.0.0.1:8001"}, "must be host:port (no scheme)"),
    ({"host": "gpu-0", "labels": "[1]"}, "must be a JSON object of non-empty string keys"),
    ({"host": "gpu-0", "labels": '{"": "x"}'}, "must be a JSON object of non-empty string keys"),
    ({"host": "gpu-0", "concurrency": "0"}, "must be a whole number from 1 to 64"),
    # Digits other than ASCII's: '²'.isdigit() is True, but int() refuses it (a traceback before) or reads '٣' as 3.
    ({"host": "gpu-0", "concurrency": "²"}, "must be a whole number from 1 to 64"),
    ({"host": "gpu-0", "concurrent_loads": "٣"}, "(MODELYARD_AGENT_CONCURRENT_LOADS) must be a whole"),
    ({"host": "gpu-0", "concurrent_loads": "17"}, "must be a whole number from 1 to 16"),
    ({"host": "gpu-0", "memory_budget_bytes": "1²"}, "must be a whole number of bytes"),
    ({"host": "gpu-0", "nginx_keepalive": "-1"},
     "--nginx-keepalive (MODELYARD_AGENT_NGINX_KEEPALIVE) must be a number of seconds from 0 to"),
    ({"host": "gpu-0", "loglevel": "loud"}, "--loglevel (MODELYARD_LOG_LEVEL) must be one of DEBUG, INFO"),
])
def test_a_bad_setting_is_refused_naming_its_flag_and_variable(values, says):
    with pytest.raises(ConfigError) as refused:
        AgentConfig.from_values(values, {})
    assert says in str(refused.value)


def test_the_command_exits_2_with_the_reason_for_a_bad_setting_and_prints_good_ones():
    agent = str(Path(sys.executable).parent / "modelyard-agent")
    bad = subprocess.run([agent, "--host", "gpu-0", "--runtime", "vllm"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and "must be one of triton, bentoml" in bad.stderr
    good = subprocess.run([agent, "--host", "gpu-0", "--print-config", "--broker-url", "redis://:s3cret@b:6379/1"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "MODELYARD_AGENT_LOAD_TIMEOUT": "75",
                               "MODELYARD_LOG_LEVEL": "warning"})
    assert good.returncode == 0, good.stderr
    assert "MODELYARD_AGENT_HOST=gpu-0\n" in good.stdout and "MODELYARD_AGENT_LOAD_TIMEOUT=75\n" in good.stdout
    assert "MODELYARD_LOG_LEVEL=WARNING\n" in good.stdout
    assert "CELERY_BROKER_URL=redis://:****@b:6379/1\n" in good.stdout and "s3cret" not in good.stdout


def test_the_command_refuses_a_host_it_could_not_serve(tmp_path):
    from modelyard_agent.cli import check_host

    with pytest.raises(ConfigError, match="is not a directory"):
        check_host(AgentConfig(host="gpu-0", model_repository=tmp_path / "missing"))
    (tmp_path / "models").mkdir()
    shm = Path("/dev/shm")  # a tmpfs: another file system than tmp_path's, on every Linux host
    if shm.is_dir() and shm.stat().st_dev != tmp_path.stat().st_dev:
        elsewhere = shm / f"modelyard-{tmp_path.name}"
        try:
            with pytest.raises(ConfigError, match="is on another file system"):
                check_host(AgentConfig(host="gpu-0", model_repository=tmp_path / "models", staging_dir=elsewhere))
        finally:
            shutil.rmtree(elsewhere, ignore_errors=True)
    check_host(AgentConfig(host="gpu-0", model_repository=tmp_path / "models", staging_dir=tmp_path / "staging"))
    assert (tmp_path / "staging").is_dir()


def test_a_task_for_a_host_of_another_runtime_is_refused_naming_both(agent_settings):
    from modelyard_agent.worker import _refused

    agent_settings(runtime="triton")
    assert _refused({"protocol": 2, "host": "gpu-0", "runtime": "triton"}) is None
    refusal = _refused({"protocol": 2, "host": "gpu-0", "runtime": "bentoml"})
    assert "--runtime triton" in refusal and "registered as a bentoml host" in refusal


@pytest.mark.parametrize("payload", [{}, {"protocol": 1}, {"protocol": contract.PROTOCOL_VERSION}])
def test_payloads_of_this_protocol_or_older_are_read(payload):
    contract.check_protocol(payload)


def test_a_payload_of_a_newer_protocol_is_refused_naming_the_upgrade():
    with pytest.raises(contract.UnsupportedProtocol, match="upgrade the agent on this host"):
        contract.check_protocol({"protocol": contract.PROTOCOL_VERSION + 1})
    with pytest.raises(ValueError, match="positive whole number"):
        contract.check_protocol({"protocol": "2"})


def test_the_orchestrators_target_states_and_runtimes_are_the_contracts():
    from deployments.choices import Runtime, TargetState

    assert {s.value for s in TargetState} == {s.value for s in contract.TargetState}
    assert {r.value for r in Runtime} == {r.value for r in contract.Runtime}
