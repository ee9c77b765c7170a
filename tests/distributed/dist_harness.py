"""Helpers shared by the distributed tests: launch dist_train.py under a launcher, read what each rank wrote,
compare with a single-process run of the same global batch.

Not a test module (no ``test_`` prefix). Imported by the ``test_dist_*`` modules next to it.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRIPT = HERE / "dist_train.py"
CONFIGS = REPO / "accelerate_configs"

# Tolerances of a 2-process run against the single-process run of the same global batch (8), 4 AdamW steps
# at lr 2e-2 (biases) / 5e-3 (head), parameters moving by ~5e-2. Measured: ~1e-7 for BERT (float32
# reduction order), up to ~5e-6 for LLaMA's added k_proj biases (their true gradient is zero - softmax
# ignores a shift of the keys - so Adam turns reduction-order noise into updates). A wrong run (ranks
# alone, loss x2, DeepSpeed's own single optimizer group) is off by 5e-3 or more.
PARAM_ATOL = 5e-5
LOSS_RTOL = 1e-5
GRAD_NORM_RTOL = 1e-4
LOGITS_ATOL = 1e-5
LAUNCH_TIMEOUT = int(os.environ.get("BITFIT_DIST_TIMEOUT", "420"))  # the first DeepSpeed run compiles ~1 min

_WORK: Optional[Path] = None
_BASES: Dict[str, Path] = {}
_REFS: Dict[str, Path] = {}
# model kind -> extra dist_train.py arguments (LLaMA has no biases: BitFit adds zero ones)
KIND_ARGS = {"bert": [], "llama": ["--add-missing-biases"],
             # the random baselines (same BERT base): as many random weight entries as BERT's biases
             "bert_rand_uniform": ["--method", "rand_uniform", "--random-seed", "3"],
             "bert_rand_row_col": ["--method", "rand_row_col", "--random-seed", "3"],
             # AdapterBias on the BERT base (kinds are "<base>" or "<base>_<variant>")
             "bert_adapterbias": ["--method", "adapterbias"],
             "bert_adapterbias_shared": ["--method", "adapterbias", "--share-alpha"],
             # BitFit + LoRA on the BERT base
             "bert_bitfit_lora": ["--method", "bitfit_lora"]}


def base_kind(kind: str) -> str:
    """The base model a run kind trains: ``bert`` or ``llama``."""
    return "llama" if kind.startswith("llama") else "bert"


def workdir() -> Path:
    """One temporary folder for the whole session (removed at exit)."""
    global _WORK
    if _WORK is None:
        _WORK = Path(tempfile.mkdtemp(prefix="bitfit_dist_"))
        atexit.register(shutil.rmtree, _WORK, True)
    return _WORK


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_model_dir(kind: str = "bert") -> Path:
    """A small random model saved once per session: BERT (2 layers, hidden 32, no dropout), or LLaMA
    (2 layers, hidden 32, no biases anywhere) for the added-bias path."""
    kind = base_kind(kind)
    if kind not in _BASES:
        import transformers as T

        torch.manual_seed(0)
        if kind == "bert":
            config = T.BertConfig(
                vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2,
            )
        else:
            config = T.LlamaConfig(
                vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=64, max_position_embeddings=64, pad_token_id=0, num_labels=2,
            )
        path = workdir() / f"base_{kind}"
        T.AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
        _BASES[kind] = path
    return _BASES[kind]


def launch_env(tmp: Path) -> Dict[str, str]:
    """A clean environment for a launch: no inherited launcher variables, 1 thread per process, a private
    TMPDIR (torchrun's torchelastic_* folders go there), a stable cache for DeepSpeed's compiled ops."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCELERATE_", "BITFIT_HF_")) and k not in
           ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")}
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="warning",
        PYTHONUNBUFFERED="1",
        TMPDIR=str(tmp),
        PYTHONPATH=os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
    )
    from bitfit_hf.training.backend import torch_extensions_dir

    env["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()  # $TORCH_EXTENSIONS_DIR or ~/.cache/bitfit_hf/torch_extensions
    return env


class Launch:
    """The result of one (or several simultaneous) launcher processes."""

    def __init__(self, out: Path, returncodes: List[int], logs: List[str], seconds: float):
        self.out = out
        self.returncodes = returncodes
        self.logs = logs
        self.seconds = seconds

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)

    @property
    def log(self) -> str:
        return "\n".join(self.logs)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-n:])


