"""Credentials never reach a file or a log line: --hub_token / --token values and token-shaped text
are redacted from run_args.json (raw command line included), adapter metadata, model cards,
training_args.bin of full-model saves and the recipes' logs, while the token stays usable in memory."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from reliability_support import REPO, SECRET, files_holding, tiny_bert

from bitfit_hf import BitFitAdapter, BitFitConfig, BitFitTrainer, apply_bitfit, save_adapter

REDACTED = "<redacted>"

sys.path.insert(0, str(REPO / "tests" / "recipes"))
from recipe_support import load_recipe  # noqa: E402


@pytest.mark.parametrize("name", ["hub_token", "--hub_token", "token", "use_auth_token", "HF_TOKEN", "db-password",
                                  "client_secret", "openai_api_key", "push_to_hub_token"])
def test_secret_names(name):
    from bitfit_hf.utils.secrets import is_secret_name

    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer_name", "pad_token_id", "max_new_tokens", "tokens", "text_column_name",
                                  "average_tokens_across_devices", "hub_model_id"])
def test_names_that_are_not_secrets(name):
    from bitfit_hf.utils.secrets import is_secret_name

    assert not is_secret_name(name)


def test_command_lines_and_values_are_redacted():
    from bitfit_hf.utils.secrets import redact, redact_argv

    argv = ["glue.py", "--hub_token", "abc123", "--token=xyz789", "--output_dir", "out", "--note", f"see {SECRET}",
            "--tokenizer_name", "bert-base-uncased"]
    assert redact_argv(argv) == ["glue.py", "--hub_token", REDACTED, f"--token={REDACTED}", "--output_dir", "out",
                                 "--note", f"see {REDACTED}", "--tokenizer_name", "bert-base-uncased"]
    data = {"hub_token": "abc", "token": None, "nested": [{"password": "p", "text": f"x {SECRET} y"}], "use_auth_token": True}
    assert redact(data) == {"hub_token": REDACTED, "token": None, "nested": [{"password": REDACTED, "text": f"x {REDACTED} y"}],
                            "use_auth_token": True}


def test_adapter_metadata_never_holds_a_token(tmp_path):
    model = tiny_bert()
    apply_bitfit(model)
    save_adapter(model, str(tmp_path / "adapter"), metadata={"hub_token": SECRET, "note": f"pushed with {SECRET}",
                                                               "tokenizer_name": "keep-me"})
    assert files_holding(tmp_path, SECRET) == []
    metadata = BitFitAdapter.from_pretrained(str(tmp_path / "adapter")).config.metadata
    assert metadata == {"hub_token": REDACTED, "note": f"pushed with {REDACTED}", "tokenizer_name": "keep-me"}


def test_full_model_saves_do_not_pickle_the_token(tmp_path):
    import transformers as T

    args = T.TrainingArguments(str(tmp_path / "out"), hub_token=SECRET, report_to=[], use_cpu=True)
    trainer = BitFitTrainer(tiny_bert(), args, method_config=BitFitConfig("all", save_full_model=True))
    trainer.save_model()
    assert (tmp_path / "out" / "training_args.bin").is_file()
    assert files_holding(tmp_path, SECRET) == []
    assert trainer.args.hub_token == SECRET and f"Bearer {trainer.args.hub_token}" == f"Bearer {SECRET}"  # still usable


def test_run_args_json_redacts_the_raw_command_line(tmp_path, monkeypatch):
    from bitfit_hf.recipe_kit.args import parse_recipe_args
    from bitfit_hf.recipe_kit.run import write_run_args

    glue = load_recipe("glue")
    argv = ["--output_dir", str(tmp_path / "out"), "--hub_token", SECRET, "--token", "plain-secret-1",
            "--tokenizer_name", "some/tokenizer"]
    monkeypatch.setattr(sys, "argv", ["glue.py", *argv])
    write_run_args(parse_recipe_args(glue.GlueDataArguments, glue.DEFAULTS, argv), str(tmp_path / "out"))
    text = (tmp_path / "out" / "run_args.json").read_text()
    assert SECRET not in text and "plain-secret-1" not in text
    record = json.loads(text)
    assert record["command"][1:5] == ["--output_dir", str(tmp_path / "out"), "--hub_token", REDACTED]
    assert record["model_args"]["tokenizer_name"] == "some/tokenizer" and record["model_args"]["token"] == REDACTED


@pytest.mark.slow
def test_a_recipe_run_with_a_token_writes_and_logs_it_nowhere(tmp_path, monkeypatch, capsys, caplog):
    """The probe of the issue: glue with --hub_token, checkpoints and the model card; then every file
    of the output folder and everything printed or logged is searched for the token."""
    out = tmp_path / "out"
    argv = ["--output_dir", str(out), "--hub_token", SECRET, "--max_train_samples", "16", "--max_eval_samples", "8",
            "--max_steps", "2", "--save_steps", "1", "--per_device_train_batch_size", "8", "--logging_steps", "1"]
    monkeypatch.setattr(sys, "argv", ["glue.py", *argv])
    load_recipe("glue").main(argv)
    logging.getLogger("bitfit_hf").warning("a careless message with %s in it", SECRET)  # after the recipe's log set-up
    assert (out / "run_args.json").is_file() and (out / "README.md").is_file() and (out / "checkpoint-2").is_dir()
    assert files_holding(out, SECRET) == []
    captured = capsys.readouterr()
    assert SECRET not in captured.out and SECRET not in captured.err
    assert SECRET not in caplog.text and f"a careless message with {REDACTED} in it" in caplog.text


def test_model_cards_never_hold_a_token(tmp_path):
    from bitfit_hf.reporting.model_card import write_model_card_files

    model = tiny_bert()
    apply_bitfit(model)
    adapter = BitFitAdapter.from_model(model, "some/base", metadata={
        "training_args": {"learning_rate": 0.001, "hub_token": SECRET, "run_name": f"sweep-{SECRET}"},
        "note": f"made with {SECRET}"})
    write_model_card_files(str(tmp_path), adapter, "me/card")
    card = (tmp_path / "README.md").read_text()
    assert "sweep-" in card  # the hyper-parameter is shown, its token-shaped part is not
    assert files_holding(tmp_path, SECRET) == []


def test_error_lines_never_show_a_token(capsys):
    from bitfit_hf.utils.errors import UserError, exit_on_user_error

    def fail():
        raise UserError(f"the Hub refused {SECRET}")

    with pytest.raises(SystemExit) as exit_info:
        exit_on_user_error(fail, "glue.py")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"glue.py: error: the Hub refused {REDACTED}\n"
