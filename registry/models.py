"""Registered models, their versions and the audit trail."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce

from accounts.models import HashedSecret
from accounts.services import default_team_id
from registry.choices import ArtifactFormat, UploadStatus, UploadVerification, VersionStatus


class RegisteredModelQuerySet(models.QuerySet):
    """Queries of registered models."""

    def with_version_summary(self) -> "RegisteredModelQuerySet":
        """Annotate ``latest_version`` (newest live version number, or None) and ``version_count`` (live versions).

        Correlated subqueries on the (model, version) index, not a join and GROUP BY over every
        version: a page of 50 models costs 50 index lookups however many versions exist.
        """
        live = ModelVersion.objects.filter(model=models.OuterRef("pk")).exclude(status=VersionStatus.DELETED)
        return self.annotate(
            latest_version=models.Subquery(live.order_by("-version").values("version")[:1]),
            version_count=Coalesce(
                models.Subquery(live.order_by().values("model").annotate(n=models.Count("pk")).values("n")[:1]), 0
            ),
        )


class RegisteredModel(models.Model):
    """A named model whose versions the registry stores, owned by one team.

    ``next_version`` is the number the next registered version gets; it only
    grows, so a number is never reused, even after a version is deleted.
    """

    name = models.CharField(max_length=63, unique=True)
    team = models.ForeignKey(
        "accounts.Team", on_delete=models.PROTECT, related_name="models", default=default_team_id
    )
    description = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True)
    next_version = models.PositiveIntegerField(default=1)
    # Request capture on the Triton hosts that serve it (``registry.capture``): the share of client infer
    # requests kept (0 = off), the most bytes kept per host, and how long, in seconds.
    capture_fraction = models.FloatField(default=0.0)
    capture_max_bytes = models.PositiveBigIntegerField(default=256 * 1024**2, help_text="bytes per host")
    capture_retention_seconds = models.PositiveIntegerField(default=7 * 86_400, help_text="seconds")
    # Whether a client must present one of the team's inference keys scoped to this model
    # (``registry.inference_keys``); off by default so existing clients keep working.
    inference_key_required = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = RegisteredModelQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One immutable version of a registered model and its artifact in S3.

    The artifact is stored under a content address (``artifact_key`` derived
    from ``artifact_sha256``); ``artifact_size`` is in bytes. ``signature``
    holds the inputs and outputs read from the model config, ``config_text``
    the config.pbtxt as uploaded. A multipart upload's artifact stays under its upload's own key
    (``uploads/<id>``). ``sha256_verified_at`` is when the server last hashed the stored bytes
    itself and found ``artifact_sha256``; None while only the client's digest vouches for them
    (a background re-hash follows). ``integrity_error`` says why a version is CORRUPT.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.READY)
    format = models.CharField(max_length=16, choices=ArtifactFormat.choices)
    artifact_key = models.CharField(max_length=200)
    artifact_sha256 = models.CharField(max_length=64)
    artifact_size = models.PositiveBigIntegerField(help_text="bytes")
    artifact_filename = models.CharField(max_length=255, blank=True)
    sha256_verified_at = models.DateTimeField(null=True, blank=True)
    integrity_error = models.TextField(blank=True)
    config_text = models.TextField(blank=True)
    artifact_files = models.JSONField(default=list, blank=True, help_text="paths inside the version directory")
    signature = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=dict, blank=True)
    # Lineage: where the version came from.
    source_commit = models.CharField(max_length=64, blank=True, db_index=True)
    ci_run_url = models.URLField(max_length=500, blank=True)
    training_data_uri = models.CharField(max_length=500, blank=True)
    metrics = models.JSONField(default=dict, blank=True, help_text="e.g. {\"accuracy\": 0.97}")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["model", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["model", "version"], name="unique_model_version_number"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.version}"


class Alias(models.Model):
    """A movable name (``production``, ``staging``, …) pointing at one version of a model.

    Every move is an ``AuditEvent`` with the version it pointed at before and after.
    ``latest`` is reserved: it is computed, never stored. A ``protected`` alias moves only by an owner
    of the model's team who gives a reason; it is not deleted (neither is the version it names) until
    an owner unlocks it.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=63)
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="aliases")
    protected = models.BooleanField(default=False, help_text="locked: moving it needs a team owner and a reason")
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "name"]
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="unique_alias_per_model")]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.name}"


