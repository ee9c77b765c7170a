"""``bitfit-hf study``: reproduce the paper's findings (the same options as ``python -m bitfit_hf.study``)."""

from __future__ import annotations

import argparse
import sys


def register(verbs) -> None:
    from bitfit_hf.study.command import add_arguments

    parser = verbs.add_parser(
        "study", help="reproduce the BitFit paper's claims: a grid of recipe runs and a report",
        description="Run a grid of methods x tasks x seeds x training sizes through the recipes (resumable), then "
                    "write report.md, results.json and figures with a verdict per claim of the paper.",
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bitfit_hf.study.command import run as run_study

    return run_study(args, ["bitfit-hf", *sys.argv[1:]])
