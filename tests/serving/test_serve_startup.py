"""Start-up: adapters for another base, of a method that cannot share the base, or trained with another
pooling are refused with one line each; the `bitfit-hf serve` command serves on port 0 and drains on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import transformers as T
from serve_support import adapters, call, predict, specs, start_server  # noqa: F401 - fixtures
from tiny import make_adapter, tiny_tokenizer

from bitfit_hf import BitFitAdapter, BitFitConfig, apply_bitfit
from bitfit_hf.serving.config import AdapterSpec, ServeConfig, ServeError, parse_adapter_arg, read_adapters_file
from bitfit_hf.serving.engine import Engine
from bitfit_hf.tuners.random_subset import RandUniformConfig
from bitfit_hf.utils.sentence_pooling import install_sentence_pooling

try:
    from tests.support.serve_process import wait_for_listening_url
except ImportError:  # tests/ (not the repo root) is on sys.path
    from support.serve_process import wait_for_listening_url  # type: ignore[no-redef]


@pytest.fixture(scope="module")
def odd_adapters(adapters, tmp_path_factory):  # noqa: F811
    """A rand_uniform adapter (weight entries) and a mean-pooled classifier, on the same base."""
    root = tmp_path_factory.mktemp("odd")
    found = {}
    found["rand"] = make_adapter(adapters["base"], str(root / "rand"), 2, seed=21, method_config=RandUniformConfig(random_seed=0))
    torch.manual_seed(0)
    model = T.BertForSequenceClassification.from_pretrained(adapters["base"], num_labels=2)
    install_sentence_pooling(model, "mean")
    apply_bitfit(model, BitFitConfig("all"))
    BitFitAdapter.from_model(model).save_pretrained(str(root / "pooled"))
    tiny_tokenizer().save_pretrained(str(root / "pooled"))
    found["pooled"] = str(root / "pooled")
    return found


def test_refusals_one_line_each_nothing_served(adapters, odd_adapters, tmp_path):  # noqa: F811
    given = [*specs(adapters, "c0", "other", "c1"), AdapterSpec("rand", odd_adapters["rand"]),
             AdapterSpec("missing", str(tmp_path / "nope"))]
    with pytest.raises(ServeError) as caught:
        Engine.create(given, ServeConfig(), start=False)
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("adapter 'missing'")  # unreadable ones first, before any model loads
    with pytest.raises(ServeError) as caught:
        Engine.create(given[:4], ServeConfig(), start=False)
    lines = str(caught.value).splitlines()
    assert [line.split(" ", 2)[1] for line in lines] == ["'other'", "'rand'"]
    assert "frozen weights differ" in lines[0]
    assert "rand_uniform" in lines[1] and "cannot share the frozen base" in lines[1]


def test_tasks_on_one_base_share_its_pooling(adapters, odd_adapters):  # noqa: F811
    with pytest.raises(ServeError) as caught:
        Engine.create([AdapterSpec("pooled", odd_adapters["pooled"]), *specs(adapters, "c0")], ServeConfig(), start=False)
    (line,) = str(caught.value).splitlines()
    assert line.startswith("adapter 'c0'") and "pooling" in line
    engine = Engine.create([AdapterSpec("pooled", odd_adapters["pooled"])], ServeConfig(), start=False)
    assert engine.adapters()[0]["sentence_pooling"] == "mean"


def test_another_base_is_named_before_another_pooling(adapters, odd_adapters, start_server):  # noqa: F811
    """'other' was trained on another base AND classifies from the pooler (the served one from mean pooling):
    the refusal names the cause, the base, at start-up and on a hot add."""
    from serve_support import ADMIN_TOKEN

    with pytest.raises(ServeError) as caught:
        Engine.create([AdapterSpec("pooled", odd_adapters["pooled"]), *specs(adapters, "other")], ServeConfig(), start=False)
    (line,) = str(caught.value).splitlines()
    assert line.startswith("adapter 'other'") and "another base model" in line and "pooling" not in line, line
    server = start_server([AdapterSpec("pooled", odd_adapters["pooled"])], admin_token=ADMIN_TOKEN)
    status, _, body = call(server.url, "POST", "/admin/adapters", {"name": "other", "source": adapters["other"]},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 422 and "another base model" in body["error"] and "pooling" not in body["error"], body


def test_adapter_arguments_and_file(tmp_path, adapters):  # noqa: F811
    assert parse_adapter_arg("sst2=me/minilm-sst2@v1") == AdapterSpec("sst2", "me/minilm-sst2", "v1")
    assert parse_adapter_arg("me/minilm-sst2") == AdapterSpec("minilm-sst2", "me/minilm-sst2", None)
    assert parse_adapter_arg(adapters["c0"]).name == "c0"
    with pytest.raises(ServeError, match="not usable"):
        parse_adapter_arg("bad name=x")
    yaml_file = tmp_path / "adapters.yaml"
    yaml_file.write_text(f"base_model: {adapters['base']}\nadapters:\n  a: {adapters['c0']}\n  b: {{source: me/x, revision: v2}}\n")
    found, base = read_adapters_file(str(yaml_file))
    assert base == adapters["base"] and found == [AdapterSpec("a", adapters["c0"]), AdapterSpec("b", "me/x", "v2")]
    json_file = tmp_path / "adapters.json"
    json_file.write_text(json.dumps({"adapters": [{"name": "a", "source": adapters["c0"]}]}))
    assert read_adapters_file(str(json_file))[0] == [AdapterSpec("a", adapters["c0"])]
    (tmp_path / "bad.yaml").write_text("adapters: [unclosed\n")
    with pytest.raises(ServeError, match="not valid YAML"):
        read_adapters_file(str(tmp_path / "bad.yaml"))
    with pytest.raises(ServeError, match="max-client-batch-size"):
        ServeConfig(max_batch_size=8, max_client_batch_size=16)


def _serve(args, env=None):
    exe = os.path.join(os.path.dirname(sys.executable), "bitfit-hf")
    return subprocess.Popen([exe, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_command_refuses_with_one_line_per_adapter(adapters, odd_adapters):  # noqa: F811
    proc = _serve([f"a={adapters['c0']}", f"b={adapters['other']}", f"r={odd_adapters['rand']}", "--port", "0"])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("bitfit-hf serve: error:")]
    assert "Traceback" not in err
    assert [line.split()[4] for line in lines[:-1]] == ["'b'", "'r'"]
    assert lines[-1] == "bitfit-hf serve: error: 2 of 3 adapter(s) refused; nothing is served."


def test_command_serves_on_port_0_and_drains_on_sigterm(adapters):  # noqa: F811
    proc = _serve([f"a={adapters['c0']}", f"b={adapters['c1']}", "--port", "0"],
                  env={"BITFIT_HF_ADMIN_TOKEN": "s3cret-token-for-the-test"})
    try:
        url, line = wait_for_listening_url(proc, timeout=300)
        assert url, "the server did not report its address"
        assert "2 adapter(s) (2 mixed, 0 switched)" in line
        for _ in range(50):
            try:
                status, _, body = predict(url, {"inputs": "the cat", "adapter": "b"})
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200 and len(body) == 3
        assert call(url, "GET", "/info")[2]["admin"] is True
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err  # a drained stop on SIGTERM is a clean exit for a process supervisor
        assert "stopped after answering every queued request" in err
        assert "s3cret-token-for-the-test" not in out + err
    finally:
        if proc.poll() is None:
            proc.kill()
