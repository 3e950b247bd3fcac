"""Archives for registry tests: a real iris model directory and hand-made variants."""

import io
import tarfile
from pathlib import Path

import pytest

from demo.iris import build_iris_archive


@pytest.fixture(scope="session")
def iris_archive(tmp_path_factory) -> Path:
    """A real Triton model directory archive (iris classifier, ONNX + python backend)."""
    return build_iris_archive(tmp_path_factory.mktemp("iris") / "iris.tar.gz", name="iris")


def make_tar(path: Path, members: dict[str, bytes]) -> Path:
    """Write a .tar.gz at ``path`` with the given member names and contents."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


VALID_CONFIG = b"""
name: "iris"
backend: "python"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="session")
def bentoml_exports(tmp_path_factory) -> tuple[Path, Path]:
    """A real BentoML model and a Bento serving it, both tagged ``iris``, as BentoML exports them."""
    from tests.registry.format_builders import build_bentoml_exports

    return build_bentoml_exports(tmp_path_factory.mktemp("bentoml"), "iris")
