"""``manage.py collect_garbage [--dry-run] [--grace-seconds N]``: run the artifact garbage collection now."""

import json

from django.core.management.base import BaseCommand, CommandError

from registry.gc import collect_garbage
from registry.storage import StorageError


class Command(BaseCommand):
    help = (
        "Remove S3 objects that no live model version references and abandoned upload staging objects, "
        "older than the grace period, and print what was done (with --dry-run: what would be)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="only report; delete nothing")
        parser.add_argument("--grace-seconds", type=int, default=None,
                            help="keep objects younger than this (default: MODELYARD_GC_GRACE_SECONDS)")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print the full report as JSON")

    def handle(self, *args, dry_run: bool, grace_seconds: int | None, as_json: bool, **options):
        if grace_seconds is not None and grace_seconds < 0:
            raise CommandError("--grace-seconds must not be negative")
        try:
            report = collect_garbage(dry_run=dry_run, grace_seconds=grace_seconds)
        except StorageError as exc:
            raise CommandError(f"garbage collection stopped: {exc.message}") from exc
        if as_json:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
            return
        for key in report.deleted_keys:
            self.stdout.write(f"{'would delete' if dry_run else 'deleted'} {key}")
        for key in report.aborted_uploads:
            self.stdout.write(f"{'would abort' if dry_run else 'aborted'} upload {key}")
        self.stdout.write(report.summary())
