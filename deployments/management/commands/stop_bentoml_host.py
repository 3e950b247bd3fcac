"""``manage.py stop_bentoml_host``: stop the bento processes and the nginx a BentoML host agent left."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from modelyard_agent.bentoml_instances import stop_host
from modelyard_agent.runtimes.base import ServingRuntimeError


class Command(BaseCommand):
    help = ("Stop every bentoml serve process and the nginx that this host's BentoML agent started "
            "(run after stopping the agent itself); the Bento Store is kept.")

    def add_arguments(self, parser):
        parser.add_argument("--root", type=Path, default=None,
                            help="the agent's BentoML directory (default: MODELYARD_AGENT_BENTOML_ROOT)")
        parser.add_argument("--inference-url", required=True, help="the host's inference URL (its nginx)")

    def handle(self, *args, root: Path | None, inference_url: str, **options):
        try:
            stopped = stop_host(root or Path(settings.AGENT_BENTOML_ROOT), inference_url)
        except ServingRuntimeError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"stopped {len(stopped)} bentoml serve instance(s) and nginx")
