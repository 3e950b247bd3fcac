"""Build real artifacts of every accepted format for the registry's format tests.

ONNX files come from ``onnx.helper``; BentoML models and Bentos from BentoML itself, saved and
exported in a subprocess with its own ``BENTOML_HOME`` so nothing touches the user's store.
"""

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

from registry.storage import ArtifactStore

REPO_ROOT = Path(__file__).resolve().parents[2]


def bucket_keys() -> set[str]:
    """Every key in the artifact bucket."""
    store = ArtifactStore()
    answer = store.client.list_objects_v2(Bucket=store.bucket)
    return {item["Key"] for item in answer.get("Contents", [])}


def upload(api_client, name: str, path: Path, filename: str | None = None, **fields):
    """POST ``path`` as a new version of model ``name``; ``fields`` are extra form fields (dicts as JSON)."""
    with open(path, "rb") as handle:
        data = {"artifact": handle}
        if filename is not None:
            from django.core.files.uploadedfile import SimpleUploadedFile

            data["artifact"] = SimpleUploadedFile(filename, handle.read())
        for key, value in fields.items():
            data[key] = json.dumps(value) if isinstance(value, dict | list) else str(value)
        return api_client.post(f"/api/v1/models/{name}/versions/", data, format="multipart")


def write_onnx(path: Path, *, batch: str | int = "N", features: int = 4) -> Path:
    """A tiny ONNX model: output ``y`` = 2 * input ``x``, FP32, shape ``[batch, features]``.

    ``batch`` is a symbolic name (a dynamic dimension) or a fixed size.
    """
    import onnx
    from onnx import TensorProto, helper

    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, features])],
        initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def write_onnx_with_sequence_output(path: Path) -> Path:
    """An ONNX model whose output is a sequence of tensors (as scikit-learn's ZipMap gives maps)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x"], ["s"])],
        "sequence",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def write_torchscript(path: Path, *, with_code: bool = True) -> Path:
    """A zip laid out as ``torch.jit.save`` writes one (torch itself is not installed); without code it
    looks like ``torch.save`` weights."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("double/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("double/version", b"3\n")
        if with_code:
            archive.writestr("double/constants.pkl", b"\x80\x02).")
            archive.writestr("double/code/__torch__/double.py", b"def forward(self, x):\n  return x * 2\n")
    return path


SIGNATURE = {
    "inputs": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
    "outputs": [{"name": "OUTPUT__0", "data_type": "FP32", "dims": [-1, 4]}],
}


def write_tar(path: Path, members: dict[str, bytes | None], mode: str = "w:xz") -> Path:
    """A tar with the given members (None: a directory)."""
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def write_triton_dir(path: Path, config: str, files: dict[str, bytes] | None = None, version: str = "1") -> Path:
    """A .tar.gz of one Triton model directory at the archive root; no files means an empty version dir."""
    members: dict[str, bytes | None] = {"config.pbtxt": config.encode(), f"{version}/": None}
    members.update({f"{version}/{name}": data for name, data in (files or {}).items()})
    return write_tar(path, members, mode="w:gz")


def ensemble_config(name: str, steps: list[tuple[str, int]]) -> str:
    """An ensemble config that feeds ``input`` through each step in turn."""
    step_text = ", ".join(
        f'{{ model_name: "{model}" model_version: {version} '
        f'input_map {{ key: "input" value: "input" }} output_map {{ key: "label" value: "label" }} }}'
        for model, version in steps
    )
    return textwrap.dedent(f"""\
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "input" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "label" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        ensemble_scheduling {{ step [ {step_text} ] }}
        """)


_BENTOML_SCRIPT = """
import sys
import bentoml
import numpy as np
from sklearn.linear_model import LogisticRegression

out, name, refuse = sys.argv[1], sys.argv[2], sys.argv[3] == "refuse"
features = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
model = bentoml.sklearn.save_model(
    name, LogisticRegression().fit(features, [0, 1, 1, 0]), signatures={"predict": {"batchable": True}}
)
bentoml.models.export_model(str(model.tag), f"{out}/{name}.bentomodel")
with open(f"{out}/service.py", "w") as handle:
    handle.write('''
import bentoml
import numpy as np


@bentoml.service
class Classifier:
    model_ref = bentoml.models.BentoModel("%s:latest")

    def __init__(self):
        if %r:
            raise RuntimeError("this service refuses to start")
        self.model = bentoml.sklearn.load_model(self.model_ref)  # once per worker, as a real service does

    @bentoml.api
    def classify(self, features: np.ndarray) -> np.ndarray:
        return self.model.predict(features)
''' % (name, refuse))
# Not locked: locking resolves the requirements against a package index with uv, which these builds,
# imported straight into a local store, have no use for.
bento = bentoml.bentos.build("service:Classifier", name=name, build_ctx=out, python={"lock_packages": False})
bentoml.bentos.export_bento(bento.tag, f"{out}/{name}.bento")
print(model.tag, bento.tag)
"""


def build_bentoml_exports(out: Path, name: str, *, refuse_to_start: bool = False) -> tuple[Path, Path]:
    """Save a small scikit-learn model with BentoML, build a Bento serving it, export both.

    With ``refuse_to_start`` the Bento's service raises while it initialises (it never gets ready).

    Returns:
        ``(out/<name>.bentomodel, out/<name>.bento)``.
    """
    env = {**os.environ, "BENTOML_HOME": str(out / "bentoml-home"), "BENTOML_DO_NOT_TRACK": "true"}
    result = subprocess.run(
        [sys.executable, "-c", _BENTOML_SCRIPT, str(out), name, "refuse" if refuse_to_start else "serve"],
        env=env, cwd=out, capture_output=True, text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building BentoML exports failed:\n{result.stdout}\n{result.stderr}")
    return out / f"{name}.bentomodel", out / f"{name}.bento"
