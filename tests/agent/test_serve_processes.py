"""How the agent tells a ``bentoml serve`` leader is alive, including the moment inside ``execve``."""

from __future__ import annotations

import subprocess
import time

import pytest

from modelyard_agent.runtimes import bentoml as serve


@pytest.fixture
def child(tmp_path):
    """A live child process whose environment names ``tmp_path`` as its BENTOML_HOME."""
    process = subprocess.Popen(["sleep", "60"], env={"BENTOML_HOME": str(tmp_path)})
    # Past its execve: until the kernel has filled in the new image's environment, the child reads as running
    # whatever home it is asked about (is_running's execve window), which the tests below do not mean to test.
    deadline = time.monotonic() + 10
    while serve._home_of(process.pid) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    yield serve.Instance(model="m", version=1, tag="m:1", port=1, home=str(tmp_path), pid=process.pid)
    process.kill()
    process.wait()


def test_a_child_is_running_while_its_environment_names_its_home(child, tmp_path):
    assert serve.is_running(child)
    assert not serve.is_running(serve.Instance(**{**child.as_dict(), "home": str(tmp_path / "other")}))


def test_a_child_still_in_execve_reads_an_empty_environment_and_counts_as_running(child, monkeypatch):
    # The kernel fills in the new image's environment after Popen has returned; the window is
    # microseconds, so it is injected here.
    monkeypatch.setattr(serve, "_home_of", lambda pid: None)
    monkeypatch.setattr(serve, "_environ_is_empty", lambda pid: True)
    assert serve.is_running(child)


def test_an_empty_environment_of_a_process_that_is_not_our_child_is_not_our_instance(child, monkeypatch):
    monkeypatch.setattr(serve, "_home_of", lambda pid: None)
    monkeypatch.setattr(serve, "_environ_is_empty", lambda pid: True)
    assert not serve.is_running(serve.Instance(**{**child.as_dict(), "pid": 1}))


def test_a_child_that_exited_is_not_running(child):
    subprocess.run(["kill", "-9", str(child.pid)], check=True)
    for _ in range(200):
        if not serve.is_running(child):
            break
        time.sleep(0.01)
    assert not serve.is_running(child)
