"""``bitfit-hf export-peft ADAPTER OUT_DIR``: the adapter as a PEFT BEFT adapter, loadable with plain ``peft``."""

from __future__ import annotations

import argparse
import os

from bitfit_hf.cli.adapter_source import add_adapter_arguments, load_adapter_files


def register(verbs) -> None:
    parser = verbs.add_parser(
        "export-peft", help="write the adapter as a PEFT BEFT adapter (loads with peft.PeftModel, no bitfit-hf)",
        description="Write a folder that peft.PeftModel.from_pretrained(stock_model, OUT_DIR) loads without "
                    "bitfit-hf: trained Linear biases become BEFT bias deltas, trained norms and the head saved "
                    "modules. Parts PEFT cannot express (added biases, GPT-2's fused c_attn thirds, other methods) "
                    "are refused with an error naming them. Export into ADAPTER/peft to push the copy with the "
                    "adapter (the model card then shows how to load it with PEFT).")
    add_adapter_arguments(parser, "where to write the PEFT adapter: a new or empty folder, or an earlier PEFT export (replaced atomically)", base_model=True)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from bitfit_hf.adapters.peft_export import export_peft

    adapter, _ = load_adapter_files(args.adapter, args.revision)
    out = export_peft(adapter, args.out_dir, base_model=args.base_model)
    print(os.path.abspath(out))
    return 0
