"""What a training-cost row trains and how: ``train_cost.py``'s ``--methods`` names, parsed and built.

A row is ``METHOD[:FLAG=VALUE...][@OPTION...]``:

* ``METHOD`` is a recipes' ``--method`` (every entry of :func:`bitfit_hf.tuners.recipe_methods`, so a newly registered
  method is a row with no change here), trained through ``BitFitTrainer`` with the config its recipe builds from the
  recipes' default flags, and ``FLAG=VALUE`` any of its recipe flags (``bitfit:bias_terms=paper-subset``,
  ``bitfit_lora:lora_r=16``; a list flag takes its words separated by spaces);
* or a reference that bitfit-hf does not train (:data:`REFERENCES`): ``full`` and ``lora`` are the recipes'
  ``--method full`` / ``lora`` as a user trains them without bitfit-hf (``transformers.Trainer``, with
  ``peft.get_peft_model`` for LoRA, its settings read from the registry's ``lora``): the baselines every ratio is
  taken against; ``beft`` is PEFT's BEFT; ``plain-METHOD`` is a hand-written loop over the model ``METHOD``
  prepares (``plain-full``: the stock model), to measure the Trainer's own overhead;
* ``@frozen-bf16`` stores the frozen Linear weights in bf16 (``frozen_dtype``; needs ``--precision bf16``),
  ``@adamw-fused`` / ``@adamw-foreach`` force that AdamW implementation (diagnostics).

Names the benchmark used before it took the registry's are accepted (:data:`ALIASES`), with a note naming the row
they are now.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from cost_models import SyntheticDataset, build_model

REFERENCES = ("full", "lora", "beft")
PLAIN = "plain-"
OPTIONS = {
    "frozen-bf16": "frozen weights bf16",
    "adamw-fused": "AdamW(fused=True) forced",
    "adamw-foreach": "AdamW(foreach=True) forced",
}
#: The benchmark's own names from before it used the registry's: old name -> the row it is.
ALIASES = {
    "bitfit-all": "bitfit",
    "bitfit-paper": "bitfit:bias_terms=paper-subset",
    "bitfit-lora": "bitfit_lora",
    "bitfit-ia3": "bitfit_ia3",
    "bitfit-all-fused": "bitfit@adamw-fused",
    "bitfit-all-foreach": "bitfit@adamw-foreach",
    "plain-bitfit-all": "plain-bitfit",
}
#: The published tables' rows (the default of ``--methods``), and the hand loops ``--with-plain`` adds.
DEFAULT_ROWS = ["full", "bitfit", "bitfit:bias_terms=paper-subset", "frozen", "lora", "beft", "bitfit_lora", "ia3",
                "bitfit_ia3"]
PLAIN_ROWS = ["plain-full", "plain-bitfit"]
LEARNING_RATES = {"full": 2e-5, "lora": 5e-4}  # others: 1e-3 (the BitFit paper's range)
#: The recipes' defaults of the flags every method sees (``recipe_kit``'s ``MethodArguments``), as ``CommonFlags``.
COMMON_DEFAULTS = dict(bias_terms=[], patterns=[], train_head=True, add_missing_biases=False, bias_learning_rate=None,
                       head_learning_rate=None, save_full_model=False, layerwise_lr_decay=None, added_bias_init="zero",
                       role_learning_rates=None)
_COMMON_FLAG_NAMES = {"bias_patterns": "patterns"}  # recipe flag -> CommonFlags field, where they differ


def recipe_names() -> List[str]:
    from bitfit_hf.tuners import recipe_methods

    return list(recipe_methods())


def names_help() -> str:
    return (f"comma list of rows: a recipes' --method ({', '.join(recipe_names())}), optionally :FLAG=VALUE of its "
            f"flags; the references {', '.join(REFERENCES)}, {PLAIN}METHOD (a hand loop); @OPTION suffixes "
            f"({', '.join(OPTIONS)}). Old names: {', '.join(ALIASES)}")


@dataclass(frozen=True)
class Row:
    """One parsed row: ``name`` is its key in the results."""

    name: str
    method: str  # the recipes' --method, or a reference (full, lora, beft), without plain- / flags / options
    flags: Tuple[Tuple[str, str], ...] = ()
    options: Tuple[str, ...] = ()
    plain: bool = False

    @property
    def reference(self) -> bool:
        return self.plain or self.method in REFERENCES

    @property
    def frozen_dtype(self) -> Optional[str]:
        return "bfloat16" if "frozen-bf16" in self.options else None

    @property
    def learning_rate(self) -> float:
        return LEARNING_RATES.get(self.method, 1e-3)


def canonical(name: str) -> str:
    """The row ``name`` is (an old name's current spelling; anything else as given)."""
    base, at, options = name.partition("@")
    return ALIASES.get(base, base) + at + options if base in ALIASES else name


def parse_row(name: str) -> Row:
    """A ``--methods`` entry as a :class:`Row`; ValueError naming the choices if it is none."""
    text = canonical(name)
    base, *options = text.split("@")
    unknown_options = [o for o in options if o not in OPTIONS]
    if unknown_options:
        raise ValueError(f"{name}: unknown option(s) {', '.join('@' + o for o in unknown_options)}; "
                         f"choose from {', '.join('@' + o for o in OPTIONS)}")
    method, *pairs = base.split(":")
    flags = []
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"{name}: {pair!r} is not FLAG=VALUE")
        flags.append((key.lstrip("-"), value))
    plain = method.startswith(PLAIN)
    method = method[len(PLAIN):] if plain else method
    recipes = recipe_names()
    if method not in recipes and (plain or method not in REFERENCES):
        raise ValueError(f"unknown row {name!r}: {names_help()}")
    if flags and method in REFERENCES and not plain:
        raise ValueError(f"{name}: the reference {method} takes no flags")
    if plain and options:
        raise ValueError(f"{name}: a hand loop takes no @ options")
    return Row(text, method, tuple(flags), tuple(options), plain)


