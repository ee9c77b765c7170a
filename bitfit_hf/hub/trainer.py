"""The Hub side of ``BitFitTrainer``: push the bias-only adapter and its model card, nothing else.

``Trainer`` would upload the whole output directory and write its own card; these overrides keep the
standard flags (``--push_to_hub --hub_model_id --hub_private_repo --hub_token --hub_revision
--hub_strategy``) while publishing only what ``bitfit_hf.hub.client.push_adapter_to_hub`` publishes.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

from bitfit_hf.adapters.adapter import BitFitAdapter
from bitfit_hf.hub.client import create_adapter_repo, publishable_adapter, push_adapter_to_hub
from bitfit_hf.reporting.eval_results import eval_results_from_log_history, read_eval_results
from bitfit_hf.reporting.heatmap import BiasChange
from bitfit_hf.reporting.model_card import write_model_card_files
from bitfit_hf.training.trainer import BitFitTrainerBase
from bitfit_hf.utils.constants import BIAS_CHANGE_JSON, PEFT_SUBFOLDER, README_NAME, WEIGHTS_NAME

logger = logging.getLogger("bitfit_hf")


class HubPushMixin:
    """Mixed into :class:`~bitfit_hf.BitFitTrainer` (needs its ``method_config`` and ``tuner_state``)."""

    def _hub_full_model(self) -> bool:
        return self.method_config.save_full_model or self.method_config.is_full_finetuning

    def init_hf_repo(self, token: Optional[str] = None, private: Optional[bool] = None) -> None:
        """Create ``args.hub_model_id`` (or the output folder's name) if needed, with clear errors."""
        if self._hub_full_model():
            return super().init_hf_repo(token=token, private=private)
        if not self.is_world_process_zero():
            return

        self.hub_model_id = create_adapter_repo(
            self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir)),
            token=token if token is not None else self.args.hub_token,
            private=private if private is not None else self.args.hub_private_repo,
        )
        self.push_in_progress = None

    def create_model_card(self, language=None, license=None, tags=None, model_name=None, finetuned_from=None,
                          tasks=None, dataset_tags=None, dataset=None, dataset_args=None) -> None:
        """Write the BitFit model card (``README.md``, plus ``bias_change.png`` / ``.json``) into
        ``args.output_dir``; same arguments as ``Trainer.create_model_card``."""
        if self._hub_full_model():
            return super().create_model_card(language=language, license=license, tags=tags, model_name=model_name,
                                              finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags,
                                              dataset=dataset, dataset_args=dataset_args)
        if not self.is_world_process_zero():
            return

        output_dir = self.args.output_dir
        if not os.path.isfile(os.path.join(output_dir, WEIGHTS_NAME)):
            logger.warning("No adapter in %s yet: call trainer.save_model() before create_model_card().", output_dir)
            return
        kwargs = self._card_kwargs(output_dir, language=language, license=license, tags=tags, model_name=model_name,
                                   finetuned_from=finetuned_from, dataset_tags=dataset_tags, dataset=dataset,
                                   dataset_args=dataset_args)
        adapter = publishable_adapter(BitFitAdapter.from_directory(output_dir), kwargs.get("base_model"))
        repo_id = self.hub_model_id or self.args.hub_model_id
        if not repo_id and not kwargs.get("model_name"):
            kwargs["model_name"] = os.path.basename(os.path.abspath(output_dir))  # as Trainer names its card
        write_model_card_files(output_dir, adapter, repo_id, **kwargs)

    def push_to_hub(self, commit_message: Optional[str] = "End of training", blocking: bool = True,
                    token: Optional[str] = None, revision: Optional[str] = None, private: Optional[bool] = None,
                    **kwargs):
        """Push the bias-only adapter and its model card (nothing else from ``output_dir``) to
        ``args.hub_model_id`` in one commit; no commit when nothing changed. ``kwargs`` are
        ``create_model_card``'s. Returns a ``CommitInfo`` (a ``Future`` with ``blocking=False``)."""
        if self._hub_full_model():
            return super().push_to_hub(commit_message=commit_message, blocking=blocking, token=token,
                                       revision=revision, private=private, **kwargs)
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)  # collective under ZeRO-3: every rank
        if not self.is_world_process_zero():
            return None
        self.create_model_card(**kwargs)  # the card in output_dir is the one pushed
        self._finish_current_push()
        return self._push_adapter_folder(self.args.output_dir, commit_message or "End of training", token,
                                         revision if revision is not None else self.args.hub_revision, private,
                                         blocking, with_card=True, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """``hub_strategy`` pushes during training: the checkpoint's adapter and a fresh card, in the background."""
        if self._hub_full_model():
            return super()._push_from_checkpoint(checkpoint_folder)
        from transformers.trainer_utils import HubStrategy, SaveStrategy

        if not self.is_world_process_zero() or self.args.hub_strategy == HubStrategy.END:
            return
        if not self.args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        if not os.path.isfile(os.path.join(checkpoint_folder, WEIGHTS_NAME)):
            return
        if self.args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            logger.info("hub_strategy=%s: BitFitTrainer pushes the adapter and its card only; optimizer and "
                        "scheduler state for resuming stay in the local checkpoints.", self.args.hub_strategy)
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        if self.args.save_strategy == SaveStrategy.STEPS:
            message = f"Training in progress, step {self.state.global_step}"
        else:
            message = f"Training in progress, epoch {int(self.state.epoch or 0)}"
        future = self._push_adapter_folder(checkpoint_folder, message, self.args.hub_token, self.args.hub_revision,
                                           None, blocking=False, with_card=False)
        from transformers.utils import PushInProgress

        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = PushInProgress([future])
        else:
            self.push_in_progress.jobs.append(future)

    def _push_adapter_folder(self, folder, commit_message, token, revision, private, blocking, with_card, **card_args):
        """Stage ``folder``'s adapter now (a checkpoint may be rotated away later), then push it."""

        adapter = BitFitAdapter.from_directory(folder)
        kwargs = self._card_kwargs(folder, **card_args)
        change = os.path.join(folder, BIAS_CHANGE_JSON)
        readme = os.path.join(folder, README_NAME)
        model_card = True
        if with_card and os.path.isfile(readme):
            with open(readme, encoding="utf-8") as handle:
                model_card = handle.read()
        call = dict(repo_id=self.hub_model_id or self.args.hub_model_id, token=token, private=private,
                    revision=revision, commit_message=commit_message,
                    bias_change=BiasChange.load(change) if os.path.isfile(change) else None,
                    summary=self.tuner_state.summary.to_dict(), model_card=model_card,
                    peft=os.path.join(folder, PEFT_SUBFOLDER), **kwargs)
        if blocking:
            return push_adapter_to_hub(adapter, **call)
        from huggingface_hub import HfApi

        future = HfApi().run_as_future(push_adapter_to_hub, adapter, **call)
        future.add_done_callback(_log_push_failure)
        return future

    def _card_kwargs(self, folder, language=None, license=None, tags=None, model_name=None, finetuned_from=None,
                     dataset_tags=None, dataset=None, dataset_args=None, tasks=None) -> Dict[str, Any]:
        """Model-card inputs: eval metrics of this run, datasets, base model, BitFit learning rates."""

        results = eval_results_from_log_history(self.state.log_history)
        results.update(read_eval_results(folder))  # all_results.json / eval_results.json: final numbers
        if folder != self.args.output_dir:
            results.update(read_eval_results(self.args.output_dir))
        first = lambda value: value[0] if isinstance(value, (list, tuple)) and value else value  # noqa: E731
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        cfg = self.method_config
        extra = {**{k: v for k, v in cfg.to_dict().items() if k.endswith("learning_rate")},  # every method's rates
                 "total_train_batch_size": self.args.train_batch_size * self.args.gradient_accumulation_steps
                 * max(1, self.args.world_size),
                 "probe_head_start": bool(getattr(self, "probe_head_start", False))}  # the head's start: part of the recipe
        if extra["probe_head_start"] and getattr(self, "probe_l2", None) is not None:
            extra["probe_l2"] = self.probe_l2
        return dict(
            base_model=finetuned_from or None,
            eval_results=results or None,
            dataset=dataset_tags if dataset_tags is not None else dataset,
            dataset_name=first(dataset) if isinstance(first(dataset), str) else None,
            dataset_config=first(dataset_args) if isinstance(first(dataset_args), str) else None,
            license=license,
            language=language,
            tags=tags + ["generated_from_trainer"],
            model_name=model_name,
            hyperparameters=extra,
        )


def _log_push_failure(future) -> None:
    error = future.exception()
    if error is not None:
        logger.warning("Pushing a checkpoint's adapter to the Hub failed: %s", error)


class BitFitTrainer(HubPushMixin, BitFitTrainerBase):
    """A ``Trainer`` for BitFit and every registered method: construct it exactly like ``Trainer``.

    With no ``method_config`` it trains every bias plus the task head (BitFit); ``method_config`` is any method's
    config (``bitfit_config`` is its deprecated name). ``base_model_name_or_path`` /
    ``base_model_revision`` are recorded in the saved adapter (default: the model's ``_name_or_path``).
    ``save_model`` writes the adapter unless ``method_config.save_full_model`` is set;
    ``push_to_hub`` publishes that adapter and its model card.
    """
