"""Evaluation beside a compiled training step (bitfit_hf/training/eval_wrapping.py): each batch keeps its own
outputs when the model writes them all into one buffer (as CUDA-graph outputs behave), an evaluation before
training never compiles the model, and the wrapper it might leave does not stop training from wrapping the model."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from bitfit_hf import BitFitConfig, BitFitTrainer
from bitfit_hf.training.eval_wrapping import copied_outputs, reset_evaluation_wrapping


class OneBufferClassifier(T.BertForSequenceClassification):
    """Writes every batch's logits into the same tensor and returns it, as a CUDA-graph replay does."""

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
        buffer = self.__dict__.get("_logits_buffer")
        if buffer is None or buffer.shape != out.logits.shape:
            buffer = self.__dict__["_logits_buffer"] = torch.empty_like(out.logits)
        buffer.copy_(out.logits.detach())
        out.logits = buffer
        return out


def _model():
    torch.manual_seed(0)
    config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          vocab_size=100, num_labels=3)
    return OneBufferClassifier(config).eval()


def _rows(n=12, length=8):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (n, length), generator=generator)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(length, dtype=torch.long), "labels": int(ids[i, 1] % 3)}
            for i in range(n)]


def _own_logits(model, rows):
    with torch.no_grad():
        ids = torch.stack([r["input_ids"] for r in rows])
        return T.BertForSequenceClassification.forward(model, input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_each_batch_keeps_its_own_logits_with_the_fast_path_on(tmp_path):
    model, rows = _model(), _rows()
    args = T.TrainingArguments(str(tmp_path), per_device_eval_batch_size=4, report_to=[], use_cpu=True,
                               torch_compile=True, torch_compile_backend="aot_eager")
    trainer = BitFitTrainer(model, args, eval_dataset=rows, method_config=BitFitConfig())
    want = _own_logits(model, rows)
    predicted = trainer.predict(rows).predictions
    assert torch.allclose(torch.as_tensor(predicted), want, atol=1e-6)  # three batches, three different blocks
    accuracy = lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}  # noqa: E731
    trainer.compute_metrics = accuracy
    labels = torch.tensor([r["labels"] for r in rows])
    assert trainer.evaluate()["eval_accuracy"] == pytest.approx(float((want.argmax(-1) == labels).double().mean()))
    assert trainer.model_wrapped is trainer.model  # the evaluation ran the plain module: nothing was compiled
    assert not hasattr(trainer.model, "_orig_mod")


def test_training_wraps_the_model_again_after_a_compiled_evaluation():
    model = torch.nn.Linear(2, 2)
    model._is_accelerate_prepared = True
    trainer = type("T", (), {})()
    trainer.model, trainer.model_wrapped = model, torch.compile(model, backend="eager")  # compiles lazily: nothing runs
    done = reset_evaluation_wrapping(trainer)
    assert trainer.model_wrapped is model and not model._is_accelerate_prepared
    assert done == ["compiled evaluation wrapper", "_is_accelerate_prepared"]


def test_copied_outputs_share_no_memory():
    logits = torch.arange(6.0).reshape(2, 3)
    nested = copied_outputs((logits, [logits], {"a": logits}, None))
    logits.zero_()
    assert nested[0][0, 1] == 1.0 and nested[1][0][1, 2] == 5.0 and nested[2]["a"][1, 0] == 3.0 and nested[3] is None
