"""Build the demo iris classifier as a BentoML Bento archive (``.bento``).

The same scikit-learn logistic regression as ``demo.iris`` (trained on the iris data set that ships
with scikit-learn) is saved with ``bentoml.sklearn.save_model`` as ``iris-classifier``, and
``demo/bento_service.py`` (a ``@bentoml.service``) is built around it into the Bento ``<name>``
(default ``iris-bento``, which must be the registered model's name) and exported with
``bentoml.bentos.export_bento``. BentoML keeps both in the store named by ``BENTOML_HOME``, so the
build runs in a subprocess with a fresh temporary one, leaving the user's own store untouched.

Command line::

    python -m demo.iris_bento build --out DIR [--name iris-bento]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from demo.iris import train_classifier

SERVICE_SOURCE = Path(__file__).with_name("bento_service.py")
CLASSIFIER_NAME = "iris-classifier"
BUILD_TIMEOUT_S = 300
# The sample input a deployment sends to the Bento's first API before it takes traffic.
SAMPLE_INPUT = {"features": [[5.1, 3.5, 1.4, 0.2]]}


def build_iris_bento(out_dir: Path, name: str = "iris-bento") -> Path:
    """Build the Bento ``name`` serving the iris classifier and export it to ``out_dir/<name>.bento``.

    Args:
        out_dir: folder for the archive; created if missing.
        name: the Bento's name (lower case; the registered model's name).

    Returns:
        The ``.bento`` file written (overwritten if present).

    Raises:
        RuntimeError: BentoML failed to save, build or export (its output is in the message).
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="iris-bento-") as tmp:
        env = {**os.environ, "BENTOML_HOME": str(Path(tmp) / "home"), "BENTOML_DO_NOT_TRACK": "true"}
        result = subprocess.run(
            [sys.executable, "-m", "demo.iris_bento", "_build", "--out", str(out_dir), "--name", name,
             "--context", str(Path(tmp) / "context")],
            env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    if result.returncode != 0:
        raise RuntimeError(f"building the iris Bento failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return out_dir / f"{name}.bento"


def _build_here(out_dir: Path, name: str, context: Path) -> Path:
    """Save, build and export in this process's BENTOML_HOME (``build_iris_bento`` sets a fresh one)."""
    import bentoml


    bentoml.sklearn.save_model(CLASSIFIER_NAME, train_classifier(), signatures={"predict": {"batchable": True}})
    context.mkdir(parents=True)
    shutil.copyfile(SERVICE_SOURCE, context / "service.py")
    # Not locked: the demo's Bento is imported into a local store, never built into an image, so
    # resolving its requirements against a package index (BentoML runs uv for it) buys nothing.
    bento = bentoml.bentos.build("service:IrisClassifier", name=name, build_ctx=str(context),
                                 labels={"source": "demo.iris_bento"}, python={"lock_packages": False})
    path = out_dir / f"{name}.bento"
    path.unlink(missing_ok=True)
    bentoml.bentos.export_bento(bento.tag, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m demo.iris_bento", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write <out>/<name>.bento")
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--name", default="iris-bento")
    inner = commands.add_parser("_build")  # the subprocess build_iris_bento runs
    inner.add_argument("--out", type=Path, required=True)
    inner.add_argument("--name", required=True)
    inner.add_argument("--context", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "_build":
        print(_build_here(args.out, args.name, args.context))
    else:
        print(f"bento: {build_iris_bento(args.out, args.name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
