"""Browser fixtures: headless Debian Chromium driven by Playwright against pytest-django's live server.

- ``fleet``: a real Prometheus holding an hour of synthetic Triton and BentoML history and
  scraping the live expositions every 5 s, as the shipped config does; one for the package.
- ``browser``: one headless Chromium for the package (``/usr/bin/chromium``, installed by
  ``make install``; Playwright's own browser download is not used).
- ``deployed``: the registry rows of iris v1 and v2 on the Triton host ``gpu-a`` and bento-iris v1
  on ``bento-a``, committed so the live server sees them, with ``PROMETHEUS_URL`` on ``fleet``.
- ``page``: a fresh browser context and page, logged in through the login form.
- ``watch``: the console errors, failed requests, error responses and requests to other origins
  of ``page``, collected from the moment it opened.
- ``screenshots``: a per-module temporary directory for screenshots.
- ``crowded``: besides ``deployed``, aliases and a model, description, tags and hosts with names as long as
  they may be (the layout and page-width tests).
- ``iris_cards``: performance cards of iris v1 and v2 on the staging host ``staging-a``, made through
  the profile service and its agent's reports (v2 measured 1.5× the throughput at 0.8× the p99).
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response, sync_playwright

from deployments.models import ServingHost
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.factories import team_member
from tests.monitoring.synthetic import deploy_version, start_fleet

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
HISTORY_SECONDS = 3600 + 300  # the longest range drawn (1h) and its first rate window
USERNAME, PASSWORD = "engineer", "a-long-test-password"
IRIS_V2_FOOTPRINT = {"gpu": 1_500_000_000, "cpu": 200_000_000}


@pytest.fixture(scope="package")
def fleet(tmp_path_factory):
    """A Prometheus with an hour of history that is also scraping both live expositions; one backfill for
    every browser module (the tests only read it)."""
    started = time.time() - HISTORY_SECONDS - 60
    running = start_fleet(tmp_path_factory.mktemp("browser-fleet"), started=started,
                          history_seconds=HISTORY_SECONDS, scrape_seconds=5)
    yield running
    running.stop()


@pytest.fixture(scope="package")
def browser() -> Browser:
    """One headless Chromium for every browser module (each test opens its own context)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run 'make install' (it installs Debian's chromium)")
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        # Playwright's sync API parks an asyncio loop on this thread between calls, which Django
        # takes for an async context; the ORM still runs synchronously here, so its guard is lifted.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    """Where the module's tests save their screenshots."""
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
def deployed(transactional_db, fleet, settings):
    """Three versions ready on two hosts, the same rows ``fleet``'s series describe."""
    settings.PROMETHEUS_URL = fleet.prometheus.url
    gpu = ServingHost.objects.create(name="gpu-a", inference_url="http://gpu-a:8000", metrics_url=fleet.triton.url)
    bento = ServingHost.objects.create(name="bento-a", inference_url="http://bento-a:3000",
                                       metrics_url=fleet.bento.url)
    deploy_version("iris", 1, gpu)
    deploy_version("iris", 2, gpu, footprint=IRIS_V2_FOOTPRINT)
    deploy_version("bento-iris", 1, bento)
    return fleet


@pytest.fixture
def iris_cards(deployed) -> dict:
    """``{1: Profile, 2: Profile}``: iris v1 and v2 profiled on ``staging-a`` (see the module's docstring)."""
    import copy

    from django.utils import timezone

    from registry.models import ModelVersion
    from tests.deployments.test_profiling import CARD, IRIS_CONFIG
    from tests.factories import profiled

    ModelVersion.objects.filter(model__name="iris").update(config_text=IRIS_CONFIG)  # as registered: a profile needs it

    staging = ServingHost.objects.create(name="staging-a", inference_url="http://staging-a:8000",
                                         last_heartbeat_at=timezone.now(),
                                         heartbeat={"runtime_live": True, "agent": {"protocol": 3}})
    faster = copy.deepcopy(CARD["rows"])
    for row in faster:
        row["throughput"], row["p99_ms"] = row["throughput"] * 1.5, row["p99_ms"] * 0.8
    return {number: profiled(ModelVersion.objects.get(model__name="iris", version=number), staging, rows,
                             slo_p99_ms=CARD["slo_p99_ms"])
            for number, rows in ((1, CARD["rows"]), (2, faster))}


@dataclass
class PageWatch:
    """What went wrong while a page was open, collected from Playwright's page events."""

    origin: str
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    error_responses: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(f"{message.text} at {message.location.get('url', '?')}")

    def on_request(self, request: Request) -> None:
        self.requests.append(request.url)
        if not request.url.startswith((self.origin + "/", "data:", "about:")):
            self.foreign_requests.append(request.url)

    def on_request_failed(self, request: Request) -> None:
        # The icon loads after the load event, so the next navigation may abort it; so may an htmx
        # fragment the page was still fetching when the test moved on (Chromium: ERR_ABORTED).
        if "favicon" in request.url:
            return
        if request.failure == "net::ERR_ABORTED" and request.headers.get("hx-request") == "true":
            return
        self.failed_requests.append(f"{request.method} {request.url}: {request.failure}")

    def on_response(self, response: Response) -> None:
        if response.status >= 400 and "favicon" not in response.url:
            self.error_responses.append(f"{response.status} {response.request.method} {response.url}")

    def problems(self) -> list[str]:
        """Every console error, failed request, 4xx/5xx response and request to another origin."""
        return [*self.console_errors, *self.failed_requests, *self.error_responses,
                *(f"not the live server: {url}" for url in self.foreign_requests)]


def log_in(page: Page, username: str, password: str, next_path: str = "/models/") -> None:
    """Fill in and submit the login form, then wait for the redirect to ``next_path``."""
    page.goto(f"/login/?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**{next_path}")


@pytest.fixture
def watch(live_server) -> PageWatch:
    """What went wrong on ``page``; see PageWatch."""
    return PageWatch(origin=live_server.url)


@pytest.fixture
def logged_in(browser, live_server, watch):
    """Factory: ``logged_in(username, password, timeout_ms=15_000)`` opens a page on the live server
    (1280x900) whose events ``watch`` collects, and logs in through the login form; the pages'
    browser contexts close when the test ends."""
    contexts = []

    def open_page(username: str, password: str, timeout_ms: int = 15_000) -> Page:
        context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
        contexts.append(context)
        context.set_default_timeout(timeout_ms)
        opened = context.new_page()
        for event, handler in (("console", watch.on_console), ("request", watch.on_request),
                               ("requestfailed", watch.on_request_failed), ("response", watch.on_response)):
            opened.on(event, handler)
        log_in(opened, username, password)
        return opened

    yield open_page
    for context in contexts:
        context.close()


@pytest.fixture
def page(logged_in, deployed) -> Page:
    """A page on the live server (1280x900), logged in through the login form as a new user."""
    team_member(get_user_model().objects.create_user(username=USERNAME, password=PASSWORD))
    return logged_in(USERNAME, PASSWORD)


@pytest.fixture
def crowded(deployed):
    """Besides the fleet's iris and bento-iris: aliases, and a model whose name, description, tags and
    host names are as long as they may be, serving two versions on hosts with 63-character names."""
    iris = RegisteredModel.objects.get(name="iris")
    for name, number in (("production", 2), ("staging", 1), ("candidate-for-the-next-quarter", 2)):
        Alias.objects.create(model=iris, name=name, version=ModelVersion.objects.get(model=iris, version=number))
    long_name = "m" * 63
    for n, version in enumerate((1, 2, 2)):
        host = ServingHost.objects.create(name=f"{n}" + "h" * 62, inference_url=f"http://h{n}:8000")
        if n < 2:
            deploy_version(long_name, version, host)
        else:
            deploy_version("other", 1, host)
    model = RegisteredModel.objects.get(name=long_name)
    model.description = "A description as long as a list cell shows. " * 4
    model.tags = {f"key-{n}": "value-" * 4 for n in range(6)}
    model.save()
    for n in range(4):
        Alias.objects.create(model=model, name=f"alias-{n}-" + "a" * 40, version=model.versions.get(version=2))
    return deployed
