"""Build a real iris classifier as a Triton model directory or archive.

The model is a scikit-learn logistic regression trained on the iris data set
that ships with scikit-learn, converted to ONNX with skl2onnx and served by a
python-backend ``model.py`` (``demo/triton_python_model.py``) that runs the ONNX
file with onnxruntime. Training is deterministic and takes well under a second.

Layout written for model ``<name>``::

    <out>/<name>/config.pbtxt
    <out>/<name>/1/model.onnx
    <out>/<name>/1/model.py

Tensors: input ``input`` FP32 ``[batch, 4]`` (sepal length, sepal width, petal
length, petal width in cm); outputs ``label`` INT64 ``[batch, 1]`` (class index
0 setosa, 1 versicolor, 2 virginica) and ``probabilities`` FP32 ``[batch, 3]``.

The config carries no EXECUTION_ENV_PATH: that is a per-host setting added at
load time.

Command line::

    python -m demo.iris build --out DIR [--name iris] [--archive PATH.tar.gz] [--broken]
"""

import argparse
import functools
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np

MODEL_TEMPLATE = Path(__file__).with_name("triton_python_model.py")
RANDOM_STATE = 0
MAX_BATCH_SIZE = 8
# Opsets that the onnxruntime inside current Triton releases also reads.
TARGET_OPSET = {"": 17, "ai.onnx.ml": 3}

# One flower of each species plus one near the versicolor/virginica border,
# in cm, float32-exact.
SAMPLE_INPUT: list[list[float]] = [
    [5.1, 3.5, 1.4, 0.2],
    [7.0, 3.2, 4.7, 1.4],
    [6.3, 3.3, 6.0, 2.5],
    [6.0, 2.7, 5.1, 1.6],
]

CONFIG_TEMPLATE = """\
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [
  {{
    name: "input"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }}
]
output [
  {{
    name: "label"
    data_type: TYPE_INT64
    dims: [ 1 ]
  }},
  {{
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 3 ]
  }}
]
instance_group [
  {{
    kind: KIND_CPU
    count: 1
  }}
]
"""


@functools.lru_cache(maxsize=1)
def train_classifier():
    """Return the scikit-learn logistic regression fitted on the iris data set (features float32, cm;
    classes 0 setosa, 1 versicolor, 2 virginica); cached: training is deterministic."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    features, labels = load_iris(return_X_y=True)
    return LogisticRegression(max_iter=1000, random_state=RANDOM_STATE).fit(features.astype(np.float32), labels)


@functools.lru_cache(maxsize=1)
def _onnx_bytes() -> bytes:
    """Return the classifier converted to ONNX, serialised."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    clf = train_classifier()
    onnx_model = convert_sklearn(
        clf,
        initial_types=[("input", FloatTensorType([None, 4]))],
        options={id(clf): {"zipmap": False}},
        target_opset=TARGET_OPSET,
    )
    return onnx_model.SerializeToString()


def sample_input() -> np.ndarray:
    """Return SAMPLE_INPUT as a float32 array of shape ``[len(SAMPLE_INPUT), 4]``."""
    return np.asarray(SAMPLE_INPUT, dtype=np.float32)


def expected_labels() -> list[int]:
    """Return the class index (0, 1 or 2) that the trained model predicts for each SAMPLE_INPUT row."""
    return [int(label) for label in train_classifier().predict(sample_input())]


def build_iris_model_dir(out_dir: Path, name: str = "iris", broken: bool = False) -> Path:
    """Write the Triton model directory ``out_dir/name`` with version 1.

    Args:
        out_dir: parent folder; created if missing.
        name: model name, used for the folder and the config's ``name``.
        broken: write an ONNX file that onnxruntime cannot parse, so that
            ``model.py`` raises in ``initialize`` and a Triton load fails.

    Returns:
        The model directory ``out_dir/name``.

    Overwrites an existing model directory of the same name.
    """
    model_dir = Path(out_dir) / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG_TEMPLATE.format(name=name, max_batch_size=MAX_BATCH_SIZE))
    onnx_bytes = b"this is not an ONNX model" if broken else _onnx_bytes()
    (version_dir / "model.onnx").write_bytes(onnx_bytes)
    shutil.copyfile(MODEL_TEMPLATE, version_dir / "model.py")
    return model_dir


def build_iris_archive(out_path: Path, name: str = "iris", broken: bool = False) -> Path:
    """Write a gzipped tar of the model directory, with ``<name>/`` as its top-level entry.

    Args:
        out_path: the ``.tar.gz`` file to write; its parent is created if missing.
        name: model name, as in :func:`build_iris_model_dir`.
        broken: as in :func:`build_iris_model_dir`.

    Returns:
        ``out_path``.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_iris_model_dir(Path(tmp), name=name, broken=broken)
        with tarfile.open(out_path, "w:gz") as archive:
            archive.add(model_dir, arcname=name)
    return out_path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m demo.iris", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write the Triton model directory (and an archive)")
    build.add_argument("--out", type=Path, required=True, help="folder to write <name>/ into")
    build.add_argument("--name", default="iris", help="model name (default: iris)")
    build.add_argument("--archive", type=Path, help="also write this .tar.gz")
    build.add_argument("--broken", action="store_true", help="write a model that fails to load")
    args = parser.parse_args(argv)

    model_dir = build_iris_model_dir(args.out, name=args.name, broken=args.broken)
    print(f"model directory: {model_dir}")
    if args.archive:
        build_iris_archive(args.archive, name=args.name, broken=args.broken)
        print(f"archive: {args.archive}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
