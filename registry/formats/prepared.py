"""``PreparedArtifact``: what every upload kind's check returns (``registry.formats``)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PreparedArtifact:
    """A checked upload, ready to be stored as a model version.

    Use it as a context manager (or call :meth:`cleanup`): a generated archive lives in a temporary
    directory that is removed on exit.

    Attributes:
        format: an ``ArtifactFormat`` value.
        path: the file to store: the upload itself, or a generated ``.tar.gz`` Triton model directory
            (``<model>/config.pbtxt`` and ``<model>/1/model.onnx|model.pt|model.plan``); None when
            the upload was checked where it is stored (:func:`prepare_stored_archive`).
        is_original: True when ``path`` is the uploaded file, unchanged.
        config_text: the Triton ``config.pbtxt`` (uploaded or generated), or BentoML's
            ``model.yaml``/``bento.yaml``.
        files: paths of the model files: inside the version directory for Triton formats, inside the
            archive for BentoML ones.
        signature: ``{"inputs": [{"name", "data_type", "dims"}], "outputs": [...]}`` plus what the
            format adds (``max_batch_size``, ``platform``, ``backend`` for Triton; ``bentoml`` with
            the tag, module and methods or routes for BentoML).
        ensemble_members: ``(model_name, requested_version)`` per composing model of an ensemble;
            -1 asks for the newest version.
        bento_tag: ``name:version`` of a BentoML model or Bento, else ``""``.
    """

    format: str
    path: Path | None
    is_original: bool
    config_text: str
    files: tuple[str, ...]
    signature: dict
    ensemble_members: tuple[tuple[str, int], ...] = ()
    bento_tag: str = ""
    workdir: Path | None = field(default=None, repr=False)

    def cleanup(self) -> None:
        """Remove the generated archive's temporary directory, if any; calling it again does nothing."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> PreparedArtifact:
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()
