"""``manage.py configure_s3_cors [ORIGIN ...]``: let the upload page PUT parts to the bucket."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from registry.storage import ArtifactStore, StorageError


class Command(BaseCommand):
    help = ("Set the artifact bucket's CORS rules so pages on ORIGIN (default: settings.S3_CORS_ORIGINS, "
            "from MODELYARD_S3_CORS_ORIGINS) may upload parts to presigned URLs from the browser.")

    def add_arguments(self, parser):
        parser.add_argument("origins", nargs="*", help="e.g. https://modelyard.example.com")

    def handle(self, *args, origins: list[str], **options):
        origins = origins or list(settings.S3_CORS_ORIGINS)
        if not origins:
            raise CommandError("no origins: pass some or set MODELYARD_S3_CORS_ORIGINS")
        store = ArtifactStore()
        try:
            if settings.S3_CREATE_BUCKET:
                store.ensure_bucket()
            store.allow_browser_uploads(origins)
        except StorageError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"bucket {store.bucket}: browser uploads allowed from {', '.join(origins)}")