def launch(name: str, commands: Sequence[Sequence[str]], env_extra: Optional[Dict[str, str]] = None,
           port: Optional[int] = None, timeout: int = LAUNCH_TIMEOUT) -> Launch:
    """Run the launcher ``commands`` at the same time (two "nodes" = two commands); ``{out}`` in them is
    replaced by this launch's output folder. Cleans the launchers' leftovers afterwards."""
    out = workdir() / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tmp = out / "tmp"
    tmp.mkdir()
    env = launch_env(tmp)
    env.update(env_extra or {})
    start = time.time()
    procs, files = [], []
    for index, command in enumerate(commands):
        command = [part.replace("{out}", str(out)) for part in command]
        handle = open(out / f"launcher{index}.log", "w+")
        files.append(handle)
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    returncodes = []
    deadline = start + timeout
    for proc in procs:
        try:
            returncodes.append(proc.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            returncodes.append(-9)
    for proc in procs:  # whatever is left of a timed-out or failed launch: its whole process group
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    seconds = time.time() - start
    logs = []
    for handle in files:
        handle.seek(0)
        logs.append(handle.read())
        handle.close()
    cleanup_leftovers(port, tmp)
    return Launch(out, returncodes, logs, seconds)


def cleanup_leftovers(port: Optional[int], tmp: Optional[Path]) -> None:
    """Remove DeepSpeed's shared-memory buffers of this launch (named after the master port) and the
    private TMPDIR (torchrun's /tmp/torchelastic_* folders)."""
    if port is not None:
        for path in glob.glob(f"/dev/shm/deepspeed_*_{port}_*"):
            try:
                os.unlink(path)
            except OSError:
                pass
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def train_args(*extra: str, kind: str = "bert") -> List[str]:
    # --eval-first: evaluate() before train(), as the recipes do (it used to leave DDP ranks unsynchronised
    # and to break DeepSpeed training; see bitfit_hf.training.eval_wrapping.reset_evaluation_wrapping)
    return [str(SCRIPT), "--out", "{out}", "--base", str(base_model_dir(kind)), "--eval-first", *KIND_ARGS[kind],
            *extra]


def accelerate_cmd(config: str, port: int, *extra_launch: str, script_args: Sequence[str] = (),
                   kind: str = "bert") -> List[str]:
    cfg = config if os.path.isabs(config) else str(CONFIGS / config)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", cfg, "--main_process_port",
            str(port), *extra_launch, *train_args(*script_args, kind=kind)]


def torchrun_cmd(nproc: int, port: int, script_args: Sequence[str] = (), kind: str = "bert") -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
            "127.0.0.1", "--master_port", str(port), *train_args(*script_args, kind=kind)]


def python_cmd(script_args: Sequence[str] = (), kind: str = "bert") -> List[str]:
    return [sys.executable, *train_args(*script_args, kind=kind)]


def reference_run(kind: str = "bert") -> Path:
    """The single-process run (global batch 8 in one process), once per session and model kind."""
    if kind not in _REFS:
        result = launch(f"reference_{kind}", [python_cmd(kind=kind)])
        assert result.ok, f"single-process reference run failed:\n{result.tail()}"
        _REFS[kind] = result.out
    return _REFS[kind]


# ---------------------------------------------------------------------------------------------- reading
def rank_report(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


def trained(out: Path, rank: int) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / f"rank{rank}_trained.safetensors"))


def logits(out: Path, rank: int = 0) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(out / f"rank{rank}_logits.safetensors"))["logits"]


def max_abs_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), (sorted(set(a) ^ set(b)))[:5]
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _rel(a: Sequence[float], b: Sequence[float]) -> float:
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def stock_logits_with_adapter(adapter_dir: Path, kind: str = "bert") -> torch.Tensor:
    """Load the saved adapter onto a stock model built from the base checkpoint; logits on the fixed batch."""
    sys.path.insert(0, str(HERE))
    try:
        from dist_train import eval_batch
    finally:
        sys.path.remove(str(HERE))
    from transformers import AutoModelForSequenceClassification

    from bitfit_hf import load_adapter

    model = AutoModelForSequenceClassification.from_pretrained(str(base_model_dir(kind))).eval()
    load_adapter(model, str(adapter_dir))
    with torch.no_grad():
        return model(**eval_batch(model.config.vocab_size)).logits.float()


