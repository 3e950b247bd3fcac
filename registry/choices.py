"""Enumerations of the registry app."""

from django.db import models


class ArtifactFormat(models.TextChoices):
    """How a model version's artifact is laid out."""

    TRITON_MODEL_DIR = "triton", "Triton model directory"
    TRITON_ENSEMBLE = "triton_ensemble", "Triton ensemble"
    ONNX = "onnx", "ONNX file (wrapped for Triton's onnxruntime backend)"
    TORCHSCRIPT = "torchscript", "TorchScript file (wrapped for Triton's pytorch backend)"
    TENSORRT_PLAN = "tensorrt_plan", "TensorRT plan (wrapped for Triton's tensorrt backend)"
    BENTOML_MODEL = "bentomodel", "BentoML model archive (.bentomodel)"
    BENTO = "bento", "Bento archive (.bento)"

    @classmethod
    def triton_formats(cls) -> frozenset[str]:
        """The formats whose stored artifact is a Triton model directory archive."""
        return frozenset({cls.TRITON_MODEL_DIR, cls.TRITON_ENSEMBLE, cls.ONNX, cls.TORCHSCRIPT, cls.TENSORRT_PLAN})

    @classmethod
    def bentoml_formats(cls) -> frozenset[str]:
        """The formats a BentoML host serves."""
        return frozenset({cls.BENTOML_MODEL, cls.BENTO})


class VersionStatus(models.TextChoices):
    """Lifecycle of a model version.

    A version row is only written once its artifact is stored and checked (see SECURITY.md for
    what READY guarantees), so the first status a version has is READY; DELETED is a soft delete.
    CORRUPT: the server's own re-hash of the stored bytes disagreed with the version's sha256; the
    version is refused for deployment (``ModelVersion.integrity_error`` says why).
    """

    READY = "ready", "Ready"
    DELETED = "deleted", "Deleted"
    CORRUPT = "corrupt", "Corrupt"


class UploadStatus(models.TextChoices):
    """Lifecycle of a direct-to-S3 multipart upload.

    OPEN: parts may be uploaded; VERIFYING: completed in S3, the server is streaming it to check
    size and sha256; COMPLETED: a READY version exists; ABORTED: cancelled by the client or expired;
    FAILED: verification refused the artifact (``Upload.error`` says why).
    """

    OPEN = "open", "Open"
    VERIFYING = "verifying", "Verifying"
    COMPLETED = "completed", "Completed"
    ABORTED = "aborted", "Aborted"
    FAILED = "failed", "Failed"


class UploadVerification(models.TextChoices):
    """How a completed upload's bytes were checked (``Upload.verification``; "" until checked).

    PART_ETAGS: each part's ETag (the MD5 the store computed from the bytes it received) equalled
    the client's declared MD5, and the joined object's ETag and size equalled the composite ETag
    and the declared size; nothing was read back. READ_BACK: the object was streamed back and
    hashed, because the store's ETags are not MD5s (SSE-KMS, SSE-C) or the client declared no part
    digests (``Upload.verification_note`` says which).
    """

    PART_ETAGS = "part_etags", "Part ETags and composite ETag"
    READ_BACK = "read_back", "Streamed read-back"


TERMINAL_UPLOAD_STATUSES = frozenset({UploadStatus.COMPLETED, UploadStatus.ABORTED, UploadStatus.FAILED})
