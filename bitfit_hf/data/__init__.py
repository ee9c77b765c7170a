"""Data readers for the offline assets (see :mod:`bitfit_hf.data.assets`) and files of the same formats; the
offline default datasets built from them are :mod:`bitfit_hf.data.offline`'s."""

from bitfit_hf.data.readers import (
    CLAIM_LABELS,
    MOVIE_REVIEW_LABELS,
    NLI_LABELS,
    read_bigbench_claims,
    read_conll,
    read_editorial_articles,
    read_movie_reviews,
    read_snli_jsonl,
    read_squad_json,
    read_tagged_text,
)

__all__ = [
    "CLAIM_LABELS",
    "MOVIE_REVIEW_LABELS",
    "NLI_LABELS",
    "read_bigbench_claims",
    "read_conll",
    "read_editorial_articles",
    "read_movie_reviews",
    "read_snli_jsonl",
    "read_squad_json",
    "read_tagged_text",
]
