"""The serving stack behind `bitfit-hf serve`, measured: our FastAPI + uvicorn server (one worker thread and
our mixed-task batcher) against LitServe running the same batcher in its ``predict``.

    pip install litserve==0.2.19            # not a dependency of bitfit-hf: only this comparison needs it
    python benchmarks/serve_stacks.py       # 1 and 64 adapters, each stack, 2 runs in rotating order

The same closed-loop load as benchmarks/serve_load.py (its client and adapters), on the same machine:

* ``ours``: ``bitfit-hf serve`` (FastAPI + uvicorn with the pure-Python h11 parser, as the ``serve`` extra installs it);
* ``ours+standard``: the same with ``uvicorn[standard]``'s httptools parser and uvloop importable, when they are;
* ``litserve``: ``litserve.LitServer`` with ``LitAPI(max_batch_size, batch_timeout)``; its inference worker (a
  process of its own) builds the same :class:`~bitfit_hf.serving.engine.Engine` and runs each batch LitServe
  hands it through ``Worker.run_batch`` (mixed-task forward passes, as ours). LitServe passes requests
  between its API server and inference worker processes through queues.

Reported per stack: req/s, p50 / p99, CPU ms per request and RSS summed over the server's processes. Ray Serve
is not run here (see docs/serving.md for why, and its dependency weight).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import serve_load as load  # benchmarks/serve_load.py
from report import footer, load_average, machine_info, write_outputs

LITSERVE_APP = r'''
import json, sys
import litserve as ls
from bitfit_hf.serving.batcher import Job
from bitfit_hf.serving.config import AdapterSpec, ServeConfig
from bitfit_hf.serving.engine import Engine

SPECS, TOKENIZER, MAX_BATCH, WAIT_MS, PORT = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])


class BitFitAPI(ls.LitAPI):
    def setup(self, device):
        specs = [AdapterSpec(name, source) for name, source in SPECS.items()]
        self.engine = Engine.create(specs, ServeConfig(max_batch_size=MAX_BATCH, device="cpu"), tokenizer=TOKENIZER, start=False)

    def decode_request(self, request):
        return self.engine.prepare(request)

    def predict(self, batch):
        results = [None] * len(batch)
        jobs = []
        for i, (entry, parsed, encoded, options) in enumerate(batch):
            def done(result, error, i=i):
                results[i] = (result, error)
            jobs.append(Job(adapter=entry.name, inputs=encoded, on_done=done))
        self.engine.worker.run_batch(jobs)
        return [self.engine.answer(e, p, enc, results[i][0], o) for i, (e, p, enc, o) in enumerate(batch)]

    def encode_response(self, output):
        return output


if __name__ == "__main__":
    api = BitFitAPI(max_batch_size=MAX_BATCH, batch_timeout=WAIT_MS / 1000)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=120)
    print("litserve ready", flush=True)
    server.run(port=PORT, host="127.0.0.1", num_api_servers=1, generate_client_file=False, log_level="warning")
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tree(pid: int) -> List[int]:
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as handle:
                kids = [int(x) for x in handle.read().split()]
        except OSError:
            kids = []
        found += kids
        frontier += kids
    return found


def _tree_cpu(pid: int) -> float:
    total = 0.0
    for p in _tree(pid):
        try:
            total += load._cpu_seconds(p)
        except OSError:
            pass
    return total


def _tree_rss(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        try:
            total += load._status(p)["VmRSS"]
        except (OSError, KeyError):
            pass
    return total


class LitServeServer:
    def __init__(self, names: Dict[str, str], tokenizer: str, max_batch: int, wait_ms: float, workdir: str, extra_path: str):
        self.port = _free_port()
        self.host = "127.0.0.1"
        app = os.path.join(workdir, "litserve_app.py")
        with open(app, "w") as handle:
            handle.write(LITSERVE_APP)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        if extra_path:
            env["PYTHONPATH"] = extra_path + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, app, json.dumps(names), tokenizer, str(max_batch), str(wait_ms),
                                      str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        until = time.monotonic() + 600
        while time.monotonic() < until:
            try:
                status, _, _ = _get(self.host, self.port, "/health")
                if status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("litserve exited")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("litserve did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def _get(host, port, path):
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, None, response.read()
    finally:
        conn.close()


def run_one(stack: str, n: int, adapters: Dict[str, str], tokenizer: str, args, texts, workdir: str, rep: int) -> dict:
    names = sorted(adapters)[:n]
    chosen = {k: adapters[k] for k in names}
    if stack == "litserve":
        server = LitServeServer(chosen, tokenizer, args.max_batch_size, args.max_wait_ms, workdir, args.extra_path)
    else:
        spec_file = os.path.join(workdir, f"{stack}-{n}.json")
        with open(spec_file, "w") as handle:
            json.dump({"adapters": chosen}, handle)
        saved = os.environ.get("PYTHONPATH")
        if stack == "ours+standard":
            os.environ["PYTHONPATH"] = args.extra_path + (os.pathsep + saved if saved else "")
        try:
            server = load.Server(spec_file, tokenizer, "mixed", 1, args.max_batch_size, args.max_wait_ms)
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
    try:
        warm = load.closed_loop(server, names, texts, args.clients, args.warmup, seed=10_000 + rep)
        cpu0 = _tree_cpu(server.proc.pid)
        result = load.closed_loop(server, names, texts, args.clients, args.requests, seed=rep)
        cpu = _tree_cpu(server.proc.pid) - cpu0
        rss = _tree_rss(server.proc.pid)
    finally:
        server.stop()
    if warm["failed"] or result["failed"]:
        raise RuntimeError(f"{stack}-{n}: failed requests: {result['failures'] or warm['failures']}")
    return {**result, "server_cpu_ms": 1000 * cpu / result["requests"], "rss_bytes": rss}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default="ours,ours+standard,litserve")
    parser.add_argument("--adapters", default="1,64")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--extra-path", default="", help="a folder holding litserve / httptools / uvloop (pip install --target)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    stacks = args.stacks.split(",")
    counts = [int(x) for x in args.adapters.split(",")]
    info = machine_info()
    info["load_before"] = load_average()
    info["torch_threads"] = 1
    info["command"] = " ".join(["python benchmarks/serve_stacks.py", *(argv if argv is not None else sys.argv[1:])])
    from bitfit_hf.data.assets import minilm_path

    configs = [(s, n) for n in counts for s in stacks]
    runs: Dict[str, List[dict]] = {f"{s}-{n}": [] for s, n in configs}
    texts = load.sentences(200)
    with tempfile.TemporaryDirectory() as workdir:
        adapters = load.build_adapters(workdir, max(counts))
        for rep in range(args.reps):
            order = configs[rep % len(configs):] + configs[: rep % len(configs)]
            for stack, n in order:
                result = run_one(stack, n, adapters, minilm_path(), args, texts, workdir, rep)
                runs[f"{stack}-{n}"].append(result)
                print(f"rep {rep} {stack} {n}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.1f} ms, p99 "
                      f"{result['p99_ms']:.1f} ms, CPU {result['server_cpu_ms']:.1f} ms/req, RSS {result['rss_bytes'] / 2**20:.0f} MiB",
                      file=sys.stderr, flush=True)
    info["load_after"] = load_average()
    md = ["| stack | adapters | req/s | p50 ms | p99 ms | server CPU ms / request | RSS MiB (all processes) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = []
    for stack, n in configs:
        rs = runs[f"{stack}-{n}"]
        med = {k: statistics.median(r[k] for r in rs) for k in ("rps", "p50_ms", "p99_ms", "server_cpu_ms", "rss_bytes")}
        rows.append({"stack": stack, "n": n, **med, "runs": rs})
        md.append(f"| {stack} | {n} | {med['rps']:.1f} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} | "
                  f"{med['server_cpu_ms']:.1f} | {med['rss_bytes'] / 2**20:.0f} |")
    md.append("")
    md.append(f"Closed loop as in serve_load.py: {args.clients} clients, {args.requests} measured requests after "
              f"{args.warmup} warm-up, {args.reps} runs per row in rotating order (medians); 1 torch thread; "
              f"max batch {args.max_batch_size}, max wait {args.max_wait_ms} ms in every stack.")
    markdown = "\n".join(md) + "\n\n" + footer(info)
    print(markdown)
    write_outputs(args.json, args.markdown, {"rows": rows, "info": info}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
