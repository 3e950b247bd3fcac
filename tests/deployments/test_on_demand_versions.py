"""Footprints per model version on a real Triton behind a real gateway, with the agent's loader: a new version of
an on-demand model is measured at its first load, never counted with the footprint of the version before it, and
the heartbeat's ``gateway.footprints`` carries each version's figure to the control plane."""

import json
import re
import shutil

import pytest
import requests

from modelyard_agent.footprints import version_footprints
from tests.deployments.test_gateway import BODY
from tests.fixtures.on_demand import put_model
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def host(make_host, triton_server):
    """A gateway in front of the session's shared Triton."""
    return make_host(triton_server)


def serve_version(server, name: str, version: int) -> None:
    """Make ``name``'s config.pbtxt load ``version`` alone (a copy of version 1's files), as a deployment of that
    version writes it."""
    directory = server.model_repository / name
    if not (directory / str(version)).exists():
        shutil.copytree(directory / "1", directory / str(version))
    text = (directory / "config.pbtxt").read_text()
    assert text.count("    versions: ") == 1, text  # put_model's: version_policy { specific { versions: 1 } }
    (directory / "config.pbtxt").write_text(re.sub(r"    versions: \d+", f"    versions: {version}", text))


def test_a_new_version_is_measured_at_its_first_load_and_each_versions_footprint_is_reported(host):
    put_model(host.server, "per_version")
    host.register_on_demand("per_version", cold_start_timeout=60, versions=[1])
    loader = host.start_loader()
    answer = requests.post(f"{host.url}/v2/models/per_version/infer", json=BODY, timeout=60)
    assert answer.status_code == 200 and answer.json()["model_version"] == "1"
    wait_for(lambda: loader.measured("per_version"), timeout=10, what="version 1 measured")
    first = loader.footprint("per_version")
    assert json.loads((host.dir / "footprints.json").read_text()) == {"per_version/1": first}

    # Version 2 is deployed while the model is cold: its footprint is not version 1's.
    assert loader.evict("per_version", "test")
    serve_version(host.server, "per_version", 2)
    host.register_on_demand("per_version", cold_start_timeout=60, versions=[2])
    assert loader.footprint("per_version") is None and not loader.measured("per_version")
    answer = requests.post(f"{host.url}/v2/models/per_version/infer", json=BODY, timeout=60)
    assert answer.status_code == 200 and answer.json()["model_version"] == "2"
    # Its load was measured (loaded alone, memory read before and after), and kept beside version 1's.
    wait_for(lambda: loader.measured("per_version"), timeout=10, what="version 2 measured")
    second = loader.footprint("per_version")
    assert set(second) == {"cpu"} and second["cpu"] > 1 << 20, second
    assert loader.runtime.loads == {"per_version": 2}
    # What the heartbeat reports, per version, for the control plane.
    assert version_footprints(host.dir) == {"per_version/1": first, "per_version/2": second}
