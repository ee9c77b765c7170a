"""BitFitTrainer on CPU: the default fused AdamW becomes foreach AdamW (same update, no per-tensor OpenMP region)."""

from __future__ import annotations

import torch
import transformers as T

from bitfit_hf import BitFitTrainer


def _model():
    torch.manual_seed(0)
    cfg = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       vocab_size=100, num_labels=2)
    return T.BertForSequenceClassification(cfg)


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, 12), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-2,
                report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
    base.update(kw)
    return T.TrainingArguments(**base)


def _defaults(optimizer):
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner.defaults


def test_default_fused_adamw_becomes_foreach_on_cpu(tmp_path):
    args = _args(tmp_path, optim="adamw_torch_fused")
    trainer = BitFitTrainer(_model(), args, train_dataset=_Data())
    defaults = _defaults(trainer.create_optimizer())
    assert isinstance(trainer.optimizer, torch.optim.AdamW)
    assert defaults["foreach"] is True and not defaults["fused"]


def test_explicit_optimizer_choice_is_kept(tmp_path):
    trainer = BitFitTrainer(_model(), _args(tmp_path), train_dataset=_Data(),
                            optimizer_cls_and_kwargs=(torch.optim.AdamW, {"fused": True}))
    assert _defaults(trainer.create_optimizer())["fused"] is True


def test_foreach_and_fused_give_the_same_training(tmp_path):
    def run(**kw):
        model = _model()
        BitFitTrainer(model, _args(tmp_path, optim="adamw_torch_fused"), train_dataset=_Data(), **kw).train()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    default = run()
    fused = run(optimizer_cls_and_kwargs=(torch.optim.AdamW, {"fused": True}))
    assert default.keys() == fused.keys()
    for name in default:
        torch.testing.assert_close(default[name], fused[name], atol=1e-6, rtol=1e-5)
