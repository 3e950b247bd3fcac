"""The ``modelyard`` command: register versions, move aliases, deploy and wait, from CI.

Configuration comes from the environment: ``MODELYARD_URL`` (default http://127.0.0.1:8080)
and ``MODELYARD_TOKEN`` (an API token, sent as ``Authorization: Bearer <token>``: make one on the
server's /account/tokens/ page, with ``POST /api/v1/tokens/``, or ``manage.py create_api_token <user>``).
Every command exits 0 on success, 1 when the server refused or the deployment failed, and
2 on bad usage; errors go to stderr as the server's own message.

A file larger than ``--multipart-threshold`` (default 32 MiB) goes straight to S3 as a multipart
upload through presigned part URLs, several parts at a time; ``--resume UPLOAD_ID`` continues one
that was interrupted, skipping the parts S3 already holds.

Examples::

    modelyard register iris ./model_repository/iris --metadata '{"commit": "abc123"}'
    modelyard register iris ./iris.onnx --max-batch-size 8
    modelyard register detector ./detector.pt --signature signature.json
    modelyard register resnet ./resnet.tar --resume 4f6c0d9e-…
    modelyard alias set iris production 3 [--reason "…"]   # lock, unlock: protect an alias
    modelyard deploy iris 3 --host gpu-0 --host gpu-1 --wait
    modelyard wait 42 --timeout 900
    modelyard promote run 7 --wait     # exit 1 unless the policy promoted
    modelyard replay start iris 4 --against production --max-requests 500 --argmax probabilities --wait
    modelyard replay show 12           # agreement, differences, latency of both versions
    modelyard key create checkout --model iris --expires-in 90d   # the key is printed this once
    modelyard key list --model iris ; modelyard key revoke 5
"""

import argparse
import os
import sys

from modelyard_cli import capture, deployments, keys, profiles, promotions, registry, replays
from modelyard_cli.client import Client, CLIError


def build_parser() -> argparse.ArgumentParser:
    """The ``modelyard`` parser: one subcommand per command, in the order ``--help`` lists them; each
    subcommand's ``func`` runs it with the client and the parsed arguments."""
    parser = argparse.ArgumentParser(prog="modelyard", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    registry.add_register_parser(sub)
    registry.add_model_parser(sub)
    registry.add_alias_parser(sub)
    deployments.add_deploy_parser(sub)
    deployments.add_wait_parser(sub)
    promotions.add_promote_parser(sub)
    profiles.add_profile_parser(sub)
    profiles.add_profiles_parser(sub)
    deployments.add_canary_parser(sub)
    replays.add_replay_parser(sub)
    capture.add_capture_parser(sub)
    keys.add_key_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``modelyard`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        client = Client(os.environ.get("MODELYARD_URL", "http://127.0.0.1:8080"), os.environ.get("MODELYARD_TOKEN", ""))
        return args.func(client, args)
    except CLIError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
