"""Triton ensembles: the registry records the versions an ensemble composes and refuses missing ones."""

import pytest

from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, inspect_triton_archive, scan_archive
from registry.choices import ArtifactFormat, VersionStatus
from registry.models import EnsembleMember, ModelVersion, RegisteredModel
from tests.registry.conftest import VALID_CONFIG
from tests.registry.format_builders import bucket_keys, ensemble_config, upload, write_tar, write_triton_dir

pytestmark = pytest.mark.django_db

LIMITS = ArchiveLimits(max_unpacked_bytes=1 << 30, max_compression_ratio=200, max_members=100)


@pytest.fixture
def iris_versions(api_client, s3_endpoint, iris_archive):
    """Models ``iris`` with versions 1 and 2, and ``pipeline``, the ensemble's name."""
    for name in ("iris", "pipeline"):
        assert api_client.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
    for expected in (1, 2):
        assert upload(api_client, "iris", iris_archive).json()["version"] == expected
    return ModelVersion.objects.filter(model__name="iris").order_by("version")


def test_it_registers_an_ensemble_with_the_versions_it_composes(api_client, iris_versions, tmp_path):
    archive = write_triton_dir(tmp_path / "pipeline.tar.gz", ensemble_config("pipeline", [("iris", 1), ("iris", -1)]))
    answer = upload(api_client, "pipeline", archive)
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["format"] == "triton_ensemble"
    assert body["ensemble_members"] == [
        {"model": "iris", "version": 1, "requested_version": 1},
        {"model": "iris", "version": 2, "requested_version": -1},
    ]
    assert body["signature"]["platform"] == "ensemble"
    ensemble = ModelVersion.objects.get(model__name="pipeline")
    assert sorted(ensemble.members.values_list("member__version", "requested_version")) == [(1, 1), (2, -1)]
    listed = api_client.get("/api/v1/models/pipeline/versions/").json()["results"][0]
    assert listed["ensemble_members"] == body["ensemble_members"]


def test_the_version_page_links_each_member_of_an_ensemble(api_client, iris_versions, tmp_path, client, user):
    archive = write_triton_dir(tmp_path / "pipeline.tar.gz", ensemble_config("pipeline", [("iris", 2)]))
    assert upload(api_client, "pipeline", archive).status_code == 201
    client.force_login(user)
    html = client.get("/models/pipeline/versions/1/").content.decode()
    assert "Ensemble members" in html and "Triton ensemble" in html
    assert 'href="/models/iris/versions/2/"' in html
    assert "<code>input</code>" in html and "TYPE_FP32" in html


def _with_deleted_v1(iris_versions):
    ModelVersion.objects.filter(model__name="iris", version=1).update(status=VersionStatus.DELETED)


def _with_bento_member(iris_versions):
    bento = RegisteredModel.objects.create(name="scorer")
    ModelVersion.objects.create(model=bento, version=1, format=ArtifactFormat.BENTOML_MODEL, artifact_key="k",
                                artifact_sha256="0" * 64, artifact_size=1)


BAD_ENSEMBLES = {
    "a member version that was never registered": ([("iris", 7)], None, "'iris' version 7"),
    "a member model that is not registered": ([("ghost", -1)], None, "'ghost' (no live version registered)"),
    "a deleted member version": ([("iris", 1)], _with_deleted_v1, "'iris' version 1"),
    "a member that is a BentoML model": ([("scorer", 1)], _with_bento_member, "not a Triton model"),
    "itself as a step": ([("pipeline", -1)], None, "lists itself"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENSEMBLES))
def test_it_refuses_an_ensemble_whose_members_it_does_not_have(api_client, iris_versions, tmp_path, case):
    steps, arrange, message = BAD_ENSEMBLES[case]
    if arrange:
        arrange(iris_versions)
    before = bucket_keys()
    answer = upload(api_client, "pipeline", write_triton_dir(tmp_path / "p.tar.gz", ensemble_config("pipeline", steps)))
    assert answer.status_code == 400, answer.content
    assert message in answer.json()["detail"]
    assert not ModelVersion.objects.filter(model__name="pipeline").exists()
    assert not EnsembleMember.objects.exists()
    assert bucket_keys() == before


def test_the_refusal_names_every_missing_member(api_client, iris_versions, tmp_path):
    steps = [("iris", 1), ("iris", 9), ("ghost", 2)]
    answer = upload(api_client, "pipeline", write_triton_dir(tmp_path / "p.tar.gz", ensemble_config("pipeline", steps)))
    detail = answer.json()["detail"]
    assert "'iris' version 9" in detail and "'ghost' version 2" in detail and "version 1" not in detail


def test_an_empty_version_directory_is_accepted_for_an_ensemble_only(tmp_path):
    ensemble = write_triton_dir(tmp_path / "e.tar.gz", ensemble_config("pipeline", [("iris", 1)]))
    assert inspect_triton_archive(ensemble, LIMITS).files == ()
    plain = write_triton_dir(tmp_path / "p.tar.gz", VALID_CONFIG.decode())
    with pytest.raises(ArchiveError, match="holds no files"):
        inspect_triton_archive(plain, LIMITS)


def test_an_ensemble_config_without_steps_is_refused(api_client, iris_versions, tmp_path):
    config = ensemble_config("pipeline", [("iris", 1)]).split("ensemble_scheduling")[0]
    answer = upload(api_client, "pipeline", write_triton_dir(tmp_path / "p.tar.gz", config))
    assert answer.status_code == 400
    assert answer.json()["detail"] == "config.pbtxt of an ensemble must list its steps in ensemble_scheduling"


def test_scanning_an_archive_lists_members_and_reads_only_the_files_asked_for(tmp_path):
    path = write_tar(tmp_path / "a.tar.xz", {"./": None, "./model.yaml": b"name: a\n", "./weights.bin": b"x" * 10})
    listing = scan_archive(path, LIMITS, wanted=lambda parts: parts == ("model.yaml",))
    assert (listing.kind, listing.compression) == ("tar", "xz")
    assert listing.files == ("model.yaml", "weights.bin")
    assert listing.contents == {"model.yaml": b"name: a\n"}
    with pytest.raises(ArchiveError, match="larger than 4 bytes"):
        scan_archive(path, LIMITS, wanted=lambda parts: True, max_read_bytes=4)
