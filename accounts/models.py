"""Teams, memberships and hashed API tokens."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.choices import Role, Scope


class Team(models.Model):
    """A group of users that owns registered models.

    ``name`` follows the model-name grammar's character set (lower case, digits, ``-``, ``_``).
    """

    name = models.SlugField(max_length=63, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """One user's role in one team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.team}"


class RevocableQuerySet(models.QuerySet):
    """Queries of secrets that expire and can be revoked (``expires_at``, ``revoked_at``): API tokens and
    ``registry.models.InferenceKey``."""

    def usable(self) -> "RevocableQuerySet":
        """Rows neither revoked nor expired now."""
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class HashedSecret(models.Model):
    """The columns a secret shown once and stored only as a digest has (``accounts.tokens``): API tokens and
    ``registry.models.InferenceKey``. ``prefix`` (the secret's first characters, not secret) names the row;
    ``digest`` is the hex SHA-256 of the whole secret; ``expires_at``/``revoked_at`` end its use."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = RevocableQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ApiToken(HashedSecret):
    """An API token: only a SHA-256 digest of its secret is stored, the secret is shown once.

    ``prefix`` (the token's first characters, not secret) finds the row; ``digest`` is the hex
    SHA-256 of the whole token. ``scopes`` is a list of :class:`Scope` values. ``team`` limits
    the token to one team's models when set. ``expires_at``/``revoked_at`` end its use;
    ``last_used_at`` is refreshed at most once a minute.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    scopes = models.JSONField(default=list)
    # PROTECT: deleting a team must not silently delete (or, with SET_NULL, widen) its tokens;
    # accounts.services.delete_team refuses while usable ones remain.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="api_tokens")

    def allows(self, scope: str) -> bool:
        """True when the token carries ``scope``; every scope includes ``read``."""
        granted = set(self.scopes or [])
        return scope in granted or (scope == Scope.READ and bool(granted))
