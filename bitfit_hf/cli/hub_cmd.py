"""``bitfit-hf pull`` and ``bitfit-hf push``: adapters to and from the Hub (docs/hub.md).

There is no ``--token`` flag, so a token never lands in a shell history: it comes from ``HF_TOKEN``
or ``hf auth login``.
"""

from __future__ import annotations

import argparse
import os

from bitfit_hf.cli.adapter_source import local_path
from bitfit_hf.cli.errors import CliError


def register(verbs) -> None:
    pull = verbs.add_parser("pull", help="download an adapter from the Hub (prints the folder and the commit)",
                            description="Download an adapter repo into the Hub cache (or --local-dir); offline with "
                                        "HF_HUB_OFFLINE=1 once cached.")
    pull.add_argument("repo_id", help="'namespace/name'")
    pull.add_argument("--revision", help="branch, tag or commit")
    pull.add_argument("--local-dir", type=local_path, help="also copy the adapter files here")
    pull.set_defaults(run=run_pull)

    push = verbs.add_parser("push", help="push an adapter folder with a generated model card",
                            description="Push the adapter files and a generated model card in one commit (no commit "
                                        "when nothing changed).")
    push.add_argument("directory", type=local_path, help="adapter folder (the output of a run)")
    push.add_argument("repo_id", help="'namespace/name' (created if missing)")
    push.add_argument("--private", action="store_true", default=None, help="create the repo private")
    push.add_argument("--revision", help="branch to push to (created if missing)")
    push.add_argument("--base-model", help="Hub id of the base model (when the adapter records a local path)")
    push.add_argument("--commit-message", default=None)
    push.add_argument("--dataset", action="append", help="Hub dataset id for the card (repeatable)")
    push.add_argument("--license")
    push.set_defaults(run=run_push)


def run_pull(args: argparse.Namespace) -> int:
    from bitfit_hf.hub.client import download_adapter

    directory, commit = download_adapter(args.repo_id, revision=args.revision, local_dir=args.local_dir)
    print(directory)
    print(commit)
    return 0


def run_push(args: argparse.Namespace) -> int:
    from bitfit_hf.hub.client import DEFAULT_COMMIT_MESSAGE, push_adapter_to_hub

    if not os.path.isdir(args.directory):
        raise CliError(f"no adapter directory at {args.directory!r}: pass the output folder of a run.")
    info = push_adapter_to_hub(args.directory, args.repo_id, private=args.private, revision=args.revision,
                               commit_message=args.commit_message or DEFAULT_COMMIT_MESSAGE,
                               base_model=args.base_model, dataset=args.dataset, license=args.license)
    print(info.commit_url)
    return 0