class EnsembleMember(models.Model):
    """One composing model of a Triton ensemble version.

    ``requested_version`` is the ``model_version`` the ensemble's config names (-1: Triton serves
    the newest loaded version); ``member`` is the registry version it resolved to at registration.
    A version that an ensemble composes cannot be deleted while the ensemble is live.
    """

    ensemble = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="members")
    member = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="used_by")
    requested_version = models.BigIntegerField(default=-1)

    class Meta:
        ordering = ["ensemble", "member__model__name", "member__version"]
        constraints = [models.UniqueConstraint(fields=["ensemble", "member"], name="unique_ensemble_member")]

    def __str__(self) -> str:
        return f"{self.ensemble} uses {self.member}"


class Upload(models.Model):
    """A direct-to-S3 multipart upload that becomes a model version once verified.

    The client uploads parts of ``part_size`` bytes through presigned URLs to ``staging_key``,
    declaring each part's digests (:class:`UploadPart`); on completion the server checks the part
    ETags and the composite ETag against them, and ``size`` (bytes), or streams the object back
    where that cannot be done (``verification``, ``verification_note``), then registers the version
    with ``version_fields`` (metadata, tags, lineage). ``etags_are_md5`` is False when the store
    said at the start that it encrypts the object with SSE-KMS or SSE-C.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="uploads")
    filename = models.CharField(max_length=255)
    size = models.PositiveBigIntegerField(help_text="bytes, as declared by the client")
    sha256 = models.CharField(max_length=64, blank=True, help_text="as declared by the client, if given")
    part_size = models.PositiveBigIntegerField(help_text="bytes per part (the last may be shorter)")
    staging_key = models.CharField(max_length=200)
    s3_upload_id = models.CharField(max_length=1024)
    status = models.CharField(max_length=16, choices=UploadStatus.choices, default=UploadStatus.OPEN)
    error = models.TextField(blank=True)
    etags_are_md5 = models.BooleanField(default=True)
    verification = models.CharField(max_length=16, choices=UploadVerification.choices, blank=True)
    verification_note = models.CharField(max_length=500, blank=True)
    version_fields = models.JSONField(default=dict, blank=True)
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"upload {self.id} of {self.model.name} ({self.status})"


class UploadPart(models.Model):
    """The digests a client declared for one part of an upload before sending it.

    ``md5`` (32 hex digits) is compared with the part's ETag that S3 computed from the bytes it
    received; ``sha256`` (64 hex digits) is signed into the part's URL as ``x-amz-checksum-sha256``.
    Declaring a part again (a retry) replaces its digests, as sending it again replaces its bytes.
    """

    upload = models.ForeignKey(Upload, on_delete=models.CASCADE, related_name="declared_parts")
    number = models.PositiveIntegerField()
    md5 = models.CharField(max_length=32)
    sha256 = models.CharField(max_length=64)

    class Meta:
        ordering = ["upload", "number"]
        constraints = [models.UniqueConstraint(fields=["upload", "number"], name="unique_upload_part")]

    def __str__(self) -> str:
        return f"part {self.number} of upload {self.upload_id}"


class ModelCard(models.Model):
    """What a model version is and what it may be used for, in the spirit of Hugging Face's model card
    front matter; one per version, editable after the version is immutable.

    ``license`` is an SPDX license expression (normalised, e.g. ``Apache-2.0``) or ``other``;
    ``datasets`` a list of dataset names or URIs; ``base_model`` what it was fine-tuned from;
    ``evaluation_results`` a list of ``{"task", "dataset", "metric", "value"}`` (value a number).
    ``registry.cards`` validates, saves (audited) and exports it as a README.md.
    """

    version = models.OneToOneField(ModelVersion, on_delete=models.CASCADE, related_name="card")
    license = models.CharField(max_length=200, blank=True)
    datasets = models.JSONField(default=list, blank=True)
    base_model = models.CharField(max_length=200, blank=True)
    intended_use = models.TextField(blank=True)
    limitations = models.TextField(blank=True)
    evaluation_results = models.JSONField(default=list, blank=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"card of {self.version}"


class InferenceKey(HashedSecret):
    """A key a client presents to call a team's models that require one; only a SHA-256 digest is stored.

    Made like an API token (``accounts.tokens``): the key reads ``myk_<prefix>_<secret>``, ``prefix``
    (not secret) names the row to people, ``digest`` is the hex SHA-256 of the whole key. ``scoped_models``
    are the team's models it opens (one or more). ``expires_at``/``revoked_at`` end its use;
    ``last_used_at`` is what the gateway last reported.
    """

    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="inference_keys")
    scoped_models = models.ManyToManyField(RegisteredModel, related_name="inference_keys")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