def alias_notes(names: List[str]) -> List[str]:
    """One line per old name among ``names``: the row it is now."""
    notes = []
    for name in names:
        if canonical(name) != name:
            row = parse_row(name)
            flags = "".join(f" --{key} {value}" for key, value in row.flags)
            notes.append(f"note: {name} is the row {row.name} (the recipes' --method {row.method}{flags}); results "
                         "are keyed by that name")
    return notes


def _flag_value(value: str, field: Optional[dataclasses.Field]):
    """A ``FLAG=VALUE`` as the flag's type: words for a list flag, JSON scalars (numbers, true/false), else text."""
    from bitfit_hf.tuners.recipe import words

    if field is not None and "List" in str(field.type):
        return words([value])
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return json.loads(value)
    except ValueError:
        return value


def method_config(method: str, flags: Tuple[Tuple[str, str], ...] = ()):
    """The config the recipes build for ``--method METHOD`` with these flags (the rest at the recipes' defaults)."""
    from bitfit_hf.tuners import recipe_methods
    from bitfit_hf.tuners.recipe import CommonFlags

    recipe = recipe_methods()[method]
    own_fields = {f.name: f for f in dataclasses.fields(recipe.arguments)} if recipe.arguments else {}
    common_fields = {f.name: f for f in dataclasses.fields(CommonFlags) if f.name != "method"}
    common = dict(COMMON_DEFAULTS, method=method)
    own: Dict[str, object] = {}
    for key, value in flags:
        target = _COMMON_FLAG_NAMES.get(key, key)
        if target in common_fields:
            common[target] = _flag_value(value, common_fields[target])
        elif key in own_fields:
            own[key] = _flag_value(value, own_fields[key])
        else:
            raise ValueError(f"--method {method} has no flag --{key}")
    arguments = recipe.arguments(**own) if recipe.arguments else None
    return recipe.build(CommonFlags(**common), arguments)


def label(name: str, trainer: bool = True) -> str:
    """A row's name in the tables (also for the old names of earlier results files); ``trainer=False``: without the
    trainer that runs it (for profiles of one step)."""
    try:
        row = parse_row(name)
    except ValueError:
        return name
    if row.plain:
        text = "full fine-tuning, hand loop" if row.method == "full" else f"`--method {row.method}`, hand loop"
    elif row.method == "full":
        text = "full fine-tuning (Trainer)"
    elif row.method == "lora":
        text = f"PEFT LoRA r={method_config('lora').lora_r} q,v bias=none (Trainer)"
    elif row.method == "beft":
        text = "PEFT BEFT, value bias (Trainer)"
    else:
        flags = "".join(f" --{key} {value}" for key, value in row.flags)
        text = f"`--method {row.method}{flags}` (BitFitTrainer)"
    if not trainer:
        text = text.replace(" (Trainer)", "").replace(" (BitFitTrainer)", "")
    return text + "".join(f", {OPTIONS[o]}" for o in row.options)


