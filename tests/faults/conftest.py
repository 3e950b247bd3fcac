"""Fixtures for fault tests: real services that a test can stop and start again on the same port."""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fixtures.services import BIN, Service, _http_ok, _spawn, free_port, wait_for


@dataclass
class RestartableS3:
    """The S3 stand-in (moto's server) on a fixed port, stoppable and startable again.

    Moto keeps objects in memory, so a restart loses them, the bucket included; ``start`` creates the
    bucket again (a real S3 coming back keeps both).
    """

    port: int
    log_dir: Path
    service: Service | None = None
    url: str = field(init=False)

    def __post_init__(self):
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from registry.storage import ArtifactStore

        self.service = _spawn("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                              self.log_dir, env={"MOTO_DISABLE_GLOBAL_CORS": "true"})
        wait_for(lambda: _http_ok(self.url), timeout=30, what="the S3 stand-in")
        ArtifactStore(endpoint_url=self.url).ensure_bucket()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


@pytest.fixture
def restartable_s3(tmp_path, settings) -> Iterator[RestartableS3]:
    """A running S3 stand-in of this test's own (the session's one stays up); settings point at it."""
    s3 = RestartableS3(port=free_port(), log_dir=tmp_path / "s3-logs")
    s3.start()
    settings.S3_ENDPOINT_URL = s3.url
    yield s3
    s3.stop()
