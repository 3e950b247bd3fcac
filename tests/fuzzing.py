"""Schemathesis runs against the API schema, shared by tests/test_api_fuzzing.py and bench/api_fuzz.py.

``load_schema()`` reads ``/api/schema/`` from the Django WSGI app in-process. ``fuzz_schema()`` sends
every operation generated cases through the same app and checks each answer: not a server error
unless the operation documents that status (a 503 when Triton cannot be reached), every error the
error envelope (``detail`` and a listed ``code``), and matching the schema the operation documents
for its status. Generation is derandomized: the same code and
schema give the same cases, so a failure in CI reproduces locally.
"""

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import schemathesis
from django.core import signals
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.plugins.envelope import envelope_problem


@schemathesis.check
def no_undocumented_server_error(ctx, response, case):
    """A 5xx answer fails unless the operation documents that very status (e.g. 503)."""
    if response.status_code >= 500 and case.operation.responses.find_by_status_code(response.status_code) is None:
        raise AssertionError(
            f"{case.operation.label} answered {response.status_code}: {response.content[:500]!r}"
        )


@schemathesis.check
def every_error_carries_detail_and_code(ctx, response, case):
    """A 4xx or 5xx answer is the error envelope: a JSON object with a ``detail`` sentence, a ``code``
    from ``modelyard.api_errors.ERROR_CODES`` and, on ``invalid`` answers only, ``fields``; whether or
    not the operation documents its status."""
    if response.status_code < 400:
        return
    if problem := envelope_problem(response.content):
        raise AssertionError(f"{case.operation.label} answered {response.status_code} without the error envelope: "
                             f"{problem}")


CHECKS = [no_undocumented_server_error, every_error_carries_detail_and_code, response_schema_conformance,
          status_code_conformance]


@dataclass
class FuzzWorld:
    """What generated cases may hit besides generated values: a staff token and objects that exist.

    ``path_parameters`` maps an operation's path prefix to values of its path parameters that name
    existing objects, e.g. ``{"/api/v1/hosts/": {"name": "local"}}``; the longest prefix wins.
    ``bodies`` maps an operation's label (``POST /api/v1/deployments/``) to a valid JSON body
    sent as one more case, so the operation's work past validation runs too.
    """

    token: str
    path_parameters: dict[str, dict] = field(default_factory=dict)
    bodies: dict[str, dict] = field(default_factory=dict)

    def known_parameters(self, path: str) -> dict:
        """The existing objects' path parameters for an operation at ``path``."""
        prefixes = sorted((p for p in self.path_parameters if path.startswith(p)), key=len)
        known: dict = {}
        for prefix in prefixes:
            known.update(self.path_parameters[prefix])
        names = {part[1:-1] for part in path.split("/") if part.startswith("{")}
        return {name: value for name, value in known.items() if name in names}


@dataclass
class FuzzReport:
    """Cases sent per operation and the first failure of each operation that had one."""

    counts: Counter = field(default_factory=Counter)
    statuses: dict[str, Counter] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def total_cases(self) -> int:
        return sum(self.counts.values())

    def describe_failures(self) -> str:
        return "\n\n".join(f"{label}:\n{message}" for label, message in sorted(self.failures.items()))

    def as_dict(self) -> dict:
        return {
            "total_cases": self.total_cases,
            "operations": {label: {"cases": n, "statuses": dict(sorted(self.statuses[label].items()))}
                           for label, n in sorted(self.counts.items())},
            "failures": self.failures,
        }


def load_schema():
    """The OpenAPI schema as the app serves it at ``/api/schema/``, bound to the WSGI app.

    Call it inside ``shared_connection()`` in a test that holds a transaction.
    """
    from modelyard.wsgi import application

    return schemathesis.openapi.from_wsgi("/api/schema/", application)


def call_and_check(method: str, path: str, *, token: str, **case_fields):
    """Send one request to an operation of the schema and run the fuzzer's checks on its answer.

    Args:
        method, path: the operation as the schema names it (``"GET"``, ``"/api/v1/audit/"``).
        token: an API token.
        case_fields: ``path_parameters``, ``query``, ``body`` (JSON) of the request.

    Returns:
        The response (``status_code``, ``json()``).

    Raises:
        FailureGroup: the answer is an undocumented server error or breaks the schema.
    """
    headers = {"Authorization": f"Token {token}"}
    with shared_connection():
        case = load_schema()[path][method].Case(
            media_type="application/json" if "body" in case_fields else None, **case_fields)
        response = case.call(headers=headers)
        case.validate_response(response, checks=CHECKS, headers=headers)
    return response


def _strategy(operation, world: FuzzWorld):
    known = world.known_parameters(operation.path)
    strategies = [operation.as_strategy(), operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE)]
    if known:
        strategies.insert(0, operation.as_strategy(path_parameters=known))
    if operation.label in world.bodies:
        strategies.insert(0, operation.as_strategy(path_parameters=known, body=world.bodies[operation.label],
                                                   media_type="application/json"))
    return st.one_of(strategies)


def fuzz_operation(operation, world: FuzzWorld, *, cases: int, report: FuzzReport) -> None:
    """Send ``operation`` up to ``cases`` generated cases, recording counts and the first failure.

    Runs inside a savepoint rolled back afterwards, so operations do not see each other's writes.
    """
    headers = {"Authorization": f"Token {world.token}"}
    statuses = report.statuses.setdefault(operation.label, Counter())

    @settings(max_examples=cases, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])
    @given(case=_strategy(operation, world))
    def run(case):
        report.counts[operation.label] += 1
        response = case.call(headers=headers)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS, headers=headers)

    try:
        with transaction.atomic():
            try:
                run()
            finally:
                transaction.set_rollback(True)
    except (Exception, BaseExceptionGroup) as exc:  # one operation's failure must not hide another's
        report.failures[operation.label] = str(exc)[:4000]


@contextmanager
def shared_connection() -> Iterator[None]:
    """Let in-process requests share the caller's database connection and transaction.

    Django closes the connection when a request starts and ends; the test client stops that, and
    so does this, for requests sent to the WSGI app directly.
    """
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def fuzz_api(world: FuzzWorld, *, cases_per_operation: int) -> FuzzReport:
    """Fuzz every operation of the app's schema with ``cases_per_operation`` cases each (fewer where
    the generator runs out of distinct ones)."""
    report = FuzzReport()
    with shared_connection():
        schema = load_schema()
        for result in schema.get_all_operations():
            fuzz_operation(result.ok(), world, cases=cases_per_operation, report=report)
    return report
