"""Pytest plugin: where the suite's time goes, per module.

``pytest --module-times=FILE`` writes, when the run ends, a Markdown table of the 20 modules that took
longest: their tests' setup, call and teardown seconds (summed from pytest's own reports, which count a
module- or session-scoped fixture in the setup of the first test that needs it) and their test counts.
Under pytest-xdist it runs in the controller, from the reports the workers send, so the seconds are
summed over workers, not wall clock. ``docs/testing.md`` keeps the table of a run before and after a
change; ``--durations=30`` (always on, pyproject.toml) lists the slowest tests.
"""

from collections import defaultdict
from pathlib import Path

import pytest

SLOWEST = 20


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--module-times", default=None, metavar="FILE",
                     help=f"write a Markdown table of the {SLOWEST} slowest test modules to FILE")


class ModuleTimes:
    """Seconds per module and phase (``setup``, ``call``, ``teardown``) and test counts, from test reports."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.tests: dict[str, set[str]] = defaultdict(set)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::")[0]
        self.seconds[module][report.when] += report.duration
        self.tests[module].add(report.nodeid)

    def table(self) -> str:
        """The Markdown table: module, tests, setup s, call s, teardown s and total s, slowest first."""
        rows = sorted(self.seconds.items(), key=lambda item: -sum(item[1].values()))[:SLOWEST]
        lines = ["| module | tests | setup s | call s | teardown s | total s |", "|---|---:|---:|---:|---:|---:|"]
        for module, phases in rows:
            lines.append(f"| `{module}` | {len(self.tests[module])} | {phases['setup']:.1f} | {phases['call']:.1f} "
                         f"| {phases['teardown']:.1f} | {sum(phases.values()):.1f} |")
        return "\n".join(lines) + "\n"

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(self.table())


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--module-times")
    if target and not hasattr(config, "workerinput"):  # the xdist controller, or a run without xdist
        config.pluginmanager.register(ModuleTimes(Path(target)), "module-times")
