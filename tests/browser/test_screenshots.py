"""``make screenshots``: the fleet, model, compare, version, host and rollout pages at 1440 px and 390 px, drawn with
data (a real Prometheus with an hour of traffic, and performance cards of iris v1 and v2, see
conftest.py), written as PNG files into
``MODELYARD_SCREENSHOTS_DIR`` (``make screenshots`` sets ``var/screenshots``; otherwise the module's
temporary directory). Each page must load without a console error, failed request or foreign request."""

import os
from pathlib import Path

import pytest
from django.utils import timezone
from PIL import Image

from deployments.choices import DeploymentStatus
from deployments.models import Deployment
from registry.cards import update_card
from registry.models import ModelVersion

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WIDTHS = {"desktop": 1440, "phone": 390}
PAGES = {  # name: (path, a selector that shows the page has drawn its data)
    "fleet": ("/monitoring/", "#overview-table tr.overview-row"),
    "model": ("/models/iris/", '#model-charts[data-drawn="true"]'),
    "compare": ("/models/iris/compare/?a=1&b=2", "#compare-metrics tr.metric-row"),
    "version": ("/models/iris/versions/2/", "#version-profiles .profile-card canvas"),
    "host": ("/hosts/gpu-a/", "#host-traffic table, #host-traffic p"),
    "rollout": ("/deployments/{rollout}/", "h1"),
}


@pytest.fixture
def out_dir(screenshots) -> Path:
    chosen = os.environ.get("MODELYARD_SCREENSHOTS_DIR")
    path = Path(chosen) if chosen else screenshots
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("width", WIDTHS)
def test_each_page_is_drawn_with_data_and_written_as_a_screenshot(page, watch, out_dir, width, iris_cards):
    signature = {"inputs": [{"name": "input", "data_type": "TYPE_FP32", "dims": [4]}],
                 "outputs": [{"name": "label", "data_type": "TYPE_INT64", "dims": [1]}], "max_batch_size": 8}
    ModelVersion.objects.filter(model__name="iris").update(signature=signature, metrics={"accuracy": 0.97})
    update_card(ModelVersion.objects.get(model__name="iris", version=2), actor=None, license="MIT",
                datasets=["iris"], intended_use="Teaching classification.", limitations="Three species only.")
    page.set_viewport_size({"width": WIDTHS[width], "height": 900})
    rollout = Deployment.objects.filter(model__name="iris", version__version=2).latest("created_at").pk
    Deployment.objects.filter(pk=rollout).update(status=DeploymentStatus.SUCCEEDED, finished_at=timezone.now())
    for name, (path, drawn) in PAGES.items():
        page.goto(path.format(rollout=rollout))
        page.wait_for_selector(drawn)
        page.wait_for_load_state("networkidle")
        target = out_dir / f"{name}-{WIDTHS[width]}.png"
        page.screenshot(path=target, full_page=True)
        with Image.open(target) as image:
            assert image.width >= WIDTHS[width] and image.height >= 300, (name, image.size)
    assert not watch.problems(), watch.problems()
