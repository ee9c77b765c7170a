"""Tiny adapters on a tiny BERT saved to a folder, with a word-level tokenizer, for the serving tests.

Every adapter is built like tests/adapters/test_multitask.py's ``_make_adapter``: the base's frozen weights,
then the method's trainable tensors randomly perturbed, saved with the tokenizer beside it."""

from __future__ import annotations

import torch
import transformers as T
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from bitfit_hf import BitFitAdapter, BitFitConfig, apply_bitfit
from bitfit_hf.tuners import apply_method

WORDS = ("the a an cat dog film movie was is very good bad great boring long short man woman sleeps runs "
         "sat on mat and or not it this that what who where when why how did does do in of to by with "
         "gorgeous witty dull tedious delight mess plot actor story ending fun sad happy red blue green "
         "house tree car road city river day night time year people child world life hand part place "
         "case week work point group number fact eye home water room mother area money book").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = {w: i for i, w in enumerate(SPECIALS + sorted(set(WORDS)))}
MAX_LEN = 64


def tiny_tokenizer() -> T.PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])])
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                     sep_token="[SEP]", mask_token="[MASK]", model_max_length=MAX_LEN)


def tiny_config(**kwargs) -> T.BertConfig:
    return T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=len(VOCAB), max_position_embeddings=MAX_LEN, **kwargs)


def save_base(folder: str, seed: int = 0) -> str:
    """A random tiny BERT saved as a checkpoint (so adapters record a loadable base path)."""
    torch.manual_seed(seed)
    T.BertModel(tiny_config()).save_pretrained(folder)  # no head: every adapter brings its own
    tiny_tokenizer().save_pretrained(folder)
    return folder


HEADS = {"seq": T.BertForSequenceClassification, "tok": T.BertForTokenClassification, "qa": T.BertForQuestionAnswering}


def make_adapter(base_dir: str, out_dir: str, num_labels: int = 2, seed: int = 1, head: str = "seq",
                 method_config=None, scale: float = 0.5, problem_type=None) -> str:
    """An adapter on the base at ``base_dir``: its trainable tensors perturbed with seed ``seed``."""
    cls = HEADS[head]
    kwargs = {}
    if head != "qa":
        kwargs = {"num_labels": num_labels, "id2label": {i: f"s{seed}_{head}{i}" for i in range(num_labels)},
                  "label2id": {f"s{seed}_{head}{i}": i for i in range(num_labels)}}
    if problem_type:
        kwargs["problem_type"] = problem_type
    torch.manual_seed(100 + seed)
    model = cls.from_pretrained(base_dir, **kwargs)
    if method_config is None:
        apply_bitfit(model, BitFitConfig("all"))
    else:
        apply_method(model, method_config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(scale * torch.randn(param.shape, generator=g))
    BitFitAdapter.from_model(model).save_pretrained(out_dir)
    tiny_tokenizer().save_pretrained(out_dir)
    return out_dir


def alone(adapter_dir: str):
    """The adapter loaded by itself onto a fresh stock base: the reference for the server's answers."""
    from bitfit_hf import AutoBitFitModel

    return AutoBitFitModel.from_pretrained(adapter_dir).eval()


def reference_scores(model, tok, text, pair=None):
    with torch.no_grad():
        logits = model(**tok(text, pair, return_tensors="pt")).logits[0]
    probs = logits.softmax(-1)
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probs)}


def copy_dir(src: str, dst: str) -> str:
    import shutil

    shutil.copytree(src, dst)
    return dst




NEEDLE = "river"  # the one word the needle QA model answers with


def make_needle_qa(root: str) -> str:
    """A QA adapter (and its own base) that answers with the word :data:`NEEDLE` wherever it is in the context,
    and scores every other token far lower: its encoder passes the embeddings through (attention and
    feed-forward outputs zeroed, no position embeddings) and its head reads one embedding direction that only
    the needle has. A context of any length then has one right answer, for testing that it is read whole."""
    import os

    torch.manual_seed(0)
    model = T.BertForQuestionAnswering(tiny_config()).eval()
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            for dense in (layer.attention.output.dense, layer.output.dense):
                dense.weight.zero_()
                dense.bias.zero_()
        emb = model.bert.embeddings
        emb.position_embeddings.weight.zero_()
        emb.token_type_embeddings.weight.zero_()
        emb.word_embeddings.weight[:, 0] = 0.0
        emb.word_embeddings.weight[VOCAB[NEEDLE]] = 0.0
        emb.word_embeddings.weight[VOCAB[NEEDLE], 0] = 5.0
        model.qa_outputs.weight.zero_()
        model.qa_outputs.weight[:, 0] = 10.0
        model.qa_outputs.bias.zero_()
    base, out = os.path.join(root, "needle_base"), os.path.join(root, "needle")
    model.save_pretrained(base)
    tiny_tokenizer().save_pretrained(base)
    model = T.BertForQuestionAnswering.from_pretrained(base).eval()  # the base as an adapter's loader sees it
    apply_bitfit(model, BitFitConfig("all"))
    BitFitAdapter.from_model(model).save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


FILLER = ("the cat sat on the mat and the dog runs in the city by the road with a man and a woman . "
          "it was a long day and the film was very good but the plot was dull . ").split()


def long_qa(tokens_before: int = 1600, tokens_after: int = 400):
    """``(question, context, answer start)``: the needle sentence after about ``tokens_before`` words of filler."""
    before = " ".join(FILLER[i % len(FILLER)] for i in range(tokens_before))
    after = " ".join(FILLER[i % len(FILLER)] for i in range(tokens_after))
    sentence = f"the boat is on the {NEEDLE} today ."
    context = f"{before} {sentence} {after}"
    return "where is the boat", context, context.index(f" {NEEDLE} ") + 1
