"""Registered models: create one, edit its description and tags, look one up by name.

Each function takes explicit arguments, runs in one transaction where it writes, and raises
``modelyard.errors`` exceptions that views map to HTTP. The tag rules here are the versions' too.
"""

from functools import cache

from django.db import IntegrityError, connections, router, transaction

from accounts.access import can_see
from accounts.models import Membership, Team
from accounts.services import default_team
from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard.prebuilt import Columns
from modelyard_agent.formats.names import InvalidName, validate_name
from registry.models import RegisteredModel
from registry.signals import model_tags_changed


def validate_tags(tags) -> dict[str, str]:
    """Check a model's or a version's tags: ``None`` or a dict of string keys (1-128 characters, no ``=``)
    to string values (at most 1024 characters). Returns a copy (``{}`` for None); raises InvalidInput."""
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise InvalidInput("tags must be a JSON object of string keys and string values")
    for key, value in tags.items():
        if not isinstance(key, str) or not key.strip() or len(key) > 128:
            raise InvalidInput(f"tag key {key!r} must be a non-empty string of at most 128 characters")
        if "=" in key:  # searches read ?tag=key=value: a key with '=' could never be found
            raise InvalidInput(f"tag key {key!r} must not contain '='")
        if not isinstance(value, str) or len(value) > 1024:
            raise InvalidInput(f"tag {key!r} must have a string value of at most 1024 characters")
    return dict(tags)


def create_model(*, name: str, description: str = "", tags=None, team=None, actor=None) -> RegisteredModel:
    """Register a new model name.

    Args:
        name: the model name; normalised and checked against ``modelyard_agent.formats.names``.
        team: the owning ``accounts.Team`` (callers check the actor may create models there);
            None for the default team.
        description: free text.
        tags: a dict of string keys to string values.
        actor: the requesting user.

    Returns:
        The new RegisteredModel.

    Raises:
        InvalidInput: the name or tags are invalid.
        Conflict: a model with that name exists.
    """
    try:
        clean_name = validate_name(name)
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from exc
    clean_tags = validate_tags(tags)
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                name=clean_name, description=description or "", tags=clean_tags, created_by=acting_user(actor),
                team=team or default_team(),
            )
            record_audit_event(
                action=AuditAction.MODEL_CREATED, actor=actor, obj_type="model", obj_id=model.pk, model=model,
                data={"name": model.name, "team": model.team.name},
            )
    except IntegrityError as exc:
        raise Conflict(f"a model named {clean_name!r} already exists") from exc
    return model


def update_model(*, name: str, description: str | None = None, tags=None, actor=None) -> RegisteredModel:
    """Change a model's description and/or tags (``None`` leaves a field as it is); audited with before/after.

    The model is read and written under its row lock (as ``register_version`` and ``set_alias`` take it), so
    concurrent changes are serialised: none writes back a field another has just changed, and each audit
    event's ``from`` is what the model really held. Idempotent: setting what it holds writes nothing.

    Raises:
        NotFound: no such model.
        InvalidInput: invalid tags.
    """
    found = get_model(name)
    clean = None if tags is None else validate_tags(tags)
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().get(pk=found.pk)
        changes = {}
        if description is not None and description != model.description:
            changes["description"] = {"from": model.description, "to": description}
            model.description = description
        if clean is not None and clean != model.tags:
            changes["tags"] = {"from": model.tags, "to": clean}
            model.tags = clean
        if changes:
            model.save(update_fields=["description", "tags", "updated_at"])
            record_audit_event(action=AuditAction.MODEL_UPDATED, actor=actor, obj_type="model", obj_id=model.pk,
                               model=model, data=changes)
            if "tags" in changes:
                model_tags_changed.send(sender=RegisteredModel, model=model, before=changes["tags"]["from"],
                                        after=changes["tags"]["to"], actor=actor)
    return model


def get_model(name: str, *, visible_to=None) -> RegisteredModel:
    """Return the model called ``name``.

    Args:
        name: the model's name.
        visible_to: an ``accounts.access.Principal``; when given, a model of a team it cannot
            read is reported exactly as a missing one, so names do not leak across teams. Its role in
            the model's team (not an administrator's) is read in the same query and recorded on it
            (``Principal.note_role``), so the permission check that follows asks the database nothing.

    Raises:
        NotFound: there is none (or none the principal may read).
    """
    # A NUL cannot be in a name (PostgreSQL's text refuses it, so the query would fail): no such model.
    if "\x00" in name:
        raise NotFound(f"no model named {name!r}")
    # The check that follows needs the principal's role in the model's team: read in the same query.
    reads_role = visible_to is not None and visible_to.is_authenticated and not visible_to.user.is_staff
    model, role = _model_and_role(name, visible_to.user.pk if reads_role else None, reads_role)
    if model is not None and reads_role:
        visible_to.note_role(model.team_id, role)
    if model is None or (visible_to is not None and not can_see(visible_to, model)):
        raise NotFound(f"no model named {name!r}")
    return model


@cache
def _model_query(alias: str, reads_role: bool) -> tuple[str, Columns, Columns]:
    """The SQL of ``_model_and_role`` on database ``alias`` (parameters: with ``reads_role`` the user's id, then
    the name) and the columns of the model and its team, in the SQL's column order; the role is the last column
    (NULL without ``reads_role``)."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    model_columns, team_columns = Columns.of(RegisteredModel, "m", connection), Columns.of(Team, "g", connection)
    team_id = quote(RegisteredModel._meta.get_field("team").column)
    role = (f"(SELECT r.{quote(Membership._meta.get_field('role').column)} FROM {quote(Membership._meta.db_table)} r"
            f" WHERE r.{quote(Membership._meta.get_field('user').column)} = %s"
            f" AND r.{quote(Membership._meta.get_field('team').column)} = m.{team_id} LIMIT 1)"
            if reads_role else "NULL")
    sql = (f"SELECT {model_columns.sql}, {team_columns.sql}, {role} FROM {quote(RegisteredModel._meta.db_table)} m"
           f" JOIN {quote(Team._meta.db_table)} g ON g.{quote(Team._meta.pk.column)} = m.{team_id}"
           f" WHERE m.{quote(RegisteredModel._meta.get_field('name').column)} = %s")
    return sql, model_columns, team_columns


def _model_and_role(name: str, user_id: int | None, reads_role: bool) -> tuple[RegisteredModel | None, str | None]:
    """The model called ``name`` with its team loaded, and (with ``reads_role``) user ``user_id``'s role in that
    team (None: not a member), in one query whose SQL is built once per process (``modelyard.prebuilt``: through
    the ORM, compiling this query cost about as much as the rest of a page of versions); ``(None, None)`` when
    there is no such model."""
    alias = router.db_for_read(RegisteredModel)
    connection = connections[alias]
    sql, model_columns, team_columns = _model_query(alias, reads_role)
    with connection.cursor() as cursor:
        cursor.execute(sql, [user_id, name] if reads_role else [name])
        row = cursor.fetchone()
    if row is None:
        return None, None
    model = model_columns.instance(alias, row[:len(model_columns)], connection)
    RegisteredModel.team.field.set_cached_value(model, team_columns.instance(alias, row[len(model_columns):-1],
                                                                             connection))
    return model, row[-1]
