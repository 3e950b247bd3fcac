"""The one state-machine helper (modelyard/states.py) behind targets, rollouts and uploads."""

import pytest

from deployments.choices import DEPLOYMENT_MACHINE, TARGET_MACHINE, DeploymentStatus, TargetState
from modelyard.errors import Conflict
from modelyard.states import IllegalTransition
from registry.choices import UploadStatus
from registry.uploads import UPLOAD_MACHINE

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("machine,current,wanted", [
    (TARGET_MACHINE, TargetState.READY, TargetState.LOADING),
    (DEPLOYMENT_MACHINE, DeploymentStatus.ROLLED_BACK, DeploymentStatus.RUNNING),
    (UPLOAD_MACHINE, UploadStatus.COMPLETED, UploadStatus.OPEN),
])
def test_every_machine_refuses_a_move_off_its_table_with_the_one_exception_a_409(machine, current, wanted):
    assert not machine.allows(current, wanted)
    assert issubclass(IllegalTransition, Conflict) and IllegalTransition.status_code == 409


def test_a_move_is_a_compare_and_set_on_the_state_read():
    from deployments.models import Deployment, DeploymentTarget, ServingHost
    from registry.choices import ArtifactFormat
    from registry.models import ModelVersion, RegisteredModel

    model = RegisteredModel.objects.create(name="iris", next_version=2)
    version = ModelVersion.objects.create(model=model, version=1, format=ArtifactFormat.TRITON_MODEL_DIR,
                                          artifact_key="k", artifact_sha256="0" * 64, artifact_size=1)
    host = ServingHost.objects.create(name="gpu-0", inference_url="http://gpu-0:8000")
    target = DeploymentTarget.objects.create(deployment=Deployment.objects.create(model=model, version=version),
                                             host=host)
    stale = DeploymentTarget.objects.get(pk=target.pk)
    assert TARGET_MACHINE.move(target, TargetState.STAGING, error="") is True and target.state == TargetState.STAGING
    assert TARGET_MACHINE.move(target, TargetState.STAGING) is False  # a repeat changes nothing
    assert TARGET_MACHINE.move(stale, TargetState.CANCELLED) is False  # read as pending; it is staging now
    assert DeploymentTarget.objects.get(pk=target.pk).state == TargetState.STAGING
    with pytest.raises(IllegalTransition, match=f"deployment target {target.pk} is staging; it cannot become pending"):
        TARGET_MACHINE.move(target, TargetState.PENDING)
