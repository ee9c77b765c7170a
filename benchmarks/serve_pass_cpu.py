"""CPU per forward pass of a served mixed batch, in-process: the server's share of a request once HTTP is taken
away, at each torch thread count, alone and beside a thread that holds the GIL, and on other runtimes.

    python benchmarks/serve_pass_cpu.py                 # 8 adapters, 8 sentences a pass, 1 and 2 threads
    pip install onnx onnxruntime                        # not dependencies of bitfit-hf: only the ONNX Runtime rows
    python benchmarks/serve_pass_cpu.py --json out.json --markdown out.md

Rows, each at every ``--threads`` and every ``--busy``:

* ``served``, ``packed`` / ``padded``: the mixed group `bitfit-hf serve` builds (:class:`Engine` without HTTP),
  one pass of ``--inputs`` sentences, each for another adapter, as the worker runs it;
* ``stock base``, ``eager`` / ``torchscript`` (traced and frozen) / ``onnxruntime`` (when ``onnx`` and
  ``onnxruntime`` import): the base encoder alone, padded, no routing. A runtime that runs the whole graph
  without coming back to Python between operators never waits for the GIL inside a pass; these rows bound what
  such a runtime could give the served pass.

``--busy F``: a Python thread holds the GIL a fraction F of each 2 ms (JSON work), as the event loop and the
tokenizers do beside the worker in a loaded server. CPU per pass is the process's CPU time less that thread's.
Outputs are checked, not only timed: packed against padded logits, and each runtime against eager on real tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import serve_load as load  # benchmarks/serve_load.py: the adapters, sentences and base it serves
from report import footer, load_average, machine_info, write_outputs


class BusyThread:
    """A daemon thread running Python for ``duty`` of every 2 ms; ``cpu()`` is the CPU time it used."""

    PERIOD_S = 0.002

    def __init__(self, duty: float):
        self.duty = duty
        self._cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if duty > 0 else None

    def _run(self) -> None:
        payload = {"inputs": "a sentence of about the length of a request", "adapter": "task07", "top_k": 2}
        while not self._stop.is_set():
            began, cpu_began = time.perf_counter(), time.thread_time()
            while time.perf_counter() - began < self.duty * self.PERIOD_S:
                json.loads(json.dumps(payload))
            self._cpu += time.thread_time() - cpu_began
            time.sleep((1 - self.duty) * self.PERIOD_S)

    def cpu(self) -> float:
        return self._cpu

    def __enter__(self) -> "BusyThread":
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def per_pass(run: Callable[[], object], passes: int, busy: BusyThread) -> Tuple[float, float]:
    """``(wall ms, CPU ms)`` of one call of ``run``, the mean of ``passes`` after 3 warm-up calls."""
    for _ in range(3):
        run()
    began, cpu_began, busy_began = time.perf_counter(), time.process_time(), busy.cpu()
    for _ in range(passes):
        run()
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu_began - (busy.cpu() - busy_began)
    return 1000 * wall / passes, 1000 * cpu / passes


def served_group(adapters: Dict[str, str], base: str, texts: List[str]):
    """The mixed group `bitfit-hf serve` builds over ``adapters``, one batch of ``texts`` (text ``i`` for adapter
    ``i``), and the adapter names in batch order."""
    import torch

    from bitfit_hf.inference.batches import collate
    from bitfit_hf.serving.config import AdapterSpec, ServeConfig
    from bitfit_hf.serving.engine import Engine

    names = sorted(adapters)
    engine = Engine.create([AdapterSpec(n, adapters[n]) for n in names], ServeConfig(), tokenizer=base, start=False)
    with torch.inference_mode(False), torch.no_grad():
        engine.registry.build_tables()  # as the worker does when it starts
    tasks = [names[i % len(names)] for i in range(len(texts))]
    features = [engine.prepare({"inputs": text, "adapter": task})[2][0] for text, task in zip(texts, tasks)]
    group = engine.registry.groups[engine.registry.entries[tasks[0]].group]
    return group, collate(features, engine.worker.pad_id, False, "cpu"), tasks


def stock_runtimes(base: str, batch: Dict, workdir: str):
    """``{runtime: make(threads) -> run}`` for the stock base encoder on ``batch``, the runtimes skipped with why,
    each runtime's largest difference from eager on real tokens, and the versions of the packages beyond torch."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(base).eval()

    class Encoder(torch.nn.Module):  # positional inputs, one tensor out: what tracing and export take
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    encoder = Encoder(model).eval()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    real = mask.bool()
    with torch.no_grad():
        reference = encoder(ids, mask)
    runtimes: Dict[str, Callable] = {"eager": lambda threads: (lambda: encoder(ids, mask))}
    skipped: Dict[str, str] = {}
    differences: Dict[str, float] = {}
    versions: Dict[str, str] = {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.freeze(torch.jit.trace(encoder, (ids, mask), check_trace=False).eval())
        differences["torchscript"] = float((traced(ids, mask) - reference)[real].abs().max())
        runtimes["torchscript"] = lambda threads: (lambda: traced(ids, mask))
        missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
        if missing:
            skipped["onnxruntime"] = f"{' and '.join(missing)} not installed (pip install onnx onnxruntime)"
        else:
            import onnxruntime as ort

            path = os.path.join(workdir, "base.onnx")
            torch.onnx.export(encoder, (ids, mask), path, input_names=["input_ids", "attention_mask"],
                              output_names=["hidden"], opset_version=17, dynamo=False,
                              dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                                            "attention_mask": {0: "batch", 1: "tokens"},
                                            "hidden": {0: "batch", 1: "tokens"}})
            feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}

            def session(threads: int):
                options = ort.SessionOptions()
                options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                made = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                return lambda: made.run(None, feed)

            out = torch.from_numpy(session(1)()[0])
            differences["onnxruntime"] = float((out - reference)[real].abs().max())
            import onnx

            versions.update(onnxruntime=ort.__version__, onnx=onnx.__version__)
            runtimes["onnxruntime"] = session
    return runtimes, skipped, differences, versions


