"""Benchmark: ``bench/rolling_update.py`` with every client going through its host's gateway.

The same rolling update v1 → v2 across two Triton hosts under steady open-loop load, with each host agent
running its gateway (``--triton-url``; nginx with the routes in shared memory) at the host's
``inference_url``: the zero-downtime figures of a plain rolling update, measured through the gateway.

Usage::

    python bench/rolling_update_gateway.py --json bench/results/rolling_update_gateway.json \\
        --markdown bench/results/rolling_update_gateway.md
"""

import sys

from rolling_update import main

if __name__ == "__main__":
    raise SystemExit(main(["--gateway", "--database", "modelyard_rbench_rolling_gw", *sys.argv[1:]]))
