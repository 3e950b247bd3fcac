"""``registry.registered_models.get_model`` reads a model, its team and the caller's role in that team in one
query whose SQL is built once (``modelyard.prebuilt``): the same instances the ORM loads, the role a member
holds (None for an outsider, not read for an administrator), and the same 404 for a model the caller may not
see as for none."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.access import Principal
from accounts.choices import Role
from accounts.models import Team
from modelyard.errors import NotFound
from registry.models import RegisteredModel
from registry.registered_models import get_model
from tests.accounts.test_tokens import model_state
from tests.factories import team_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def model():
    team = Team.objects.create(name="vision")
    return RegisteredModel.objects.create(name="resnet", team=team, description="é \"q\"", tags={"k": "v", "n": ""},
                                          next_version=7, capture_fraction=0.25)


def principal(user) -> Principal:
    return Principal(user=user, token=None)


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OWNER])
def test_a_member_gets_the_model_and_team_the_orm_loads_and_its_role_in_one_query(model, role):
    member = team_member(get_user_model().objects.create_user(username=f"m-{role}"), role, model.team)
    asking = principal(member)
    expected = RegisteredModel.objects.select_related("team").get(pk=model.pk)
    with CaptureQueriesContext(connection) as queries:
        found = get_model("resnet", visible_to=asking)
        team, role_read = found.team, asking.role_in(found.team_id)  # loaded with it: no query
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert model_state(found) == model_state(expected) and model_state(team) == model_state(expected.team)
    assert role_read == role and found._state.db == expected._state.db and not found._state.adding


def test_an_outsider_gets_the_404_of_a_missing_model_and_an_administrator_reads_no_role(model):
    outsider = principal(get_user_model().objects.create_user(username="outsider"))
    with pytest.raises(NotFound) as hidden:
        get_model("resnet", visible_to=outsider)
    with pytest.raises(NotFound) as missing:
        get_model("no-such-model", visible_to=outsider)
    assert str(hidden.value).replace("resnet", "X") == str(missing.value).replace("no-such-model", "X")
    admin = principal(get_user_model().objects.create_user(username="admin", is_staff=True))
    with CaptureQueriesContext(connection) as queries:
        assert get_model("resnet", visible_to=admin).pk == model.pk
    assert len(queries) == 1 and "membership" not in queries[0]["sql"], queries[0]["sql"]
    assert model_state(get_model("resnet")) == model_state(RegisteredModel.objects.get(pk=model.pk))
