"""The training-cost workers: one process per row, as a real training run is. The memory worker builds a row,
trains it and reports its peak memory and correctness checks; the speed worker trains one optimizer step per turn the
parent (:func:`run_speed`) hands out, so background load hits every row alike. Both run as ``train_cost.py --worker``.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from cost_methods import build_run, parse_row, plain_loop, saved_file
from cost_models import import_everything, quiet

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_cost.py")  # handles --worker


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _optimizer_state_bytes(optimizer) -> int:
    import torch

    inner = getattr(optimizer, "optimizer", optimizer)
    total = 0
    for state in inner.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def _proc_status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class _MemoryMeter:
    """Peak memory of one training run: the process's RSS on a CPU, the CUDA allocator's on a GPU.
    ``start()``, called once the model sits on its device, reads the memory in use and resets the peak;
    ``stop()`` reads the peaks (whole run, and training alone above the loaded model)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.measure = "torch.cuda.max_memory_allocated" if self.cuda else "peak RSS (VmHWM)"

    def _current(self) -> int:
        import torch

        return torch.cuda.memory_allocated() if self.cuda else _proc_status("VmRSS")

    def _peak(self) -> int:
        import torch

        return torch.cuda.max_memory_allocated() if self.cuda else _proc_status("VmHWM")

    def start(self) -> None:
        import torch

        self.loaded, self.peak_before = self._current(), self._peak()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.reset = True
        else:
            self.reset = _reset_peak_rss()

    def stop(self) -> dict:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        peak_train = self._peak()
        return {"memory_measure": self.measure, "loaded_bytes": self.loaded,
                "peak_bytes": max(self.peak_before, peak_train),
                "train_peak_above_loaded_bytes": (peak_train - self.loaded) if self.reset else None,
                "peak_reset_supported": self.reset}


def _digests(model) -> Dict[str, str]:
    """Per-tensor digest of every parameter's bytes (no copy: hashes the buffer in place)."""
    import torch

    out = {}
    for name, param in model.named_parameters():
        array = param.detach().cpu().contiguous().view(torch.uint8).numpy()  # bf16 has no numpy dtype: its bytes
        out[name] = hashlib.blake2b(memoryview(array).cast("B"), digest_size=16).hexdigest()
    return out


def _dir_file_size(path: str, names) -> int:
    for name in names:
        full = os.path.join(path, name)
        if os.path.isfile(full):
            return os.path.getsize(full)
    return -1


# --------------------------------------------------------------------------------------------------
# worker: memory (+ correctness), one configuration per process
# --------------------------------------------------------------------------------------------------
def memory_worker(model_name: str, method: str, batch: int, seq: int, steps: int, device: str = "cpu",
                  precision: str = "fp32") -> dict:
    quiet()
    import_everything()
    import torch

    losses: List[float] = []
    meter = _MemoryMeter(device)
    with tempfile.TemporaryDirectory(prefix="bitfit_bench_") as tmp:
        model, trainer, data = build_run(model_name, method, batch, seq, steps, os.path.join(tmp, "run"),
                                         device=device, precision=precision)
        before = _digests(model)
        trained_names = {n for n, p in model.named_parameters() if p.requires_grad}
        gc.collect()
        meter.start()
        start = time.perf_counter()
        if trainer is None:
            plain_loop(model, data, batch, steps, lambda loss: losses.append(float(loss)), precision)
            optimizer_bytes, impl = None, "for-loop"
        else:
            out = trainer.train()
            losses.append(float(out.training_loss))
            optimizer_bytes = _optimizer_state_bytes(trainer.optimizer)
            defaults = getattr(trainer.optimizer, "optimizer", trainer.optimizer).defaults
            impl = "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "for-loop"
        memory = meter.stop()
        elapsed = time.perf_counter() - start

        after = _digests(model)
        changed = sorted(n for n in before if before[n] != after[n])
        frozen_changed = [n for n in changed if n not in trained_names]
        trained_changed = [n for n in changed if n in trained_names]

        adapter_bytes = -1
        save_dir = os.path.join(tmp, "saved")
        if trainer is not None:
            own_file = saved_file(parse_row(method))
            if own_file:
                model.save_pretrained(save_dir)
            else:
                trainer.save_model(save_dir)
            adapter_bytes = _dir_file_size(save_dir, [own_file or "adapter_model.safetensors"])
    return {
        "model": model_name,
        "method": method,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "device": device,
        "precision": precision,
        "optim": str(trainer.args.optim.value if hasattr(trainer.args.optim, "value") else trainer.args.optim)
        if trainer is not None else "torch.optim.AdamW()",
        "optimizer_impl": impl,
        "mixed_precision": str(trainer.accelerator.mixed_precision) if trainer is not None else precision,
        "total_params": sum(p.numel() for p in model.parameters()),
        "trainable_params": _trainable(model),
        "optimizer_state_bytes": optimizer_bytes,
        "adapter_bytes": adapter_bytes,
        **memory,
        "train_seconds": elapsed,
        "loss": losses[-1] if losses else float("nan"),
        "loss_finite": all(l == l and abs(l) != float("inf") for l in losses) and bool(losses),
        "frozen_changed": frozen_changed[:5],
        "n_frozen_changed": len(frozen_changed),
        "n_trained": len(trained_names),
        "n_trained_changed": len(trained_changed),
        "frozen_bf16_tensors": sum(1 for p in model.parameters() if not p.requires_grad and p.dtype == torch.bfloat16),
        "trained_not_float32": sorted(n for n, p in model.named_parameters() if p.requires_grad and p.dtype != torch.float32),
    }