def verify_run(result: Launch, world_size: int, distributed_type: str, zero_stage: Optional[int] = None,
               kind: str = "bert") -> dict:
    """Everything a correct multi-process run must satisfy; returns measured numbers for the docs."""
    assert result.ok, f"launch failed (exit codes {result.returncodes}):\n{result.tail()}"
    out = result.out
    ref = reference_run(kind)
    reports = [rank_report(out, r) for r in range(world_size)]
    assert not (out / f"rank{world_size}.json").exists(), "more ranks wrote results than asked for"
    for rep in reports:
        # 1. the world size is what was asked, as seen by the Trainer's accelerator and by torch.distributed
        assert rep["accelerator_num_processes"] == world_size, rep
        assert rep["dist_world_size"] == world_size, rep
        assert rep["distributed_type"] == distributed_type, rep
        assert rep["zero_stage"] == zero_stage, rep
        assert rep["global_step"] == 4, rep
        # 4. every frozen parameter bit-identical to the base checkpoint
        assert rep["frozen_checked"] > 0 and rep["frozen_mismatched"] == [], rep["frozen_mismatched"][:5]
    ref_report = rank_report(ref, 0)
    ref_trained = trained(ref, 0)
    per_rank = [trained(out, r) for r in range(world_size)]
    # 2. every rank holds identical trained parameters (bit for bit)
    for r in range(1, world_size):
        assert set(per_rank[r]) == set(per_rank[0])
        for name in per_rank[0]:
            assert torch.equal(per_rank[r][name], per_rank[0][name]), f"rank {r} differs from rank 0 on {name}"
    # 3. equal to the single-process run of the same global batch, within tolerance; the loss is not
    #    scaled by the number of processes; the optimizer has BitFit's groups
    diff = max_abs_diff(per_rank[0], ref_trained)
    moved = max_abs_diff(per_rank[0], {k: _base_value(k, v, kind) for k, v in per_rank[0].items()})
    assert diff <= PARAM_ATOL, f"trained tensors differ from the single-process run by {diff}"
    assert moved > 100 * PARAM_ATOL, f"training barely moved the parameters ({moved}): the comparison is void"
    loss_rel = _rel(reports[0]["losses"], ref_report["losses"])
    assert loss_rel <= LOSS_RTOL, (reports[0]["losses"], ref_report["losses"])
    norm_rel = _rel(reports[0]["grad_norms"], ref_report["grad_norms"]) if reports[0]["grad_norms"] else None
    if norm_rel is not None:
        assert norm_rel <= GRAD_NORM_RTOL, (reports[0]["grad_norms"], ref_report["grad_norms"])
    for key in ("eval_loss_before", "eval_loss_after"):  # evaluate() before and after train() (sharded eval)
        assert ref_report[key] is not None and abs(reports[0][key] / ref_report[key] - 1) <= LOSS_RTOL, (
            key, reports[0][key], ref_report[key])
    groups = sorted((g["lr"], g["weight_decay"]) for g in reports[0]["optimizer_groups"])
    assert groups == sorted((g["lr"], g["weight_decay"]) for g in ref_report["optimizer_groups"]), groups
    # 5. the saved adapter: only the adapter tensors, equal to what the ranks hold, same config as a
    #    single-process save; loads onto a stock model and reproduces the trained model's logits
    from bitfit_hf import BitFitAdapter

    adapter = BitFitAdapter.from_directory(str(out / "adapter"))
    ref_adapter = BitFitAdapter.from_directory(str(ref / "adapter"))
    assert set(adapter.tensors) == set(ref_adapter.tensors)
    saved = dense_adapter_tensors(adapter, kind)
    assert set(saved) == set(per_rank[0])
    for name, tensor in saved.items():
        assert torch.equal(tensor, per_rank[0][name]), name
    mine, theirs = adapter.config.to_dict(), ref_adapter.config.to_dict()
    for d in (mine, theirs):
        d.pop("metadata", None)
        d.pop("tensors_sha256", None)  # hashes the tensors, which agree only within PARAM_ATOL (checked above)
    assert mine == theirs, {k: (mine[k], theirs.get(k)) for k in mine if mine[k] != theirs.get(k)}
    stock = stock_logits_with_adapter(out / "adapter", kind)
    logits_diff = (stock - logits(out, 0)).abs().max().item()
    assert logits_diff <= LOGITS_ATOL, logits_diff
    for r in range(1, world_size):
        assert torch.equal(logits(out, r), logits(out, 0))
    return {
        "max_abs_diff_vs_single_process": diff,
        "max_param_change_from_base": moved,
        "loss_rel_diff": loss_rel,
        "grad_norm_rel_diff": norm_rel,
        "stock_model_logits_diff": logits_diff,
        "launch_seconds": round(result.seconds, 1),
        "train_seconds": round(reports[0]["seconds"]["train"], 2),
        "built_partitioned": reports[0].get("built_partitioned"),
    }


def dense_adapter_tensors(adapter, kind: str = "bert") -> Dict[str, torch.Tensor]:
    """The adapter's tensors with each sparse one (indices + values) written into the base's tensor."""
    from bitfit_hf.adapters import sparse

    dense, entries = sparse.split(adapter.tensors, adapter.config.sparse_parameters)
    for name, (indices, values) in entries.items():
        dense[name] = sparse.densify(_base_value(name, values, kind), indices, values)
    return dense


def drawn_indices(out: Path, rank: int) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / f"rank{rank}_indices.safetensors"))


_BASE_STATES: Dict[str, Dict[str, torch.Tensor]] = {}


def _base_value(name: str, like: torch.Tensor, kind: str = "bert") -> torch.Tensor:
    """The base checkpoint's value of ``name`` (zeros for a bias BitFit added)."""
    kind = kind.split("_")[0]
    if kind not in _BASE_STATES:
        from safetensors.torch import load_file

        _BASE_STATES[kind] = load_file(str(base_model_dir(kind) / "model.safetensors"))
    return _BASE_STATES[kind].get(name.replace(".base_layer.", "."), torch.zeros_like(like))


def record(case: str, numbers: dict) -> None:
    """Print the measured numbers (visible with -s / -rA) and append them to $BITFIT_DIST_RESULTS if set."""
    line = json.dumps({"case": case, **numbers})
    print(f"\n[distributed] {line}")
    path = os.environ.get("BITFIT_DIST_RESULTS")
    if path:
        with open(path, "a") as handle:
            handle.write(line + "\n")
