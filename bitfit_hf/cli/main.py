"""Parser, dispatch and the error contract of ``bitfit-hf`` (one ``error:`` line, exit status 2)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

from bitfit_hf.cli import (
    assets_cmd,
    env_cmd,
    export_peft_cmd,
    hub_cmd,
    info_cmd,
    merge_cmd,
    predict_cmd,
    serve_cmd,
    study_cmd,
    train_cmd,
)
from bitfit_hf.utils.constants import __version__
from bitfit_hf.utils.errors import EXIT_USER_ERROR, UserError
from bitfit_hf.utils.secrets import install_log_redaction, redact_text

PROG = "bitfit-hf"
VERBS = (train_cmd, info_cmd, hub_cmd, merge_cmd, export_peft_cmd, predict_cmd, serve_cmd, assets_cmd, env_cmd, study_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="BitFit and its family of bias-centred fine-tuning methods for the Hugging Face stack.",
        epilog="Run `bitfit-hf VERB --help` for a verb's options. Train: `bitfit-hf train glue` (the recipes; "
               "`bitfit-hf train --help` lists them).",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for module in VERBS:
        module.register(verbs)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return EXIT_USER_ERROR
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    install_log_redaction()  # no token-shaped text in any log line
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below, not at interpreter exit
        return status
    except UserError as err:
        print(f"{PROG} {args.verb}: error: {redact_text(str(err))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{PROG} {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bitfit-hf info X | head`: the reader left; not an error to report
        _silence_stdout()
        return EXIT_BROKEN_PIPE


#: What a shell reports for a process ended by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
