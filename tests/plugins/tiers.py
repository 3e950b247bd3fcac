"""Pytest plugin: the ``integration`` marker selects for real.

Every test that the process census (``tests/plugins/census.py``) says starts a real process is marked
``integration``, beside those marked by hand (tests that talk to a server the session started). So
``-m "not integration"`` is the fast tier (``make test-fast``): unit and database tests.

The census reads code; this plugin keeps it honest at run time. While a test that is not marked
``integration`` is set up, run or torn down, starting a process fails it with ``ProcessStarted``, naming
the command; mark such a test ``integration`` (a session fixture it shares is then started by whichever
integration test comes first).
"""

import subprocess

import pytest

from tests.plugins.census import starts_process


class ProcessStarted(AssertionError):
    """A test outside the integration tier started a process."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") is None and starts_process(item):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if item.get_closest_marker("integration") is not None:
        return (yield)
    execute_child = subprocess.Popen._execute_child

    def refuse(self, args, *rest, **kwargs):
        raise ProcessStarted(f"{item.nodeid} is not marked integration but starts a process: {args!r}; "
                             "mark it (pytest.mark.integration) or keep it in process")

    subprocess.Popen._execute_child = refuse
    try:
        return (yield)
    finally:
        subprocess.Popen._execute_child = execute_child