def check_row(row: Row, precision: str) -> None:
    """ValueError for a row these settings cannot train (in the parent, before any worker starts)."""
    from bitfit_hf.tuners.recipe import FlagRefused

    if row.frozen_dtype and (precision != "bf16" or row.plain or row.method == "full"):
        raise ValueError(f"{row.name}: frozen bf16 weights need --precision bf16 and a method with a frozen base "
                         "trained through a Trainer")
    if row.method not in REFERENCES or (row.plain and row.method != "full"):
        try:
            method_config(row.method, row.flags)
        except (FlagRefused, TypeError) as err:
            raise ValueError(f"{row.name}: {err}") from None


def training_args(row: Row, batch: int, steps: int, out: str, extra: Optional[dict] = None, device: str = "cpu",
                  precision: str = "fp32"):
    import transformers as T

    kwargs = dict(output_dir=out, per_device_train_batch_size=batch, max_steps=steps, learning_rate=row.learning_rate,
                  save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
                  use_cpu=device == "cpu", bf16=precision == "bf16", seed=0, dataloader_num_workers=0)
    kwargs.update(extra or {})
    return T.TrainingArguments(**kwargs)


def peft_reference(model, method: str):
    """The reference LoRA / BEFT: ``peft.get_peft_model`` as a PEFT user calls it (LoRA with the registry's settings)."""
    import peft

    if method == "lora":
        config = method_config("lora")
        return peft.get_peft_model(model, peft.LoraConfig(
            task_type="SEQ_CLS", r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
            target_modules=config.lora_target_modules or ["query", "value"], bias="none"))
    if not hasattr(peft, "BeftConfig"):
        raise RuntimeError(f"peft {peft.__version__} has no BeftConfig")
    return peft.get_peft_model(model, peft.BeftConfig(task_type="SEQ_CLS"))


def prepare_model(model, row: Row):
    """``model`` prepared for a row without a trainer (hand loops, operator profiles): the stock model for ``full``,
    PEFT's model for the references ``lora`` / ``beft``, else the registry's ``apply_method`` with the row's config."""
    if row.method == "full":
        return model
    if row.method in REFERENCES and not row.plain:
        return peft_reference(model, row.method)
    from bitfit_hf.tuners import apply_method

    apply_method(model, method_config(row.method, row.flags))
    return model


def build_run(model_name: str, name: str, batch: int, seq: int, steps: int, out: str, callbacks=(),
              args_extra: Optional[dict] = None, device: str = "cpu", precision: str = "fp32"):
    """(model, trainer-or-None, dataset) for one row. Hand loops get no trainer (their model is moved to ``device``
    here; the Trainer moves the others)."""
    import transformers as T

    from bitfit_hf import BitFitTrainer

    row = parse_row(name)
    check_row(row, precision)
    model = build_model(model_name)
    data = SyntheticDataset(batch * steps, seq, model.config.vocab_size)
    if row.plain:
        return prepare_model(model, row).to(device), None, data
    args = training_args(row, batch, steps, out, args_extra, device, precision)
    if row.reference:
        if row.method != "full":
            model = peft_reference(model, row.method)
        trainer = T.Trainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks))
        if row.frozen_dtype:
            from bitfit_hf.training.frozen_dtype import cast_frozen_weights

            cast_frozen_weights(trainer.model, row.frozen_dtype)
        return model, trainer, data
    extra = {}
    impl = [o.split("-", 1)[1] for o in row.options if o.startswith("adamw-")]
    if impl:
        import torch

        extra["optimizer_cls_and_kwargs"] = (torch.optim.AdamW, {impl[0]: True})
    trainer = BitFitTrainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks),
                            method_config=method_config(row.method, row.flags), frozen_dtype=row.frozen_dtype, **extra)
    return model, trainer, data


def saved_file(row: Row) -> Optional[str]:
    """The file whose size is a row's checkpoint: the references save through ``save_pretrained``, the rest through
    ``trainer.save_model`` (an adapter); None: saved by the trainer."""
    if row.reference and not row.plain:
        return "model.safetensors" if row.method == "full" else "adapter_model.safetensors"
    return None


def plain_loop(model, data, batch: int, steps: int, on_step_end, precision: str = "fp32"):
    """A hand-written loop: what a user writes without Trainer (AdamW defaults, clipping, zero_grad)."""
    import torch

    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    lr = LEARNING_RATES.get("full", 1e-3) if len(params) == len(list(model.parameters())) else 1e-3
    optimizer = torch.optim.AdamW(params, lr=lr)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
    model.train()
    for step, inputs in enumerate(loader):
        if step >= steps:
            break
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        on_step_end(loss)


def warn_aliases(names: List[str]) -> None:
    for note in alias_notes(names):
        print(note, file=sys.stderr)
