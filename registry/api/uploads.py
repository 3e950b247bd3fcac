"""Registry API: direct-to-S3 multipart uploads of large artifacts (serializers and views).

``POST /api/v1/models/<name>/uploads/`` starts one, ``POST …/uploads/<id>/parts/`` hands out
presigned part URLs, ``POST …/uploads/<id>/complete/`` closes it for verification, ``GET`` shows
its state (poll it until ``completed`` or ``failed``) and ``DELETE`` aborts it. Only the user who
started an upload, or an administrator, can see or act on it, and only while they may change the
model (maintainer role, token scope ``write``; reading needs ``read``).
"""

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Action, Principal, require
from modelyard.api import RefuseUnknownFields, error_responses
from registry import uploads
from registry.access import model_for
from registry.api.serializers import JSONObjectField
from registry.models import Upload

LINEAGE_FIELDS = ("source_commit", "ci_run_url", "training_data_uri", "metrics")


class UploadCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/models/<name>/uploads/``: the file and the version's fields."""

    filename = serializers.CharField(max_length=255, help_text="The file's name, e.g. resnet50.tar.gz")
    size = serializers.IntegerField(min_value=1, help_text="The file's size in bytes")
    sha256 = serializers.CharField(required=False, allow_blank=True, default="", max_length=64,
                                   help_text="Hex digest, if known now; else give it on completion")
    part_size = serializers.IntegerField(required=False, allow_null=True, default=None,
                                         help_text="Bytes per part: 5 MiB to 5 GiB, at most 10,000 parts")
    metadata = JSONObjectField(required=False, default=dict, help_text="A JSON object of free-form metadata")
    tags = JSONObjectField(required=False, default=dict, help_text="String key/value tags of the version")
    source_commit = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    ci_run_url = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    training_data_uri = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    metrics = JSONObjectField(required=False, default=dict, help_text='Evaluation metrics, e.g. {"accuracy": 0.97}')
    signature = JSONObjectField(required=False, default=None, allow_null=True,
                                help_text="For a single .onnx/.pt/.plan file: its inputs and outputs")
    max_batch_size = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=0,
                                              help_text="For a single model file: the generated config's batch size")


class UploadedPartSerializer(RefuseUnknownFields, serializers.Serializer):
    """A part S3 already holds: its number, size in bytes and ETag (unquoted; where the store's ETags
    are MD5s, the MD5 of the bytes it received, which a resuming client compares with its own)."""

    part_number = serializers.IntegerField(source="number")
    size = serializers.IntegerField()
    etag = serializers.CharField(source="etag_hex")


class UploadSerializer(serializers.ModelSerializer):
    """An upload's state; ``parts`` lists what S3 holds while it is open; ``version`` once completed."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    part_count = serializers.SerializerMethodField()
    parts = serializers.SerializerMethodField()
    version = serializers.IntegerField(source="version.version", read_only=True, allow_null=True, default=None)
    verification = serializers.CharField(
        read_only=True, help_text='How the bytes were checked: "part_etags" (by the store\'s part ETags and the '
                                  'composite ETag, nothing read back), "read_back" (streamed back and hashed), '
                                  'or "" while not checked yet')
    verification_note = serializers.CharField(read_only=True, help_text="Why the bytes were read back, if they were")

    class Meta:
        model = Upload
        fields = ["id", "model", "filename", "size", "sha256", "part_size", "part_count", "status", "parts",
                  "verification", "verification_note", "version", "error", "created_by", "created_at", "updated_at",
                  "expires_at"]
        read_only_fields = fields

    def get_part_count(self, upload: Upload) -> int:
        return uploads.part_count(upload)

    @extend_schema(responses=UploadedPartSerializer(many=True))
    def get_parts(self, upload: Upload) -> list[dict]:
        parts = self.context.get("parts", [])
        return UploadedPartSerializer(parts, many=True).data


class DeclaredPartSerializer(RefuseUnknownFields, serializers.Serializer):
    """One part the client is about to send, with the digests of its bytes (hex)."""

    part_number = serializers.IntegerField(min_value=1)
    md5 = serializers.RegexField(r"^[0-9a-fA-F]{32}$", help_text="The part's MD5, 32 hex digits")
    sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", help_text="The part's SHA-256, 64 hex digits")


class PartUrlsRequestSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/uploads/<id>/parts/``: ``parts`` with their digests (the store then
    checks each part on arrival and the server checks it by its ETag), or bare ``part_numbers``
    (older clients; the upload is then verified by reading it back)."""

    parts = DeclaredPartSerializer(many=True, required=False, min_length=1,
                                   max_length=uploads.MAX_PRESIGN_PER_CALL)
    part_numbers = serializers.ListField(child=serializers.IntegerField(), min_length=1, required=False,
                                         max_length=uploads.MAX_PRESIGN_PER_CALL)

    def validate(self, attrs):
        if ("parts" in attrs) == ("part_numbers" in attrs):
            raise serializers.ValidationError("give either parts (with their md5 and sha256) or part_numbers")
        return attrs


