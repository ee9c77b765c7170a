"""Pushing bias-only adapters with the real huggingface_hub client against the project's test Hub.

Covers the regular and the LFS upload paths, one commit per push, no commit when nothing changed,
only the adapter files and the card in the repo, stale card files removed and other files kept,
private repos and branches, BitFitTrainer's hub flags (--push_to_hub --hub_model_id
--hub_private_repo --hub_token --hub_revision, hub_strategy pushes), the command line, clear errors,
and the token never printed, logged or written.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml
from hub_test_support import (  # noqa: F401 - fixtures are used by name
    DEFAULT_TOKEN,
    OTHER_TOKEN,
    assert_clean_error,
    assert_no_token_in_files,
    hf_home,
    hub_server,
    hub_server_factory,
    run,
    snippet,
    tiny_base_dir,
)

pytestmark = pytest.mark.hub

MANAGED = {"adapter_model.safetensors", "adapter_config.json", "trainable_summary.json", "bias_change.json",
           "bias_change.png", "README.md"}


def front_matter(readme: bytes) -> dict:
    text = readme.decode()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


PUSH_TWICE_THEN_CHANGE = """
from bitfit_hf import BitFitAdapter
from bitfit_hf.hub.client import push_adapter_to_hub
model = fake_trained(BASE, seed=1)
adapter = BitFitAdapter.from_model(model, BASE)
first = adapter.push_to_hub(REPO, eval_results={"eval_accuracy": 0.75, "eval_loss": 0.5}, dataset="glue",
                            dataset_name="GLUE SST-2", license="apache-2.0")
again = push_adapter_to_hub(BitFitAdapter.from_model(model, BASE), REPO,
                            eval_results={"eval_accuracy": 0.75, "eval_loss": 0.5}, dataset="glue",
                            dataset_name="GLUE SST-2", license="apache-2.0")
changed = fake_trained(BASE, seed=2)
third = BitFitAdapter.from_model(changed, BASE).push_to_hub(REPO, commit_message="second adapter",
        eval_results={"eval_accuracy": 0.75, "eval_loss": 0.5}, dataset="glue", dataset_name="GLUE SST-2",
        license="apache-2.0")
