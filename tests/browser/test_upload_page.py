"""The upload page in a real browser: the file goes straight to S3 in parts (cross-origin PUTs allowed
by the bucket's CORS rules, nothing through the web process), a progress bar, a real worker verifies
it, and the browser lands on the new version; a refused file shows the reason."""

import pytest
from django.contrib.auth import get_user_model

from registry.models import ModelVersion, RegisteredModel, Upload
from registry.storage import ArtifactStore
from tests.browser.conftest import PASSWORD, USERNAME
from tests.factories import team_member
from tests.registry.conftest import MiB, make_large_archive
from tests.registry.uploading import PART, sha256_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def large_archive(tmp_path):
    """A valid model archive of about 11 MiB: three 5 MiB parts."""
    return make_large_archive(tmp_path / "iris.tar", weights_bytes=11 * MiB)


@pytest.fixture
def upload_page(logged_in, live_server, s3_endpoint, start_celery_worker, settings):
    """A logged-in page on the live server, with 5 MiB parts, the bucket open to the live server's
    origin, and a worker verifying uploads."""
    settings.UPLOAD_PART_BYTES = PART
    ArtifactStore().allow_browser_uploads([live_server.url])
    start_celery_worker("default", env={"MODELYARD_S3_ENDPOINT_URL": s3_endpoint})
    team_member(get_user_model().objects.create_user(username=USERNAME, password=PASSWORD))
    RegisteredModel.objects.create(name="iris")
    return logged_in(USERNAME, PASSWORD, timeout_ms=30_000)


def test_a_file_goes_to_s3_in_parts_with_a_progress_bar_and_opens_the_new_version(
    upload_page, watch, s3_endpoint, large_archive, screenshots
):
    page = upload_page
    page.goto("/models/iris/")
    page.get_by_role("link", name="Upload a version").click()
    page.wait_for_url("**/models/iris/upload/")
    page.set_input_files("input[name=artifact]", str(large_archive))
    page.fill("textarea[name=metadata]", '{"dataset": "2024-06"}')
    page.fill("textarea[name=tags]", '{"team": "vision"}')
    page.fill("textarea[name=sample_input]", '{"input": [[5.1, 3.5, 1.4, 0.2]]}')
    page.fill("input[name=source_commit]", "abc123")
    page.get_by_role("button", name="Upload").click()
    page.wait_for_selector("#upload-status:has-text('hashed')")
    page.screenshot(path=screenshots / "upload_progress.png")
    page.wait_for_url("**/models/iris/versions/1/")

    version = ModelVersion.objects.get(model__name="iris", version=1)
    assert version.artifact_sha256 == sha256_of(large_archive)
    # The sample input is the version's metadata.sample_input: what the smoke inference and "Try it" send.
    assert version.metadata == {"dataset": "2024-06", "sample_input": {"input": [[5.1, 3.5, 1.4, 0.2]]}}
    assert (version.tags, version.source_commit) == ({"team": "vision"}, "abc123")
    assert version.created_by.username == USERNAME
    upload = Upload.objects.get()
    # The page declared each part's digests and sent them as the URL required: checked by ETag.
    assert (upload.verification, upload.declared_parts.count()) == ("part_etags", 3)
    part_puts = [url for url in watch.requests if url.startswith(s3_endpoint) and "partNumber=" in url]
    assert len(part_puts) == 3  # the preflights are not Playwright requests; three PUTs, one per part
    # The model page's charts may be cut short by the click (no Prometheus here); the upload's own
    # requests, to the API and to S3, all succeed and nothing breaks the CSP (a console error).
    ours = [p for p in watch.failed_requests + watch.error_responses if "/uploads" in p or s3_endpoint in p]
    foreign = [url for url in watch.foreign_requests if not url.startswith(s3_endpoint)]
    # Without Prometheus the charts' series API answers 503 by design; any other console error counts.
    console = [e for e in watch.console_errors if "/metrics/series/" not in e]
    assert not ours and not foreign and not console, watch.problems()


def test_a_file_the_registry_refuses_shows_the_reason_on_the_page(upload_page, watch, tmp_path):
    page = upload_page
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive" * (MiB // 8))
    page.goto("/models/iris/upload/")
    page.set_input_files("input[name=artifact]", str(junk))
    page.get_by_role("button", name="Upload").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "the upload was refused: artifact refused" in alert.inner_text()
    assert Upload.objects.get().status == "failed" and not ModelVersion.objects.exists()
    assert page.get_by_role("button", name="Upload").is_enabled()
    # The progress and its "Verifying the upload…" line are gone: one error is left on the page.
    assert page.locator("#upload-progress").is_hidden() and page.locator("#upload-status").inner_text() == ""
    assert "Verifying" not in page.inner_text("main")


def test_a_file_of_a_kind_the_registry_does_not_take_is_refused_by_its_name_before_anything_is_sent(
    upload_page, watch, tmp_path, s3_endpoint
):
    page = upload_page
    weights = tmp_path / "weights.h5"
    weights.write_bytes(b"\0" * MiB)
    page.goto("/models/iris/upload/")
    page.set_input_files("input[name=artifact]", str(weights))  # said as soon as it is chosen
    alert = page.get_by_role("alert")
    assert alert.inner_text().startswith("cannot tell what kind of model 'weights.h5' is from its name; "
                                         "the registry accepts a Triton model directory")
    page.get_by_role("button", name="Upload").click()
    assert alert.is_visible() and page.locator("#upload-progress").is_hidden()
    assert not Upload.objects.exists()
    sent = [url for url in watch.requests if "/uploads" in url or url.startswith(s3_endpoint)]
    assert sent == [], sent


def test_a_refusal_from_the_api_shows_the_reason_alone_and_clears_the_progress(upload_page, large_archive):
    page = upload_page
    page.goto("/models/iris/upload/")
    page.set_input_files("input[name=artifact]", str(large_archive))
    page.fill("textarea[name=tags]", '{"team": 7}')  # valid JSON the API refuses: tag values are strings
    page.get_by_role("button", name="Upload").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert alert.inner_text() == "tag 'team' must have a string value of at most 1024 characters"
    assert page.locator("#upload-progress").is_hidden() and page.get_by_role("button", name="Upload").is_enabled()
    assert not Upload.objects.exists()


def test_bad_json_in_a_field_is_reported_before_anything_is_sent(upload_page, large_archive):
    page = upload_page
    page.goto("/models/iris/upload/")
    page.set_input_files("input[name=artifact]", str(large_archive))
    page.fill("textarea[name=tags]", "{team: vision}")
    page.get_by_role("button", name="Upload").click()
    assert "tags is not valid JSON" in page.get_by_role("alert").inner_text()
    assert not Upload.objects.exists()
