"""Pytest plugin: the longest modules run first, so two workers finish together.

``scripts/test.sh`` runs pytest-xdist with ``--dist loadfile``: a module goes whole to the next idle
worker, in collection order. When a 150-s module is collected last, one worker runs it alone while the
other has nothing left, so the run's wall clock is the sum of the shorter worker's share and that module.
Handing out the longest first (the longest-processing-time rule for scheduling on identical machines,
Graham, "Bounds on multiprocessing timing anomalies", 1969) leaves only short modules for the end.

``LONGEST`` lists the modules that took longest in a measured run (``scripts/test.sh --module-times=FILE``,
docs/testing.md), longest first; every other module keeps its place after them. The order is the same on
every worker (pytest-xdist refuses workers whose collections differ). When random order is asked
(pytest-random-order's ``--random-order*`` options) the plugin leaves the order alone.
"""

import pytest

#: Module paths from the repository root, longest first (seconds summed over a 2-worker run: CI of 38e224d on
#: 2026-12-07, less the cuts since: the permission matrix's world built once per module, Try it and the gateway
#: modules loading iris once; test_scaled_out measured alone beside other work).
#: Browser modules are left out: they share one package fixture (a Prometheus backfill and a Chromium) that
#: each worker running one of them starts, so they stay together at their collected place.
LONGEST = (
    "tests/deployments/test_bentoml_agent.py",   # 203 s
    "tests/deployments/test_bentoml_canary.py",  # 175 s
    "tests/e2e/test_profiles.py",                # 115 s
    "tests/test_api_fuzzing.py",                 # 93 s
    "tests/e2e/test_scaled_out.py",              # 84 s
    "tests/deployments/test_on_demand_faults.py",  # 81 s
    "tests/monitoring/test_latency_on_triton.py",  # 68 s
    "tests/e2e/test_fleet_namespaces.py",        # 63 s
    "tests/deployments/test_stuck_loads.py",     # 61 s
    "tests/deployments/test_replay_agent.py",    # 60 s
    "tests/monitoring/test_gateway_latency.py",  # 58 s
    "tests/e2e/test_bentoml_rollout.py",         # 55 s
    "tests/deployments/test_on_demand.py",       # 54 s
    "tests/deployments/test_gateway_canary.py",  # 54 s
    "tests/e2e/test_fleet_rollout.py",           # 46 s
    "tests/e2e/test_stuck_load_rollout.py",      # 45 s
    "tests/deployments/test_try_it.py",          # 40 s
    "tests/cli/test_cli_multipart.py",           # 37 s
    "tests/deployments/test_gateway.py",         # 35 s
)

#: Modules handed out after every other: ``tests/test_install.py`` installs ``requirements.txt`` into a new
#: virtualenv (161 s on a clean clone, nearly all of it pip's downloads), which ``scripts/test.sh`` starts
#: making in the background as the run starts (``python -m tests.fixtures.wheels``); by the end it is made, and
#: the module's fixture finds it instead of waiting for it. Its own time then is about 50 s.
LAST = ("tests/test_install.py",)


def _random_order_asked(config: pytest.Config) -> bool:
    """True when pytest-random-order will shuffle: ``--random-order``, or a bucket or seed given."""
    enabled = config.getoption("random_order_enabled", default=None)
    if enabled is None:  # pytest-random-order is not installed
        return False
    return bool(enabled) or any(
        not str(config.getoption(name)).startswith("default:") for name in ("random_order_bucket", "random_order_seed"))


def module_rank(item: pytest.Item) -> int:
    """The place of ``item``'s module in ``LONGEST`` (0 first), ``len(LONGEST)`` for a module not listed, and
    after those for a module of ``LAST``."""
    path = item.nodeid.split("::", 1)[0]
    if path in LAST:
        return len(LONGEST) + 1 + LAST.index(path)
    try:
        return LONGEST.index(path)
    except ValueError:
        return len(LONGEST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _random_order_asked(config):
        return
    items.sort(key=module_rank)  # stable: tests keep their order inside a module, other modules theirs
