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


MiB = 1024**2


def make_large_archive(path: Path, *, weights_bytes: int, name: str = "iris") -> Path:
    """Write a plain .tar of a Triton model directory whose ``1/model.bin`` holds ``weights_bytes``
    random bytes (so it spans several 5 MiB upload parts), beside the ``1/model.py`` it names."""
    import os

    with tarfile.open(path, "w") as tar:
        config = VALID_CONFIG.replace(b'name: "iris"', f'name: "{name}"'.encode())
        info = tarfile.TarInfo(f"{name}/config.pbtxt")
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config))
        source = b"class TritonPythonModel:\n    pass\n"  # the model file the python backend loads
        info = tarfile.TarInfo(f"{name}/1/model.py")
        info.size = len(source)
        tar.addfile(info, io.BytesIO(source))
        weights = tarfile.TarInfo(f"{name}/1/model.bin")
        weights.size = weights_bytes
        tar.addfile(weights, io.BytesIO(os.urandom(weights_bytes)))
    return path


@pytest.fixture(scope="session")
def large_archive(tmp_path_factory) -> Path:
    """A valid model archive of about 11 MiB: three parts of 5 MiB (the last one short)."""
    return make_large_archive(tmp_path_factory.mktemp("large") / "iris.tar", weights_bytes=11 * MiB)
