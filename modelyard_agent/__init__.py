"""The Modelyard host agent: what runs on a serving host, installable alone (``pip install ./modelyard_agent``).

It depends on celery, redis, requests, tritonclient, prometheus-client and numpy (bentoml for
BentoML hosts) and never on
Django, boto3, a database driver or the registry's apps. The orchestrator and the agent share only
``contract`` (queues, task names, payload and report shapes, target states, the protocol
version); the orchestrator also reads archives, Triton model configs and names with the same
Django-free modules the agent checks them with (``formats``).

Modules:

- ``cli``: the ``modelyard-agent`` command; ``config``: its flags and environment.
- ``app``: the Celery app and its reports; ``coordination``: locks and the work under way, in the
  broker's Redis; ``worker``: the tasks; ``claims``: a target's claim, which a cancel races for.
- ``host_agents``: one interface over the runtimes, implemented in ``adapters`` over ``triton_host``
  (with ``triton_staging`` and ``triton_heartbeat``) and ``bentoml_host`` (with ``bentoml_import`` and
  ``bentoml_instances``); ``downloads``: the checked
  artifact download both runtimes stage from; ``runtimes``: clients of Triton, ``bentoml serve``, the
  Bento Store and nginx.
"""