result = {"first": first.oid, "again": again.oid, "third": third.oid, "url": first.commit_url}
"""


@pytest.mark.parametrize("path", ["regular", "lfs"])
def test_push_one_commit_only_adapter_files_and_no_commit_when_unchanged(path, hub_server_factory, hf_home, tmp_path,
                                                                          tiny_base_dir):
    # LFS like the real Hub: the repo's .gitattributes sends *.safetensors through LFS, and a low size
    # threshold sends the binary heat map there too.
    server = hub_server_factory(gitattributes_lfs=True, lfs_threshold=4096) if path == "lfs" else hub_server_factory()
    repo = f"tester/tiny-{path}"
    out = run(snippet(PUSH_TWICE_THEN_CHANGE, BASE=tiny_base_dir, REPO=repo), server, hf_home,
              extra={"TMPDIR": str(tmp_path)}).value

    commits = server.commits(repo)
    assert [c.title for c in commits] == ["second adapter", "Upload BitFit adapter", "initial commit"]
    assert out["again"] == out["first"] == commits[1].oid, "an identical re-push must not commit"
    assert out["third"] == commits[0].oid
    first_files = server.files(repo, revision=out["first"])
    assert set(first_files) == MANAGED | {".gitattributes"}, "one commit holds the adapter, card and heat map"
    lfs = server.lfs_files(repo)
    batch_calls = server.requests_to("POST", "/info/lfs/objects/batch")
    if path == "lfs":
        assert {"adapter_model.safetensors", "bias_change.png"} <= lfs
        assert batch_calls, "the LFS batch API was not used"
        uploads = server.requests_to("PUT", "/__lfs/")
        assert uploads and all(r.authorization is None for r in uploads), "the token went to the storage URL"
    else:
        assert lfs == set() and not batch_calls
    # The second adapter changed the weights, the config stays the same bytes only if nothing moved.
    second = server.files(repo)
    assert second["adapter_model.safetensors"] != first_files["adapter_model.safetensors"]
    config = json.loads(second["adapter_config.json"])
    assert "resolved_commit" not in config["metadata"] and config["base_model_name_or_path"] == tiny_base_dir
    card = front_matter(second["README.md"])
    assert card["library_name"] == "bitfit-hf" and card["tags"][0] == "bitfit"
    assert card["model-index"][0]["results"][0]["metrics"][0] == {"type": "accuracy", "value": 0.75, "name": "Accuracy"}
    assert server.find_bytes(DEFAULT_TOKEN) == []
    assert_no_token_in_files(hf_home, tmp_path)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("bitfit-hub-push-")], "staging folder left behind"


STALE = """
from bitfit_hf import BitFitAdapter
from bitfit_hf.hub.client import push_adapter_to_hub
full = BitFitAdapter.from_model(fake_trained(BASE, seed=1), BASE)
info_private = full.push_to_hub("tester/private-dev", private=True, revision="dev")
full.push_to_hub("tester/stale")
result = {"private": info_private.oid}
"""

STALE_2 = """
from bitfit_hf import BitFitAdapter
head_only = BitFitAdapter.from_model(fake_trained(BASE, seed=1, bias_terms="frozen"), BASE)
head_only.push_to_hub("tester/stale", commit_message="head only")
custom = head_only.push_to_hub("tester/stale", model_card=False, commit_message="keep my card")
result = custom.oid
"""


def test_push_private_branch_stale_card_files_and_user_files(hub_server, hf_home, tiny_base_dir):
    run(snippet(STALE, BASE=tiny_base_dir), hub_server, hf_home)
    # private=True on creation, and revision= creates the branch without touching main
    assert hub_server._repo("tester/private-dev").private is True
    assert set(hub_server.files("tester/private-dev", revision="dev")) == MANAGED | {".gitattributes"}
    assert set(hub_server.files("tester/private-dev")) == {".gitattributes"}

    # the user adds a file and edits nothing else; then a head-only adapter has no heat map
    hub_server.commit_files("tester/stale", {"notes.md": b"my notes\n"}, message="user notes")
    run(snippet(STALE_2, BASE=tiny_base_dir), hub_server, hf_home)
    files = hub_server.files("tester/stale")
    assert "bias_change.png" not in files and "bias_change.json" not in files, "stale heat map kept"
    assert files["notes.md"] == b"my notes\n", "a file the push does not manage was touched"
    titles = [c.title for c in hub_server.commits("tester/stale")]
    assert titles[:2] == ["head only", "user notes"], "model_card=False on an unchanged adapter must not commit"

    # model_card=False leaves a user-written README alone
    hub_server.commit_files("tester/stale", {"README.md": b"---\nlicense: mit\n---\n# mine\n"}, message="my card")
    run(snippet(STALE_2.replace('head_only.push_to_hub("tester/stale", commit_message="head only")\n', ""),
                BASE=tiny_base_dir), hub_server, hf_home)
    assert hub_server.files("tester/stale")["README.md"] == b"---\nlicense: mit\n---\n# mine\n"
    assert hub_server.commits("tester/stale")[0].title == "my card"


PUSH_ERRORS = """
from bitfit_hf import BitFitAdapter
from bitfit_hf.hub.client import push_adapter_to_hub
adapter = BitFitAdapter.from_model(fake_trained(BASE, seed=1), BASE)
result = {
    "bad_token": catch(push_adapter_to_hub, adapter, "tester/errors", token="hf_not_a_valid_token_at_all"),
    "other_namespace": catch(push_adapter_to_hub, adapter, "tester/errors", token=OTHER),
    "anonymous": catch(push_adapter_to_hub, adapter, "tester/errors", token=False),
}
# another push lands between our comparison and our commit: the stale parent commit is refused
import bitfit_hf.hub.client as hub
compare = hub._remote_files
hub._remote_files = lambda api, repo_id, revision: (STALE_HEAD, compare(api, repo_id, revision)[1])
result["conflict"] = catch(push_adapter_to_hub, adapter, "tester/errors", token=TOKEN)
hub._remote_files = compare
"""


def test_push_errors_are_clear_and_commit_nothing(hub_server_factory, hf_home, tmp_path, tiny_base_dir):
    server = hub_server_factory()
    stale_head = server.create_repo("tester/errors")
    server.commit_files("tester/errors", {"notes.md": b"someone else's commit\n"})
    before = [c.oid for c in server.commits("tester/errors")]
    out = run(snippet(PUSH_ERRORS, BASE=tiny_base_dir, OTHER=OTHER_TOKEN, TOKEN=DEFAULT_TOKEN, STALE_HEAD=stale_head),
              server, hf_home, token=None,
              extra={"TMPDIR": str(tmp_path)}).value
    assert_clean_error(out["bad_token"], kind="HubAuthError", words=["401", "token"])
    assert_clean_error(out["other_namespace"], kind="HubAuthError", words=["403", "write"])
    assert_clean_error(out["anonymous"], kind="HubError", words=["token"])
    assert_clean_error(out["conflict"], kind="HubConflictError", words=["push again"])
    assert [c.oid for c in server.commits("tester/errors")] == before

    offline = run(snippet(PUSH_ERRORS.split("result =")[0] + "result = catch(adapter.push_to_hub, 'tester/errors')",
                          BASE=tiny_base_dir), server, hf_home, offline=True,
                  extra={"TMPDIR": str(tmp_path)}).value
    assert_clean_error(offline, kind="HubOfflineError", words=["HF_HUB_OFFLINE"])

    stopped = hub_server_factory()
    stopped.stop()
    down = run(snippet(PUSH_ERRORS.split("result =")[0] + "result = catch(adapter.push_to_hub, 'tester/errors')",
                       BASE=tiny_base_dir), stopped, hf_home,
               extra={"TMPDIR": str(tmp_path)}).value
    assert_clean_error(down, kind="HubConnectionError", words=["cannot reach", stopped.url])
    assert [c.oid for c in server.commits("tester/errors")] == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith("bitfit-hub-push-")], "staging folder left behind"
    assert_no_token_in_files(hf_home, tmp_path)


TRAINER = """
import os, json
from transformers import TrainingArguments
from bitfit_hf import BitFitTrainer
model = load_base(BASE)
data = tokens_dataset(48)
args = TrainingArguments(OUT, max_steps=6, per_device_train_batch_size=8, learning_rate=5e-3, report_to=[],
                         use_cpu=True, eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=3,
                         logging_steps=3, push_to_hub=True, hub_model_id="bitfit-org/tiny-trainer",
                         hub_private_repo=True, hub_token=TOKEN, hub_revision="exp", hub_strategy="every_save",
                         disable_tqdm=True)