# --------------------------------------------------------------------------------------------------
# worker: speed, one configuration per process; the parent hands out turns, one step each
# --------------------------------------------------------------------------------------------------
def speed_worker(model_name: str, method: str, batch: int, seq: int, steps: int, device: str = "cpu",
                 precision: str = "fp32") -> dict:
    """Train one configuration, one optimizer step per ``go`` line on stdin; after each step print
    ``STEP [wall_s, cpu_s]``. A step is timed from receiving ``go`` to the end of its ``on_step_end``
    (on a GPU, to the end of its kernels)."""
    quiet()
    import_everything()
    import torch
    import transformers as T

    times: List[float] = []
    cpu_times: List[float] = []
    clock = {}

    def wait_turn():
        line = sys.stdin.readline()
        if line.strip() != "go":
            raise SystemExit(f"speed worker {method}: the parent stopped the run ({line.strip() or 'EOF'})")
        clock["wall"], clock["cpu"] = time.perf_counter(), time.process_time()

    def step_done():
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - clock["wall"])
        cpu_times.append(time.process_time() - clock["cpu"])
        print("STEP " + json.dumps([times[-1], cpu_times[-1]]), flush=True)
        if len(times) < steps:
            wait_turn()

    class TakeTurns(T.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            wait_turn()

        def on_step_end(self, args, state, control, **kwargs):
            step_done()

    with tempfile.TemporaryDirectory(prefix="bitfit_bench_speed_") as tmp:
        model, trainer, data = build_run(model_name, method, batch, seq, steps, os.path.join(tmp, method),
                                         callbacks=[TakeTurns()], device=device, precision=precision)
        gc.collect()
        print("READY", flush=True)
        if trainer is not None:
            trainer.train()
        else:
            wait_turn()
            plain_loop(model, data, batch, steps, lambda loss: step_done(), precision)
    return {"method": method, "threads": torch.get_num_threads(), "times": times, "cpu_times": cpu_times}


class _TurnTaker:
    """The parent's handle on one speed worker process."""

    def __init__(self, method: str, argv: List[str], log_dir: str):
        self.method = method
        self.stderr = open(os.path.join(log_dir, f"{method}.stderr"), "w+")
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.proc = subprocess.Popen([sys.executable, SCRIPT, *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)

    def expect(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        self.proc.wait()
        self.stderr.seek(0)
        raise RuntimeError(f"speed worker {self.method} exited ({self.proc.returncode}) before {prefix.strip()}:\n"
                           f"{self.stderr.read()[-4000:]}")

    def step(self) -> List[float]:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return json.loads(self.expect("STEP "))

    def finish(self) -> dict:
        result = json.loads(self.expect("RESULT "))
        self.proc.wait()
        self.stderr.close()
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_speed(model_name: str, methods: List[str], batch: int, seq: int, steps: int,
              placement: tuple = (), parallel_start: bool = False) -> dict:
    """Every configuration in its own process (as a real training run is), all built before the first
    step; round ``r`` runs step ``r`` of each, back to back, the order rotated by one every round.
    ``placement``: the ``--device`` / ``--precision`` arguments handed to every worker. ``parallel_start``:
    start every worker at once (they load side by side; the timed steps still run one at a time)."""
    common = ["--worker", "speed", "--worker-model", model_name, "--batch-size", str(batch), "--seq", str(seq),
              "--worker-steps", str(steps), *placement]
    times: Dict[str, List[float]] = {m: [] for m in methods}
    cpu_times: Dict[str, List[float]] = {m: [] for m in methods}
    order: List[tuple] = []
    with tempfile.TemporaryDirectory(prefix="bitfit_bench_logs_") as logs:
        workers = {}
        try:
            for method in methods:  # by default built one after another: loading does not overlap
                workers[method] = _TurnTaker(method, [*common, "--worker-methods", method], logs)
                if not parallel_start:
                    workers[method].expect("READY")
            if parallel_start:
                for worker in workers.values():
                    worker.expect("READY")
            for round_ in range(steps):
                shift = round_ % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    wall, cpu = workers[method].step()
                    times[method].append(wall)
                    cpu_times[method].append(cpu)
                    order.append((round_, method))
            threads = {m: w.finish()["threads"] for m, w in workers.items()}
        finally:
            for worker in workers.values():
                worker.kill()
    return {"model": model_name, "methods": methods, "batch": batch, "seq": seq, "steps": steps,
            "threads": max(threads.values()), "times": times, "cpu_times": cpu_times, "errors": {},
            "order": order}


def run_worker(argv: List[str], timeout: Optional[float]) -> dict:
    cmd = [sys.executable, SCRIPT, *argv]
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker {' '.join(argv)} printed no RESULT line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
