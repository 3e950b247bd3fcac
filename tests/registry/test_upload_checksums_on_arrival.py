"""Part checksums that the store itself checks when a part arrives, on LocalStack's S3.

moto (the other tests' S3) checks no ``Content-MD5`` or ``x-amz-checksum-sha256``, so there the
ETag comparison at completion is what refuses a part whose bytes differ from its declaration
(tests/registry/test_upload_digests.py). AWS S3, MinIO and LocalStack refuse such a part on arrival,
because the presigned part URL is signed for the declared digests and the PUT must carry them.
"""

import pytest
import requests

from registry import uploads
from registry.models import RegisteredModel, Upload
from registry.storage import ArtifactStore
from tests.registry.uploading import declare, part_bytes, put_parts, sha256_of, start

pytestmark = pytest.mark.django_db


def test_the_store_refuses_a_part_whose_bytes_differ_from_its_declared_digests_when_it_arrives(
    api_client, localstack_s3_endpoint, large_archive
):
    RegisteredModel.objects.create(name="iris")
    upload_id = start(api_client, large_archive, sha256=sha256_of(large_archive)).json()["id"]
    answer = api_client.post(f"/api/v1/uploads/{upload_id}/parts/",
                             {"parts": [declare(2, part_bytes(large_archive, 2))]}, format="json")
    (part,) = answer.json()["parts"]
    changed = bytearray(part_bytes(large_archive, 2))
    changed[1000] ^= 0xFF

    refused = requests.put(part["url"], data=bytes(changed), headers=part["headers"], timeout=30)

    assert refused.status_code == 400 and "<Code>BadDigest</Code>" in refused.text, refused.text
    upload = Upload.objects.get(pk=upload_id)
    store = ArtifactStore()
    held = store.client.list_parts(Bucket=store.bucket, Key=upload.staging_key, UploadId=upload.s3_upload_id)
    assert held.get("Parts", []) == []  # nothing of the changed part was kept

    # The declared bytes go through, and the upload completes, checked by the store's own ETags.
    put_parts(api_client, upload_id, large_archive, [1, 2, 3])
    assert api_client.post(f"/api/v1/uploads/{upload_id}/complete/", {}, format="json").status_code == 202
    done = uploads.verify_upload(upload_id)
    assert (done.status, done.verification) == ("completed", "part_etags")
    assert done.version.artifact_sha256 == sha256_of(large_archive)
