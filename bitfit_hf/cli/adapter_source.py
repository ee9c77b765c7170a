"""Reading the adapter a verb is given: a local folder or a Hub id, with one clear error otherwise."""

from __future__ import annotations

import os

from bitfit_hf.cli.errors import CliError


def local_path(value: str) -> str:
    """An argparse ``type`` for paths: ``~`` is the home folder, also where the shell leaves it (``--file=~/x``);
    a Hub id never starts with ``~`` and is returned as it is."""
    return os.path.expanduser(value)


def add_adapter_arguments(parser, out_dir_help: str | None = None, base_model: bool = False) -> None:
    """The arguments every verb that reads an adapter shares: ``adapter`` (folder or Hub id),
    ``--revision``; optionally ``out_dir`` and ``--base-model``."""
    parser.add_argument("adapter", type=local_path, help="adapter folder, or Hub id")
    if out_dir_help:
        parser.add_argument("out_dir", type=local_path, help=out_dir_help)
    parser.add_argument("--revision", help="branch, tag or commit of a Hub adapter")
    if base_model:
        parser.add_argument("--base-model", type=local_path, help="load this base instead of the one the adapter records")


def check_local_or_hub_id(source: str) -> None:
    """Refuse a path that looks local but does not exist, before any Hub call is tried with it."""
    looks_local = os.path.isabs(source) or source.startswith((".", "~")) or source.count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(source)):
        raise CliError(f"no adapter directory at {source!r}: pass the output folder of a run, or a Hub id "
                       "('namespace/name').")


def load_adapter_files(source: str, revision: str | None = None):
    """The :class:`~bitfit_hf.adapters.adapter.BitFitAdapter` at ``source`` and its local folder."""
    from bitfit_hf.adapters.adapter import BitFitAdapter
    from bitfit_hf.hub.client import download_adapter

    check_local_or_hub_id(source)
    if os.path.isdir(os.path.expanduser(source)):
        if revision:
            raise CliError(f"--revision applies to Hub repos; {source!r} is a local directory.")
        folder = os.path.expanduser(source)
    else:
        folder, _ = download_adapter(source, revision=revision)
    return BitFitAdapter.from_directory(folder), folder


def load_tokenizer(folder: str, config, base_model=None):
    """The tokenizer saved beside the adapter, else the base model's (its packaged copy when there is
    one, see :func:`~bitfit_hf.data.assets.packaged_copy_or`); ``None`` when neither has one."""
    from transformers import AutoTokenizer

    from bitfit_hf.data.assets import named_model_or, packaged_copy_or

    def sources():  # the base is resolved only when the adapter's folder has no tokenizer
        yield folder
        if base_model:
            yield named_model_or(base_model)
        elif config.base_model_name_or_path:
            yield packaged_copy_or(config.base_model_name_or_path, config.base_model_revision)

    for source in sources():
        try:
            return AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError):
            continue
    return None
