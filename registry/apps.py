from django.apps import AppConfig


class RegistryConfig(AppConfig):
    """Registered models, model versions and their artifacts."""

    name = "registry"
    default_auto_field = "django.db.models.BigAutoField"
