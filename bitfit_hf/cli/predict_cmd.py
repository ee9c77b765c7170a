"""``bitfit-hf predict ADAPTER TEXT...``: the stock base plus the adapter, on a few texts.

Sequence classification prints the top labels with their scores (softmax; sigmoid for multi-label adapters;
regression: the value); sentence pairs are written ``first ||| second`` (or tab-separated in ``--file``);
token classification prints ``word/TAG`` for every word; extractive QA takes ``question ||| context`` and
reads a context of any length in overlapping windows (``--doc-stride``).

Inputs are never changed silently. Refused (one error line, exit 2, before the model loads): a pair for a
tagging adapter (it would tag the first half only); a pair for a classifier trained on single texts, or a
single text for one trained on pairs (adapters record their text columns, as the glue recipe's do; older
adapters take both); a QA question without a context. Run with a warning on stderr: a text longer than the
model reads (``--max-length``, lowered to the tokenizer's and the model's limit) is read up to that limit,
and the warning says so (the tagger names the words it left untagged, ``word/?``).

Answers come from bitfit_hf.inference, as the server's and the pipelines' do.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Tuple

from bitfit_hf.adapters.task_types import ANSWERED, SEQ_CLS, TOKEN_CLS
from bitfit_hf.cli.adapter_source import load_adapter_files, load_tokenizer, local_path
from bitfit_hf.cli.errors import CliError
from bitfit_hf.inference.inputs import DOC_STRIDE, InputRefused, check_items

PAIR_SEPARATOR = "|||"


def register(verbs) -> None:
    parser = verbs.add_parser("predict", help="run an adapter on texts (labels with scores, tags, or answers)",
                              description=" ".join(__doc__.split("\n\n")[1:3]).replace("\n", " "))
    parser.add_argument("adapter", type=local_path, help="adapter folder, or Hub id")
    parser.add_argument("texts", nargs="*", metavar="TEXT", help=f"inputs; a pair as 'first {PAIR_SEPARATOR} second'")
    parser.add_argument("--file", type=local_path, help="read inputs from this file, one per line (a tab separates a pair)")
    parser.add_argument("--top-k", type=int, default=1, help="labels to print per input (classification)")
    parser.add_argument("--revision", help="branch, tag or commit of a Hub adapter")
    parser.add_argument("--max-length", type=int, default=512, help="tokens read per input (per window for QA)")
    parser.add_argument("--doc-stride", type=int, default=DOC_STRIDE, help="QA: tokens two neighbouring windows share")
    parser.add_argument("--max-answer-len", type=int, default=30, help="QA: the longest answer, in tokens")
    parser.add_argument("--handle-impossible-answer", action="store_true",
                        help="QA: the empty answer competes with the spans (for models trained on SQuAD 2.0)")
    parser.set_defaults(run=run)


def read_inputs(texts: List[str], file: Optional[str]) -> List[Tuple[str, Optional[str]]]:
    """(text, pair-or-None) for every input, from the arguments or the file."""
    if texts and file:
        raise CliError("give texts or --file, not both.")
    if file:
        if not os.path.isfile(file):
            raise CliError(f"no such file: {file!r}.")
        with open(file, encoding="utf-8") as handle:
            lines = [line.rstrip("\n") for line in handle if line.strip()]
        rows = [tuple(line.split("\t", 1)) if "\t" in line else (line, None) for line in lines]
    else:
        rows = [tuple(p.strip() for p in t.split(PAIR_SEPARATOR, 1)) if PAIR_SEPARATOR in t else (t, None) for t in texts]
    if not rows:
        raise CliError("nothing to predict: give one or more TEXT arguments or --file.")
    return [(row[0], row[1] if len(row) > 1 else None) for row in rows]


def run(args: argparse.Namespace) -> int:
    for flag, value, least in (("--top-k", args.top_k, 1), ("--max-length", args.max_length, 1),
                               ("--doc-stride", args.doc_stride, 0), ("--max-answer-len", args.max_answer_len, 1)):
        if value < least:
            raise CliError(f"{flag} must be at least {least}.")
    inputs = read_inputs(args.texts, args.file)
    adapter, folder = load_adapter_files(args.adapter, args.revision)
    task = adapter.config.task_type
    if task not in ANSWERED:
        raise CliError(f"predict handles classification, tagging and QA adapters; this one is {task or 'untyped'} "
                       f"({adapter.config.architecture}). Load it with AutoBitFitModel.from_pretrained instead.")
    items = check_inputs(adapter.config, inputs)  # before any model is loaded
    tokenizer = load_tokenizer(folder, adapter.config)
    if tokenizer is None:
        raise CliError(f"no tokenizer beside the adapter or at its base {adapter.config.base_model_name_or_path!r}.")
    if task != SEQ_CLS and not getattr(tokenizer, "is_fast", False):
        raise CliError("tagging and QA need the word and character offsets of a fast tokenizer (a tokenizer.json "
                       "beside the adapter).")
    from bitfit_hf.adapters.auto import AutoBitFitModel
    from bitfit_hf.inference.predictor import Predictor

    model = AutoBitFitModel.from_pretrained(adapter).eval()
    predictor = Predictor(model, tokenizer, task, max_length=args.max_length, doc_stride=args.doc_stride)
    try:
        features = predictor.features(items)
    except InputRefused as err:
        raise CliError(_numbered(str(err))) from None
    answers = predictor.answers(features, len(items), top_k=args.top_k if task == SEQ_CLS else None,
                                max_answer_len=args.max_answer_len, handle_impossible_answer=args.handle_impossible_answer)
    limit = predictor.limit
    for number, ((text, pair), feature, found) in enumerate(zip(inputs, _first_features(features, len(items)), answers), 1):
        if task == SEQ_CLS:
            length = feature.meta.get("tokens") or 0
            if length > limit.tokens:
                _warn(number, f" is {length} tokens long; the model read the first {limit.tokens} ({limit.why}), "
                              "the rest was not used.")
            print(_show_classification(found, model.config, text, pair))
        elif task == TOKEN_CLS:
            untagged, words = found["untagged"], len(feature.meta["words"])
            if untagged:
                _warn(number, f": words {untagged[0] + 1}-{untagged[-1] + 1} of {words} are past the {limit.tokens}-token "
                              f"limit and were not tagged (shown as word/?; {limit.why}).")
            print(found["tagged"])
        else:
            print(f"{found['answer']}\t{found['score']:.4f}\t{text}")
    return 0


def _numbered(message: str) -> str:
    """The inference layer names items ``inputs[i]``; the command line numbers them from 1."""
    import re

    return re.sub(r"inputs\[(\d+)\]", lambda m: f"input {int(m.group(1)) + 1}", message)


def _first_features(features, n_items: int):
    first = {}
    for feature in features:
        first.setdefault(feature.item, feature)
    return [first[i] for i in range(n_items)]


def _warn(number: int, message: str) -> None:
    print(f"bitfit-hf predict: warning: input {number}{message}", file=sys.stderr)


def _show_classification(found, config, text: str, pair: Optional[str]) -> str:
    shown = text + (f" {PAIR_SEPARATOR} {pair}" if pair else "")
    if getattr(config, "problem_type", None) == "regression":
        return f"{found[0]['score']:.4f}\t{shown}"
    return ", ".join(f"{a['label']} {a['score']:.4f}" for a in found) + f"\t{shown}"


def _shown(text: str, pair: Optional[str]) -> str:
    full = text if pair is None else f"{text} {PAIR_SEPARATOR} {pair}"
    return repr(full if len(full) <= 60 else full[:57] + "...")


def check_inputs(config, inputs: List[Tuple[str, Optional[str]]]) -> list:
    """The inputs as the inference layer's items, or a one-line refusal (before any model is loaded): a pair
    for a tagger, and the checks of :func:`bitfit_hf.inference.inputs.check_items`."""
    task = config.task_type
    for number, (text, pair) in enumerate(inputs, start=1):
        if task == TOKEN_CLS and pair is not None:
            raise CliError(f"a tagging adapter tags one sentence per input; input {number} is a pair "
                           f"({_shown(text, pair)}). Give each sentence as an input of its own (no "
                           f"'{PAIR_SEPARATOR}', no tab in --file).")
    items = [text for text, _ in inputs] if task == TOKEN_CLS else list(inputs)
    try:
        check_items(config, items, where=lambda i: f"input {i + 1}",
                    pair_layout=f"'first {PAIR_SEPARATOR} second' (a tab between them in --file)")
    except InputRefused as err:
        raise CliError(str(err)) from None
    return items