trainer = BitFitTrainer(model, args, train_dataset=data, eval_dataset=data, compute_metrics=accuracy,
                        method_config=None)
trainer.train()
metrics = trainer.evaluate()
trainer.save_metrics("all", metrics)
info = trainer.push_to_hub(dataset_tags="glue", dataset="GLUE SST-2 (toy)", dataset_args="sst2",
                           license="apache-2.0", language="en")
again = trainer.push_to_hub(dataset_tags="glue", dataset="GLUE SST-2 (toy)", dataset_args="sst2",
                            license="apache-2.0", language="en")
result = {"oid": info.oid, "again": again.oid, "accuracy": metrics["eval_accuracy"],
          "out_files": sorted(os.listdir(OUT))}
"""


def test_trainer_hub_flags_push_only_adapter_and_card(hub_server, hf_home, tmp_path, tiny_base_dir):
    out_dir = tmp_path / "run"
    # No HF_TOKEN in the environment: the token comes from --hub_token only.
    out = run(snippet(TRAINER, BASE=tiny_base_dir, OUT=str(out_dir), TOKEN=DEFAULT_TOKEN), hub_server, hf_home,
              token=None).value
    repo = "bitfit-org/tiny-trainer"
    assert hub_server._repo(repo).private is True
    files = hub_server.files(repo, revision="exp")
    assert set(files) == MANAGED | {".gitattributes"}, "only the adapter and its card may be pushed"
    assert set(hub_server.files(repo)) == {".gitattributes"}, "hub_revision: main must stay untouched"
    titles = [c.title for c in hub_server.commits(repo, revision="exp")]
    assert titles[0] == "End of training" and "Training in progress, step 3" in titles
    assert out["again"] == out["oid"] == hub_server.head(repo, "exp")
    # the local output folder keeps everything Trainer writes; the repo only the adapter
    assert {"all_results.json", "README.md", "bias_change.png", "adapter_model.safetensors"} <= set(out["out_files"])
    card = front_matter(files["README.md"])
    assert card["datasets"] == ["glue"] and card["license"] == "apache-2.0" and card["language"] == "en"
    assert card["pipeline_tag"] == "text-classification" and "generated_from_trainer" in card["tags"]
    result = card["model-index"][0]["results"][0]
    assert result["dataset"] == {"name": "GLUE SST-2 (toy)", "type": "glue", "config": "sst2", "split": "validation"}
    assert result["metrics"][0]["type"] == "accuracy" and result["metrics"][0]["value"] == pytest.approx(out["accuracy"])
    body = files["README.md"].decode()
    assert "| learning_rate | 0.005 |" in body and "hub_token" not in body
    assert "| probe_head_start | False |" in body  # how the head started is part of what reproduces the run
    assert hub_server.find_bytes(DEFAULT_TOKEN) == []
    assert_no_token_in_files(out_dir, hf_home)


RECIPE_PUSH = """
import importlib.util, json
spec = importlib.util.spec_from_file_location("glue_recipe", RECIPE)
glue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(glue)
glue.main(["--output_dir", OUT, "--max_train_samples", "32", "--max_eval_samples", "32", "--max_steps", "2",
           "--per_device_train_batch_size", "16", "--save_strategy", "no", "--disable_tqdm", "True",
           "--push_to_hub", "--hub_model_id", "tester/glue-recipe"])
