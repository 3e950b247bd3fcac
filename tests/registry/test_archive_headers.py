"""Archives whose headers lie are refused at upload: sizes and CRCs are checked against the bytes produced."""

import io
import struct
import zipfile

import pytest

from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, extract_version_dir, inspect_triton_archive
from tests.registry.conftest import VALID_CONFIG

LIMITS = ArchiveLimits(max_unpacked_bytes=1 << 30, max_compression_ratio=200, max_members=100)
WEIGHTS = b"w" * 4096
MODEL_PY = b"class TritonPythonModel:\n    pass\n"


def honest_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("iris/config.pbtxt", VALID_CONFIG)
        archive.writestr("iris/1/model.py", MODEL_PY)
        archive.writestr("iris/1/weights.bin", WEIGHTS)
    return buffer.getvalue()


def patched(data: bytes, member: str, *, size: int | None = None, crc: int | None = None) -> bytes:
    """Rewrite ``member``'s central-directory entry (what readers trust) to claim another size or CRC."""
    data = bytearray(data)
    offset = 0
    while (offset := data.find(b"PK\x01\x02", offset)) != -1:
        name_length = struct.unpack_from("<H", data, offset + 28)[0]
        if data[offset + 46: offset + 46 + name_length].decode() == member:
            if crc is not None:
                struct.pack_into("<I", data, offset + 16, crc)
            if size is not None:
                struct.pack_into("<I", data, offset + 24, size)
            return bytes(data)
        offset += 4
    raise AssertionError(f"{member} not in the archive")


@pytest.mark.parametrize("lie,message", [
    # zipfile stops at the declared size, so the CRC over what it gave out is what fails
    ({"size": 100}, "Bad CRC-32"),
    ({"size": 10_000}, "holds 4096 of its declared 10000 bytes"),
    ({"crc": 0x12345678}, "Bad CRC-32"),
])
def test_a_zip_member_whose_header_lies_is_refused_at_inspection(tmp_path, lie, message):
    path = tmp_path / "iris.zip"
    path.write_bytes(patched(honest_zip(), "iris/1/weights.bin", **lie))
    with pytest.raises(ArchiveError, match=message):
        inspect_triton_archive(path, LIMITS)


def test_the_honest_zip_passes_and_extracts(tmp_path):
    path = tmp_path / "iris.zip"
    path.write_bytes(honest_zip())
    layout = inspect_triton_archive(path, LIMITS)
    assert extract_version_dir(path, layout, tmp_path / "out", LIMITS) == len(WEIGHTS) + len(MODEL_PY)


def test_the_unpacked_size_limit_counts_the_bytes_produced(tmp_path):
    path = tmp_path / "iris.zip"
    path.write_bytes(honest_zip())
    with pytest.raises(ArchiveError, match="unpacks to more than 2048 bytes"):
        inspect_triton_archive(path, ArchiveLimits(max_unpacked_bytes=2048, max_compression_ratio=200,
                                                   max_members=100))


def test_the_upload_api_answers_400_and_stores_no_version(api_client, s3_endpoint, tmp_path):
    from registry.models import ModelVersion
    from tests.registry.format_builders import upload

    assert api_client.post("/api/v1/models/", {"name": "iris"}, format="json").status_code == 201
    path = tmp_path / "iris.zip"
    path.write_bytes(patched(honest_zip(), "iris/1/weights.bin", crc=1))
    answer = upload(api_client, "iris", path)
    assert answer.status_code == 400 and "CRC" in str(answer.json())
    assert not ModelVersion.objects.filter(model__name="iris").exists()
