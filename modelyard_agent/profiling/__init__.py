"""Performance cards: a model version measured on a host under a sweep of serving configs.

``sweep`` turns a sweep request (or a named preset) into the configs to load and the concurrency
levels to drive each at; ``card`` reads the measured rows (the recommendation for a latency
target, the Pareto front); ``perf_analyzer`` and ``wrk`` drive the real load generators (Triton's
own perf_analyzer for Triton versions, Debian's wrk for BentoML ones); ``triton`` and ``bentoml``
run one profile on a host. The orchestrator uses ``sweep`` and ``card`` too (they need no Django),
so a sweep it accepts is one the agent can run, and a page shows the same recommendation the API
gives.
"""
