"""docs/quickstart-your-model.md cannot rot: every fenced block it marks is run here, in order, against the
project's local test Hub (tests/support/hub_server.py; nothing leaves 127.0.0.1).

The page marks each bash / python block with a comment above it, ``<!-- quickstart: KIND [ARGS] -->``:

* ``install``: pip commands; checked against pyproject.toml's extras, not run (they need the network);
* ``file NAME...``: the block's text is written to each named file in the working folder;
* ``run``: run with bash in the working folder; ``export NAME=VALUE`` lines carry over to later blocks, as in a
  terminal;
* ``serve``: started in the background until the end of the page; its address replaces ``localhost:8080``.

The test Hub holds a tiny random BERT as ``google-bert/bert-base-uncased`` (WordPiece vocabulary: the page's own
words) and a few MRPC rows as ``nyu-mll/glue``, so the commands run as written. The only changes: each
``python recipes/glue.py`` command gets :data:`BUDGET` appended (argparse keeps the last value of a flag),
``HF_TOKEN=hf_...`` gets the test Hub's token, and ``--port 8080`` becomes ``--port 0`` (a free port).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    from tests.support.hub_server import HubServer, client_env
    from tests.support.serve_process import wait_for_listening_url
except ImportError:  # tests/ (not the repo root) on sys.path
    from support.hub_server import HubServer, client_env  # type: ignore[no-redef]
    from support.serve_process import wait_for_listening_url  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "quickstart-your-model.md"
MARK = re.compile(r"^<!-- quickstart: (\w+)((?: \S+)*) -->$")
KINDS = {"install", "file", "run", "serve"}
#: Appended to every recipe command: a few examples and two steps, nothing saved mid-run.
BUDGET = ["--max_train_samples", "16", "--max_eval_samples", "8", "--max_steps", "2", "--per_device_train_batch_size",
          "8", "--per_device_eval_batch_size", "8", "--save_strategy", "no", "--disable_tqdm", "true"]
BASE_ID, GLUE_ID, ADAPTER_ID = "google-bert/bert-base-uncased", "nyu-mll/glue", "you/bert-base-uncased-mrpc-bitfit"


@dataclass
class Block:
    kind: str
    args: list
    lang: str
    text: str
    line: int


def doc_blocks(text: str) -> list:
    """The page's marked fenced blocks, in order; an unmarked bash / python block is an error (it would go untested)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        mark = MARK.match(lines[i].strip())
        if lines[i].startswith("```") and len(lines[i]) > 3:
            lang = lines[i][3:].strip()
            end = lines.index("```", i + 1)
            marked = MARK.match(lines[i - 1].strip()) if i else None
            if lang in ("bash", "python", "sh", "shell", "console") and not marked:
                raise AssertionError(f"{DOC.name}:{i + 1}: a ```{lang} block without a <!-- quickstart: ... --> mark")
            if marked:
                kind, args = marked.group(1), marked.group(2).split()
                assert kind in KINDS, f"{DOC.name}:{i}: unknown mark {kind!r}"
                blocks.append(Block(kind, args, lang, "\n".join(lines[i + 1:end]) + "\n", i + 1))
            i = end + 1
            continue
        assert not mark or lines[i + 1].startswith("```"), f"{DOC.name}:{i + 1}: a mark not followed by a block"
        i += 1
    return blocks


def commands(text: str) -> list:
    """The block's commands, continuation lines joined, comments and blank lines dropped, as token lists."""
    return [shlex.split(line, comments=True) for line in text.replace("\\\n", " ").splitlines()
            if shlex.split(line, comments=True)]


def test_every_shell_and_python_block_is_marked_and_runnable():
    blocks = doc_blocks(DOC.read_text())
    kinds = [b.kind for b in blocks]
    assert kinds.count("install") == 1 and kinds.count("serve") == 1 and kinds.count("run") >= 6, kinds
    for block in blocks:
        if block.kind in ("run", "serve", "install"):
            assert block.lang == "bash", f"line {block.line}: run, serve and install blocks are bash"


