from django.apps import AppConfig


class RegistryConfig(AppConfig):
    """Registered models, model versions and their artifacts."""

    name = "registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Before any connection opens: SQLite connections get the case-folding function searches use.
        import modelyard.db  # noqa: F401