def markdown_table(rows: List[dict]) -> str:
    eager = {(r["threads"], r["busy"]): r["cpu_ms"] for r in rows if r["runtime"] == "eager" and r["model"] == "stock base"}
    padded = {(r["threads"], r["busy"]): r["cpu_ms"] for r in rows if r.get("layout") == "padded" and r["model"] == "served"}
    lines = ["| model | runtime, layout | torch / runtime threads | busy thread | wall ms / pass | CPU ms / pass | "
             "CPU ms / input | torch eager padded's CPU over this row's (same model, threads, busy) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ref = (padded if r["model"] == "served" else eager).get((r["threads"], r["busy"]))
        ratio = f"{ref / r['cpu_ms']:.2f}×" if ref else "–"
        lines.append(f"| {r['model']} | {r['runtime']}, {r['layout']} | {r['threads']} | {r['busy']:.0%} | "
                     f"{r['wall_ms']:.1f} | {r['cpu_ms']:.1f} | {r['cpu_ms'] / r['inputs']:.2f} | {ratio} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=8, help="BitFit adapters served (default 8)")
    parser.add_argument("--inputs", type=int, default=8, help="sentences in one pass, each for the next adapter (default 8)")
    parser.add_argument("--threads", default="1,2", help="comma list of torch / runtime thread counts (default 1,2)")
    parser.add_argument("--busy", default="0,0.5", help="comma list of the busy thread's duty (default 0,0.5)")
    parser.add_argument("--passes", type=int, default=40, help="measured passes per row and rep (default 40)")
    parser.add_argument("--reps", type=int, default=2, help="reps of every row, in rotation (medians; default 2)")
    parser.add_argument("--base", default=None, help="a checkpoint folder with its tokenizer (default: all-MiniLM-L6-v2)")
    parser.add_argument("--quick", action="store_true", help="2 adapters, 4 inputs, 1 thread, 3 passes, 1 rep")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.adapters, args.inputs, args.threads, args.passes, args.reps = 2, 4, "1", 3, 1
    import torch

    threads = [int(x) for x in args.threads.split(",")]
    duties = [float(x) for x in args.busy.split(",")]
    info = machine_info()
    info["load_before"] = load_average()
    info["torch_threads"] = args.threads
    info["command"] = " ".join(["python benchmarks/serve_pass_cpu.py", *(argv if argv is not None else sys.argv[1:])])
    base = load.base_path(args.base)
    texts = load.sentences(args.inputs, seed=3)
    with tempfile.TemporaryDirectory() as workdir:
        adapters = load.build_adapters(os.path.join(workdir, "adapters"), args.adapters, args.base)
        group, batch, tasks = served_group(adapters, base, texts)
        checks: Dict[str, float] = {}
        with torch.inference_mode(False), torch.no_grad():
            padded_out = group.mt(task_ids=tasks, pack=False, **batch).logits
            layouts = {"padded": lambda: group.mt(task_ids=tasks, pack=False, **batch)}
            if group.packs:
                checks["served packed vs padded, logits"] = float((group.mt(task_ids=tasks, pack=True, **batch).logits
                                                                   - padded_out).abs().max())
                layouts["packed"] = lambda: group.mt(task_ids=tasks, pack=True, **batch)
            runtimes, skipped, differences, versions = stock_runtimes(base, batch, workdir)
        checks.update({f"stock base {name} vs eager, real tokens": value for name, value in differences.items()})
        measured: Dict[Tuple, List[Tuple[float, float]]] = {}
        for rep in range(args.reps):
            for count in threads:
                torch.set_num_threads(count)
                cases = [("served", "torch eager", layout, run) for layout, run in layouts.items()]
                cases += [("stock base", name, "padded", make(count)) for name, make in runtimes.items()]
                cases = cases[rep % len(cases):] + cases[:rep % len(cases)]
                for duty in duties:
                    with BusyThread(duty) as busy, torch.no_grad():
                        for model, runtime, layout, run in cases:
                            measured.setdefault((model, runtime, layout, count, duty), []).append(
                                per_pass(run, args.passes, busy))
                    print(f"rep {rep + 1}, {count} thread(s), busy {duty:.0%}: done", file=sys.stderr, flush=True)
    rows = [{"model": model, "runtime": runtime,
             "layout": layout, "threads": count, "busy": duty, "inputs": args.inputs,
             "tokens": int(batch["attention_mask"].sum()), "padded_tokens": int(batch["attention_mask"].numel()),
             "wall_ms": statistics.median(w for w, _ in values), "cpu_ms": statistics.median(c for _, c in values),
             "reps": [{"wall_ms": w, "cpu_ms": c} for w, c in values]}
            for (model, runtime, layout, count, duty), values in measured.items()]
    rows.sort(key=lambda r: (r["threads"], r["busy"], r["model"] != "served", r["runtime"], r["layout"]))
    info["load_after"] = load_average()
    results = {"rows": rows, "checks": checks, "skipped": skipped, "versions": versions, "machine": info,
               "adapters": args.adapters, "passes": args.passes, "reps": args.reps}
    md = [f"One pass of {args.inputs} sentences ({rows[0]['tokens']} real tokens, {rows[0]['padded_tokens']} padded), "
          f"each for another of {args.adapters} BitFit adapters; medians of {args.reps} rep(s) of {args.passes} passes.",
          "", markdown_table(rows), "",
          "Checks: " + "; ".join(f"{k}: max |diff| {v:.2e}" for k, v in checks.items()) + ".",
          *([f"Skipped: {k}: {v}." for k, v in skipped.items()]),
          *([f"Other runtimes: {', '.join(f'{k} {v}' for k, v in versions.items())}."] if versions else []), "", footer(info)]
    markdown = "\n".join(md)
    print(markdown)
    write_outputs(args.json, args.markdown, results, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