def test_install_commands_name_existing_extras():
    """The install block is not run (network): its pip commands must name extras pyproject.toml defines."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    (install,) = [b for b in doc_blocks(DOC.read_text()) if b.kind == "install"]
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for tokens in commands(install.text):
        assert tokens[:2] == ["pip", "install"], tokens
        for spec in tokens[2:]:
            found = re.fullmatch(r"\.\[([\w,-]+)\]", spec)
            if found:
                assert set(found.group(1).split(",")) <= extras, (spec, extras)
    assert any(".[serve]" in " ".join(t) for t in commands(install.text)), "step 8 needs the serve extra"


# --------------------------------------------------------------------------- the run end to end


def page_words(text: str) -> list:
    return sorted(set(re.findall(r"[a-z]+", text.lower())))


def seed_hub(server: HubServer, folder: Path, words: list) -> None:
    """A tiny random BERT (no head) as the base, and 16 / 8 / 8 MRPC-shaped rows as ``nyu-mll/glue`` ``mrpc``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    import transformers as T

    base = folder / "base"
    base.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = T.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             vocab_size=len(words) + 5, max_position_embeddings=128)).save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    server.create_repo(BASE_ID, files={p.name: p.read_bytes() for p in base.iterdir()})

    files = {"README.md": GLUE_CARD}
    for split, n in (("train", 16), ("validation", 8), ("test", 8)):
        table = pa.table({"sentence1": [f"the cat sat on the mat {i}" for i in range(n)],
                          "sentence2": [("a cat was sitting on the mat" if i % 2 else "the film was dull") for i in range(n)],
                          "label": pa.array([i % 2 if split != "test" else -1 for i in range(n)], pa.int64()),
                          "idx": pa.array(range(n), pa.int32())})
        path = folder / f"{split}.parquet"
        pq.write_table(table, path)
        files[f"mrpc/{split}-00000-of-00001.parquet"] = path.read_bytes()
    server.create_repo(GLUE_ID, repo_type="dataset", files=files)


GLUE_CARD = """---
configs:
- config_name: mrpc
  data_files:
  - split: train
    path: mrpc/train-*
  - split: validation
    path: mrpc/validation-*
  - split: test
    path: mrpc/test-*
dataset_info:
- config_name: mrpc
  features:
  - name: sentence1
    dtype: string
  - name: sentence2
    dtype: string
  - name: label
    dtype:
      class_label:
        names:
          '0': not_equivalent
          '1': equivalent
  - name: idx
    dtype: int32
---
"""


def prepare(block: Block, token: str, address: str) -> str:
    """The block's text as the test runs it (see the module docstring for the three changes)."""
    lines = []
    for line in block.text.replace("\\\n", " ").splitlines():
        if shlex.split(line, comments=True)[:2] == ["python", "recipes/glue.py"]:
            line = f"{line} {shlex.join(BUDGET)}"
        lines.append(line.replace("HF_TOKEN=hf_...", f"HF_TOKEN={token}").replace("--port 8080", "--port 0")
                     .replace("localhost:8080", address))
    return "\n".join(lines) + "\n"


def exports(text: str) -> dict:
    return {name: value for tokens in commands(text) if tokens[0] == "export"
            for name, value in (t.split("=", 1) for t in tokens[1:])}


def decode_all(text: str) -> list:
    """Every JSON value printed back to back (curl -s adds no newline)."""
    values, decoder, text = [], json.JSONDecoder(), text.strip()
    while text:
        value, end = decoder.raw_decode(text)
        values.append(value)
        text = text[end:].strip()
    return values