class PartUrlSerializer(serializers.Serializer):
    """Where to ``PUT`` one part (the body is the part's bytes, nothing else) and the headers the PUT
    must carry (``Content-MD5``, ``x-amz-checksum-sha256``: the URL is signed for them)."""

    part_number = serializers.IntegerField()
    url = serializers.URLField()
    headers = serializers.DictField(child=serializers.CharField())


class PartUrlsSerializer(serializers.Serializer):
    """Presigned part URLs, valid ``expires_in`` seconds."""

    expires_in = serializers.IntegerField()
    parts = PartUrlSerializer(many=True)


class UploadCompleteSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/uploads/<id>/complete/``."""

    sha256 = serializers.CharField(required=False, allow_blank=True, default="", max_length=64,
                                   help_text="The file's hex digest, if not given when the upload started")


def _answer(upload: Upload, code: int = status.HTTP_200_OK) -> Response:
    parts = uploads.uploaded_parts(upload)
    upload = Upload.objects.select_related("model", "version", "created_by").get(pk=upload.pk)
    return Response(UploadSerializer(upload, context={"parts": parts}).data, status=code)


def _upload_for(request, upload_id, action: Action = Action.CHANGE) -> Upload:
    """The upload ``upload_id`` of the requesting user (any for an administrator), once the principal may
    do ``action`` on its model.

    Raises:
        NotFound: no such upload, or another user's (HTTP 404).
        Forbidden: the principal may no longer do ``action`` on the model (HTTP 403).
    """
    upload = uploads.get_upload(upload_id, request.user)
    require(Principal.of(request), action, model=upload.model)
    return upload


class UploadStartView(APIView):
    """``POST /api/v1/models/<name>/uploads/``: open a multipart upload for a new version."""

    @extend_schema(request=UploadCreateSerializer,
                   responses={201: UploadSerializer, **error_responses(403, 404, 503)})
    def post(self, request, model_name: str):
        data = UploadCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        model_for(Principal.of(request), model_name, Action.CHANGE)
        fields = data.validated_data
        upload = uploads.start_upload(
            model_name=model_name, filename=fields["filename"], size=fields["size"], sha256=fields["sha256"],
            part_size=fields["part_size"], metadata=fields["metadata"], tags=fields["tags"],
            lineage={key: fields[key] for key in LINEAGE_FIELDS}, signature=fields["signature"],
            max_batch_size=fields["max_batch_size"], actor=request.user,
        )
        return _answer(upload, status.HTTP_201_CREATED)


class UploadDetailView(APIView):
    """``GET`` an upload's state and the parts S3 holds; ``DELETE`` aborts it."""

    @extend_schema(responses={200: UploadSerializer, **error_responses(404, 503)})
    def get(self, request, upload_id):
        return _answer(_upload_for(request, upload_id, Action.VIEW))

    @extend_schema(responses={200: UploadSerializer, **error_responses(403, 404, 409, 503)})
    def delete(self, request, upload_id):
        upload = uploads.abort_upload(_upload_for(request, upload_id), actor=request.user)
        return _answer(upload)


class UploadPartUrlsView(APIView):
    """``POST {"parts": [{"part_number", "md5", "sha256"}, …]}`` (or ``{"part_numbers": [1, 2, …]}``):
    presigned ``PUT`` URLs for those parts."""

    @extend_schema(request=PartUrlsRequestSerializer,
                   responses={200: PartUrlsSerializer, **error_responses(403, 404, 409)})
    def post(self, request, upload_id):
        data = PartUrlsRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = _upload_for(request, upload_id)
        declared = data.validated_data.get("parts")
        urls = uploads.presign_parts(upload, data.validated_data.get("part_numbers"),
                                     declared=[dict(p) for p in declared] if declared is not None else None)
        return Response({"expires_in": settings.UPLOAD_PART_URL_SECONDS,
                         "parts": [{"part_number": n, "url": url, "headers": headers}
                                   for n, (url, headers) in urls.items()]})


class UploadCompleteView(APIView):
    """``POST``: every part is sent; verify the file and register the version (in a worker).

    Answers 202 with the upload VERIFYING (or already COMPLETED); poll ``GET`` for the outcome.
    """

    @extend_schema(request=UploadCompleteSerializer,
                   responses={202: UploadSerializer, **error_responses(403, 404, 409, 503)})
    def post(self, request, upload_id):
        data = UploadCompleteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = _upload_for(request, upload_id)
        upload = uploads.complete_upload(upload, sha256=data.validated_data["sha256"], actor=request.user)
        return _answer(upload, status.HTTP_202_ACCEPTED)
