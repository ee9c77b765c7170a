"""BitFitTrainer on CPU: the default fused AdamW becomes foreach AdamW (same update, no per-tensor OpenMP region)."""

from __future__ import annotations

import torch

from bitfit_hf import BitFitTrainer

try:
    from tests.support.tiny_training import RandomLabelTokens, quiet_cpu_training_args, tiny_bert_classifier
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.tiny_training import RandomLabelTokens, quiet_cpu_training_args, tiny_bert_classifier  # type: ignore[no-redef]


def _args(tmp_path, **kw):
    return quiet_cpu_training_args(tmp_path, **{"per_device_train_batch_size": 4, "learning_rate": 1e-2, **kw})


def _defaults(optimizer):
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner.defaults


def test_default_fused_adamw_becomes_foreach_on_cpu(tmp_path):
    args = _args(tmp_path, optim="adamw_torch_fused")
    trainer = BitFitTrainer(tiny_bert_classifier(), args, train_dataset=RandomLabelTokens())
    defaults = _defaults(trainer.create_optimizer())
    assert isinstance(trainer.optimizer, torch.optim.AdamW)
    assert defaults["foreach"] is True and not defaults["fused"]


def test_explicit_optimizer_choice_is_kept(tmp_path):
    trainer = BitFitTrainer(tiny_bert_classifier(), _args(tmp_path), train_dataset=RandomLabelTokens(),
                            optimizer_cls_and_kwargs=(torch.optim.AdamW, {"fused": True}))
    assert _defaults(trainer.create_optimizer())["fused"] is True


def test_foreach_and_fused_give_the_same_training(tmp_path):
    def run(**kw):
        model = tiny_bert_classifier()
        BitFitTrainer(model, _args(tmp_path, optim="adamw_torch_fused"), train_dataset=RandomLabelTokens(), **kw).train()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    default = run()
    fused = run(optimizer_cls_and_kwargs=(torch.optim.AdamW, {"fused": True}))
    assert default.keys() == fused.keys()
    for name in default:
        torch.testing.assert_close(default[name], fused[name], atol=1e-6, rtol=1e-5)
