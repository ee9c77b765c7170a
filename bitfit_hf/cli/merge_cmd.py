"""``bitfit-hf merge ADAPTER OUT_DIR``: the stock base with the adapter folded in, as a plain checkpoint."""

from __future__ import annotations

import argparse
import os

from bitfit_hf.cli.adapter_source import add_adapter_arguments, load_adapter_files, load_tokenizer


def register(verbs) -> None:
    parser = verbs.add_parser("merge", help="write a plain transformers checkpoint with the adapter folded in",
                              description="Load the adapter's base, apply the adapter and save a checkpoint that "
                                          "AutoModelFor*.from_pretrained loads without bitfit-hf.")
    add_adapter_arguments(parser, "where to write the merged checkpoint: a new or empty folder, or an earlier merged checkpoint (replaced atomically)", base_model=True)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bitfit_hf.adapters.auto import AutoBitFitModel
    from bitfit_hf.adapters.export import export_merged

    adapter, folder = load_adapter_files(args.adapter, args.revision)
    model = AutoBitFitModel.from_pretrained(adapter, base_model=args.base_model)
    out = export_merged(model, args.out_dir, tokenizer=load_tokenizer(folder, adapter.config, args.base_model))
    print(os.path.abspath(out))
    return 0