with open(OUT + "/eval_results.json") as handle:
    result = json.load(handle)
"""


def test_recipe_pushes_once_after_the_final_evaluation(hub_server, hf_home, tmp_path):
    """``recipes/glue.py --push_to_hub``: one commit, made after the final evaluation, so the card's
    model-index holds the final accuracy; only the adapter and its card reach the Hub."""
    recipe = os.path.join(os.path.dirname(__file__), "..", "..", "recipes", "glue.py")
    out_dir = tmp_path / "glue"
    results = run(snippet(RECIPE_PUSH, RECIPE=os.path.abspath(recipe), OUT=str(out_dir)), hub_server, hf_home,
                  timeout=600).value
    repo = "tester/glue-recipe"
    assert [c.title for c in hub_server.commits(repo)][0] == "End of training"
    assert len([c for c in hub_server.commits(repo) if c.title != "initial commit"]) == 1, "pushed more than once"
    files = hub_server.files(repo)
    assert set(files) == MANAGED | {".gitattributes"}
    card = front_matter(files["README.md"])
    metrics = {m["type"]: m["value"] for m in card["model-index"][0]["results"][0]["metrics"]}
    assert metrics["accuracy"] == pytest.approx(results["eval_accuracy"])
    assert card["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and card["language"] == "en"
    assert "movie-review" in files["README.md"].decode()  # the offline dataset named in the card
    assert (out_dir / "README.md").read_bytes() == files["README.md"]


CLI = """
from bitfit_hf import BitFitAdapter
from bitfit_hf.cli.main import main
BitFitAdapter.from_model(fake_trained(BASE, seed=4), BASE).save_pretrained(SAVED)
pushed = main(["push", SAVED, "tester/from-cli", "--base-model", "me/tiny-bert-base", "--license", "mit"])
pulled = main(["pull", "tester/from-cli", "--local-dir", LOCAL])
missing = main(["pull", "tester/no-such-adapter"])
result = [pushed, pulled, missing]
"""


def test_command_line_push_and_pull(hub_server, hf_home, tmp_path, tiny_base_dir):
    saved, local = str(tmp_path / "saved"), str(tmp_path / "local")
    res = run(snippet(CLI, BASE=tiny_base_dir, SAVED=saved, LOCAL=local), hub_server, hf_home)
    assert res.value == [0, 0, 2]  # the CLI's error contract: one error line, exit status 2
    assert "bitfit-hf pull: error: No repo 'tester/no-such-adapter'" in res.stderr
    config = json.loads(hub_server.files("tester/from-cli")["adapter_config.json"])
    assert config["base_model_name_or_path"] == "me/tiny-bert-base", "--base-model records the base's Hub id"
    card = front_matter(hub_server.files("tester/from-cli")["README.md"])
    assert card["base_model"] == "me/tiny-bert-base" and card["base_model_relation"] == "adapter"
    assert sorted(os.listdir(local)) == ["adapter_config.json", "adapter_model.safetensors", "bias_change.json",
                                       "trainable_summary.json"]


PUSH_WITH_PEFT_COPY = """
from bitfit_hf import BitFitAdapter
from bitfit_hf.hub.client import push_adapter_to_hub
model = fake_trained(BASE, seed=1)
BitFitAdapter.from_model(model, BASE).push_to_hub(REPO, peft=True)
result = {}
"""


def test_push_with_peft_copy_adds_the_peft_folder_and_the_card_snippet(hub_server, hf_home, tmp_path, tiny_base_dir):
    repo = "tester/tiny-peft"
    run(snippet(PUSH_WITH_PEFT_COPY, BASE=tiny_base_dir, REPO=repo), hub_server, hf_home, extra={"TMPDIR": str(tmp_path)})
    files = hub_server.files(repo)
    assert {"peft/adapter_config.json", "peft/adapter_model.safetensors"} <= set(files)
    assert json.loads(files["peft/adapter_config.json"])["peft_type"] == "BEFT"
    assert 'subfolder="peft"' in files["README.md"].decode()