@pytest.mark.slow
@pytest.mark.hub
def test_the_page_runs_end_to_end(tmp_path):
    for tool in ("bash", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"the page's commands need {tool}")
    text = DOC.read_text()
    blocks = doc_blocks(text)
    server = HubServer(orgs=("you", "google-bert", "nyu-mll")).start()
    serve = None
    try:
        seed_hub(server, tmp_path, page_words(text))
        work = tmp_path / "work"
        work.mkdir()
        (work / "recipes").symlink_to(REPO / "recipes")
        bin_dir = str(Path(sys.executable).parent)
        # no HF_TOKEN until the page exports it: the public base and data are read anonymously, as on the Hub
        env = client_env(server, hf_home=tmp_path / "hf_home", token=None,
                         extra={"OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"})
        env["PATH"] = bin_dir + ":" + env.get("PATH", "/usr/bin:/bin")
        address, outputs = "localhost:8080", []
        for block in blocks:
            if block.kind == "file":
                for name in block.args:
                    (work / name).write_text(block.text)
            elif block.kind == "serve":
                *before, command = prepare(block, server.token, address).strip().splitlines()
                script = "\n".join([*before, "exec " + command])  # the server is bash's process: signals reach it
                serve = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                url, last = wait_for_listening_url(serve, timeout=300)
                assert url, f"line {block.line}: the server did not start: {last}"
                address = url.removeprefix("http://")
            elif block.kind == "run":
                script = prepare(block, server.token, address)
                proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, text=True,
                                      capture_output=True, timeout=600)
                assert proc.returncode == 0, (f"{DOC.name}:{block.line}: exit {proc.returncode}\n{script}\n"
                                              f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")
                env.update(exports(script))
                outputs.append((block, proc.stdout))

        def output_of(word: str) -> str:
            (found,) = [out for block, out in outputs if word in block.text]
            return found

        # 2. the GPU command (bf16 runs on the CPU here): an adapter with MRPC's labels, at the rate the page gives
        run = work / "outputs" / "bert-base-uncased-mrpc-bitfit"
        config = json.loads((run / "adapter_config.json").read_text())
        assert config["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
        assert config["base_model_name_or_path"] == BASE_ID
        assert json.loads((run / "run_args.json").read_text())["training_args"]["learning_rate"] == 1e-3
        results = json.loads(output_of("cat outputs/"))
        assert {"eval_accuracy", "eval_f1", "init_eval_accuracy"} <= set(results)
        # 3. the CPU slice; 4. the CSV files: the label set is the file's values, sorted
        assert (work / "outputs" / "bert-base-uncased-mrpc-bitfit-cpu" / "adapter_model.safetensors").exists()
        csv_config = json.loads((work / "outputs" / "bert-base-uncased-paraphrase-bitfit" / "adapter_config.json").read_text())
        assert csv_config["id2label"] == {"0": "no", "1": "yes"}
        assert csv_config["metadata"]["text_columns"] == ["first", "second"]
        # 6. pushed twice (bitfit-hf push, then the recipe's --push_to_hub, its last step)
        assert (work / "outputs" / "glue-mrpc-bitfit" / "adapter_config.json").exists()
        commits = server.commits(ADAPTER_ID)
        titles = [c.title for c in commits]
        assert titles[0] == "End of training" and len(titles) == 3, titles  # + the push + the initial commit
        pushed_card = server.files(ADAPTER_ID, revision=commits[1].oid)["README.md"].decode()
        assert "accuracy" in pushed_card and "nyu-mll/glue" in pushed_card, "the card of `bitfit-hf push` has the scores"
        assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(server.files(ADAPTER_ID))
        # 7. the script: label names from the adapter, a pipeline answer, the stock-model path agreeing
        printed = output_of("python predict_mrpc.py")
        assert "'not_equivalent'" in printed and "'equivalent'" in printed and "'score'" in printed, printed
        # 8. the server: healthy, and a pair answered with MRPC's labels
        health, answer = decode_all(output_of("curl -s"))
        assert health["status"] == "ok" and health["adapters"] == 1
        with urllib.request.urlopen(f"http://{address}/adapters", timeout=30) as listed:
            (served,) = json.load(listed)
        assert served["revision"] == served["commit"] == commits[0].oid, "served at the commit pull printed"
        assert {a["label"] for a in answer} == {"not_equivalent", "equivalent"}
        assert answer[0]["score"] >= answer[1]["score"]
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGINT)  # Ctrl-C, as the page says
            try:
                serve.wait(60)
            finally:
                if serve.poll() is None:
                    serve.kill()
        server.stop()
    assert serve is not None and serve.returncode in (0, 130, -signal.SIGINT), serve.stderr.read()[-3000:]
