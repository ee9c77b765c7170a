"""`bitfit-hf serve` under a closed-loop load: 1, 8 and 64 adapters on one all-MiniLM-L6-v2, localhost only.

    python benchmarks/serve_load.py              # the table in benchmarks/README.md (a few minutes)
    python benchmarks/serve_load.py --quick      # 1 and 8 adapters, few requests (the test suite runs it)
    python benchmarks/serve_load.py --adapters 8 --ray-replicas 1,2   # the plain server vs `serve --ray`
    python benchmarks/serve_load.py --adapters 64 --baseline-checkout ../old --also-padded   # vs another commit, and vs --packing off

What it does:

1. Builds N adapters (BitFit, or drawn in turn from `--methods`) on all-MiniLM-L6-v2 the way the default recipe trains them (the checkpoint's mean
   pooling, biases ``all`` + a 2-label head; values randomly perturbed, which changes no timing) in a temp
   folder, plus an adapters file per configuration.
2. For each configuration starts ``bitfit-hf serve`` as a subprocess on an ephemeral port (``--threads``
   torch threads, default 1), waits for ``/health``, sends a warm-up, then runs a **closed loop**:
   ``--clients`` threads, each with one keep-alive connection, each sending its next ``POST /predict`` (one
   sentence, an adapter drawn uniformly from the N) as soon as the previous answer arrives, until
   ``--requests`` answers have come back. Requests/s = answers / wall time; p50 / p99 of the per-request
   latency seen by the client. Every answer must be 200.
3. Resident memory of the server process (``VmRSS`` after the load, and ``VmHWM``) from /proc.
4. Configurations: (a) one adapter; mixed batching with 8 and 64; (b) 64 adapters switched per forward
   pass (``--batching switch``: requests for different adapters never share a forward pass); (c) one full
   model copy per task, memory only, computed: the one-adapter server's RSS + (N-1) x the model's bytes.
   Configurations run ``--reps`` times in rotating order so the machine's background load hits them alike;
   the table gives the median of each number and the median of the per-rep ratios to the one-adapter run.
5. ``--ray-replicas 1,2``: instead, the plain server with the largest adapter count against ``bitfit-hf serve
   --ray --replicas N`` with the same adapters (a local Ray cluster the server starts, one torch thread and one
   reserved CPU per replica, requests through Ray's HTTP proxy). CPU and memory are then summed over the
   server's whole process tree (driver, GCS, raylet, proxy, controller, replicas).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, Iterable, List, Optional, Sequence, Union

from report import footer, load_average, machine_info, write_outputs  # benchmarks/report.py

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ("the a film movie story plot actor actress director scene ending music was is felt seemed very quite "
         "rather truly good bad great terrible boring gripping witty dull slow fast long short funny sad moving "
         "and but with without its this that every most some charming tedious brilliant awful clever "
         "predictable beautiful ugly warm cold honest fake").split()


def sentences(n: int, seed: int = 0) -> List[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24))) + "." for _ in range(n)]


def base_path(base: Optional[str]) -> str:
    """``--base`` (a checkpoint folder with its tokenizer), else the installed all-MiniLM-L6-v2."""
    if base:
        return base
    from bitfit_hf.data.assets import minilm_path

    return minilm_path()


def method_config(method: str):
    """A servable method's default config by its ``--method`` name (``lora``: BitFit + LoRA training no bias)."""
    from bitfit_hf import BitFitConfig
    from bitfit_hf.tuners.adapterbias import AdapterBiasConfig
    from bitfit_hf.tuners.bitfit_ia3 import BitFitIA3Config, IA3Config
    from bitfit_hf.tuners.bitfit_lora import BitFitLoraConfig
    from bitfit_hf.tuners.ln_tuning import LNTuningMethodConfig

    configs = {"bitfit": lambda: BitFitConfig("all"), "ia3": IA3Config, "bitfit_ia3": BitFitIA3Config,
               "lora": lambda: BitFitLoraConfig(bias_terms="frozen"), "bitfit_lora": BitFitLoraConfig,
               "adapterbias": AdapterBiasConfig, "ln_tuning": LNTuningMethodConfig}
    if method not in configs:
        raise SystemExit(f"error: --methods: {method!r} is not one of {', '.join(configs)}")
    return configs[method]()


def build_adapters(root: str, n: int, base: Optional[str] = None, methods: Sequence[str] = ("bitfit",)) -> Dict[str, str]:
    """``n`` adapters in ``root``, their methods drawn in turn from ``methods`` (pooled as the recipe trains them on
    MiniLM; on a ``--base`` that is not a sentence-transformers checkpoint, its own pooler), each method's default
    configuration with its trained tensors randomly perturbed (which changes no timing); returns
    ``{name: folder}``."""
    import torch
    import transformers as T

    from bitfit_hf import BitFitAdapter
    from bitfit_hf.tuners import apply_method
    from bitfit_hf.utils.sentence_pooling import checkpoint_pooling, install_sentence_pooling

    T.logging.set_verbosity_error()
    path = base_path(base)
    prepared = {}
    for method in dict.fromkeys(methods):
        torch.manual_seed(0)
        model = T.AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
        pooling = checkpoint_pooling(path)
        if pooling is not None:
            install_sentence_pooling(model, pooling)  # as `accelerate launch recipes/glue.py` trains
        apply_method(model, method_config(method))
        trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
        prepared[method] = (model, trained, {name: p.detach().clone() for name, p in trained.items()})
    found = {}
    for i in range(n):
        model, trained, start = prepared[methods[i % len(methods)]]
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in trained.items():
                p.copy_(start[name] + 0.05 * torch.randn(p.shape, generator=g))
        folder = os.path.join(root, f"task{i:02d}")
        BitFitAdapter.from_model(model).save_pretrained(folder)
        found[f"task{i:02d}"] = folder
    return found


def model_bytes(base: Optional[str] = None) -> int:
    """Bytes of one full classification model of the base (parameters + buffers), as each per-task copy would hold."""
    import torch
    import transformers as T

    config = T.AutoConfig.from_pretrained(base_path(base), num_labels=2)
    with torch.device("meta"):
        model = T.AutoModelForSequenceClassification.from_config(config)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _tree(pid: int) -> List[int]:
    """``pid`` and every process below it (a Ray server's cluster: GCS, raylet, proxy, replicas)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _stat_cpu(path: str) -> float:
    """User + system CPU seconds in a ``/proc/.../stat`` file (a process's or one thread's); 0 once it is gone."""
    try:
        with open(path) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and the processes below it (all their threads)."""
    return sum(_stat_cpu(f"/proc/{each}/stat") for each in _tree(pid))


def _thread_cpu(pid: int) -> Dict[str, float]:
    """CPU seconds so far of the server's threads by kind: ``event loop`` (the main thread of the process
    ``pid``), the OS name of every other thread (``bitfit-worker``: the worker and the torch threads it started;
    ``bitfit-tokenize``; a release that names no thread shows ``python``), and ``other processes`` (a Ray
    cluster's). The worker processes of ``serve --workers`` count as the server's own."""
    found: Dict[str, float] = {}
    for each in _tree(pid):
        try:
            tasks = os.listdir(f"/proc/{each}/task")
            with open(f"/proc/{each}/cmdline", "rb") as handle:
                server = each == pid or b"spawn_main" in handle.read()  # a `serve --workers` worker
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{each}/task/{tid}/comm") as handle:
                    name = handle.read().strip()
            except OSError:
                continue
            kind = "other processes" if not server else ("event loop" if int(tid) == each else name)
            found[kind] = found.get(kind, 0.0) + _stat_cpu(f"/proc/{each}/task/{tid}/stat")
    return found


def _status(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM summed over the process and those below it (one process for the plain server)."""
    found = {"VmRSS": 0, "VmHWM": 0}
    for each in _tree(pid):
        try:
            with open(f"/proc/{each}/status") as handle:
                for line in handle:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "VmHWM"):
                        found[key] += int(value.split()[0]) * 1024
        except OSError:
            continue
    return found


class Server:
    def __init__(self, adapters_file: str, tokenizer: str, batching: str, threads: int, max_batch: int, wait_ms: float,
                 device: str = "cpu", dtype: str = "float32", ray_replicas: int = 0, admin_token: Optional[str] = None,
                 checkout: Optional[str] = None, flags: Sequence[str] = ()):
        # `bitfit-hf serve` through its own verb module only (the same code path; another verb's state in a
        # working tree being edited cannot stop the benchmark)
        launcher = ("import argparse, logging, sys; from bitfit_hf.cli import serve_cmd; "
                    "p = argparse.ArgumentParser(prog='bitfit-hf'); serve_cmd.register(p.add_subparsers(dest='verb')); "
                    "a = p.parse_args(sys.argv[1:]); logging.basicConfig(level=logging.WARNING, format='%(message)s'); "
                    "sys.exit(a.run(a))")
        args = [sys.executable, "-c", launcher, "serve", "--adapters-file", adapters_file, "--tokenizer", tokenizer, "--port", "0",
                "--threads", str(threads), "--batching", batching, "--max-batch-size", str(max_batch),
                "--max-wait-ms", str(wait_ms), "--max-queue", "1024", "--log-level", "warning", "--device", device,
                "--dtype", dtype, *flags]
        if ray_replicas:
            args += ["--ray", "--replicas", str(ray_replicas), "--replica-cpus", str(threads)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        if admin_token:
            env["BITFIT_HF_ADMIN_TOKEN"] = admin_token
        if checkout:  # another checkout's bitfit_hf: `python -c` imports from its working directory first
            env["PYTHONPATH"] = os.pathsep.join([checkout, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                                     cwd=checkout or None)
        self.url = None
        lines = []
        until = time.monotonic() + 600
        while self.url is None and time.monotonic() < until:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"listening on http://([^:/]+):(\d+)", line)
            if found:
                self.host, self.port = found.group(1), int(found.group(2))
                self.url = f"http://{self.host}:{self.port}"
        if self.url is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(lines[-20:]))
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep draining its stderr

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _clients(targets: List[tuple], names: List[str], texts: List[str], ks: Sequence[int], take, seed: int) -> dict:
    """Closed-loop clients ``ks`` (threads, one keep-alive connection each, client ``k`` to target ``k`` modulo
    their number) while ``take()`` grants another request: their latencies, failures, wall time and CPU."""
    lock = threading.Lock()
    latencies: List[float] = []
    failures: List[str] = []

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        host, port = targets[k % len(targets)]
        conn = http.client.HTTPConnection(host, port, timeout=120)
        while take():
            body = json.dumps({"inputs": rng.choice(texts), "adapter": rng.choice(names)})
            began = time.perf_counter()
            conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            elapsed = time.perf_counter() - began
            with lock:
                latencies.append(elapsed)
                if response.status != 200:
                    failures.append(f"{response.status} {payload[:200]!r}")
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in ks]
    began, cpu_began = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies": latencies, "failures": failures, "wall_s": time.perf_counter() - began,
            "cpu_s": time.process_time() - cpu_began}  # every thread of this process: the load generator's own cost


def _budget(counter, requests: int):
    """``take()``: whether another request may go, drawn from ``counter`` (a ``multiprocessing.Value``, shared by
    the threads of one process or by several processes) until ``requests`` went."""
    def take() -> bool:
        with counter.get_lock():
            if counter.value >= requests:
                return False
            counter.value += 1
            return True

    return take


def _client_process(targets, names, texts, ks, counter, requests, seed, start, results) -> None:
    """One load-generating process of ``--client-procs``: its clients draw requests from the shared ``counter``."""
    start.wait()
    results.put(_clients(targets, names, texts, ks, _budget(counter, requests), seed))


def closed_loop(server: Union[Server, List[Server]], names: List[str], texts: List[str], clients: int, requests: int,
                seed: int, procs: int = 1) -> dict:
    """``clients`` closed-loop clients until ``requests`` answers came back; with a list of servers, client ``k``
    talks to server ``k`` modulo their number (the clients split evenly). ``procs`` > 1 spreads the clients over
    that many processes, so that one Python process's GIL does not cap a fast server (a GPU's)."""
    servers = server if isinstance(server, list) else [server]
    targets = [(each.host, each.port) for each in servers]
    if procs <= 1:
        parts = [_clients(targets, names, texts, range(clients), _budget(multiprocessing.Value("q", 0), requests), seed)]
    else:
        context = multiprocessing.get_context("spawn")  # no fork of a process that runs threads
        counter, start, queue = context.Value("q", 0), context.Event(), context.Queue()
        workers = [context.Process(target=_client_process, daemon=True,
                                   args=(targets, names, texts, list(range(p, clients, procs)), counter, requests, seed,
                                         start, queue))
                   for p in range(procs)]
        for each in workers:
            each.start()
        start.set()  # the processes have imported this module; every one starts its clients now
        parts = [queue.get(timeout=3600) for _ in workers]
        for each in workers:
            each.join(60)
    latencies = sorted(x for part in parts for x in part["latencies"])
    failures = [x for part in parts for x in part["failures"]]
    wall = max(part["wall_s"] for part in parts)

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(round(q * (len(latencies) - 1))))]

    return {"requests": len(latencies), "wall_s": wall, "rps": len(latencies) / wall, "p50_ms": 1000 * pct(0.50),
            "p99_ms": 1000 * pct(0.99), "mean_ms": 1000 * statistics.fmean(latencies), "failures": failures[:5],
            "failed": len(failures),
            "client_cpu_ms": 1000 * sum(part["cpu_s"] for part in parts) / max(1, len(latencies)),
            "client_busy": max(part["cpu_s"] / part["wall_s"] for part in parts)}  # near 1: the clients set the pace


CHURN_TOKEN = "serve-load-admin"


def build_churn_adapters(root: str, base: Optional[str] = None) -> List[str]:
    """What the admin adds and removes while traffic runs: a tagger (its first add builds a model for a new head
    type) and a classifier of another method (an (IA)³ one)."""
    import torch
    import transformers as T

    from bitfit_hf import BitFitAdapter, BitFitConfig
    from bitfit_hf.tuners import apply_method
    from bitfit_hf.tuners.bitfit_ia3 import IA3Config
    from bitfit_hf.utils.sentence_pooling import checkpoint_pooling, install_sentence_pooling

    path = base_path(base)
    folders = []
    for kind, cls, config in (("tagger", T.AutoModelForTokenClassification, BitFitConfig("all")),
                              ("ia3", T.AutoModelForSequenceClassification, IA3Config())):
        torch.manual_seed(1)
        model = cls.from_pretrained(path, num_labels=3 if kind == "tagger" else 2)
        if kind == "ia3" and checkpoint_pooling(path) is not None:
            install_sentence_pooling(model, checkpoint_pooling(path))
        apply_method(model, config)
        folder = os.path.join(root, f"churn-{kind}")
        BitFitAdapter.from_model(model).save_pretrained(folder)
        folders.append(folder)
    return folders


def admin_churn(server: Server, sources: List[str], stop: threading.Event, pause_s: float = 0.25) -> dict:
    """Add then remove an adapter, cycling through ``sources``, until ``stop``; the adds' latencies."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    auth = {"Authorization": f"Bearer {CHURN_TOKEN}", "Content-Type": "application/json"}
    adds: List[float] = []
    k = 0
    while not stop.is_set():
        began = time.perf_counter()
        conn.request("POST", "/admin/adapters", body=json.dumps({"name": f"churn{k}", "source": sources[k % len(sources)]}),
                     headers=auth)
        response = conn.getresponse()
        response.read()
        if response.status != 201:
            raise RuntimeError(f"admin add answered {response.status}")
        adds.append(time.perf_counter() - began)
        conn.request("DELETE", f"/admin/adapters/churn{k}", headers=auth)
        conn.getresponse().read()
        k += 1
        stop.wait(pause_s)
    conn.close()
    return {"adds": len(adds), "add_ms_max": 1000 * max(adds, default=0.0)}


def metrics_of(server: Server) -> Dict[str, float]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    found = {}
    for line in text.splitlines():
        for key in ("bitfit_serve_batch_size_sum", "bitfit_serve_batch_size_count", "bitfit_serve_batch_adapters_sum",
                    "bitfit_serve_batch_adapters_count", "bitfit_serve_adapter_switches_total"):
            if line.startswith(key):
                found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def _summed(counts: Iterable[Dict[str, float]]) -> Dict[str, float]:
    """Key-wise sums (one server's figures, or several servers' together)."""
    total: Dict[str, float] = {}
    for each in counts:
        for key, value in each.items():
            total[key] = total.get(key, 0) + value
    return total


def run_config(cfg: dict, adapters: Dict[str, str], tokenizer: str, args, texts: List[str], workdir: str, rep: int) -> dict:
    names = sorted(adapters)[: cfg["n"]]
    spec_file = os.path.join(workdir, f"{cfg['key']}.json")
    with open(spec_file, "w") as handle:
        json.dump({"adapters": {n: adapters[n] for n in names}}, handle)
    servers: List[Server] = []
    churn: Dict[str, float] = {}
    try:
        for _ in range(cfg.get("split", 1)):  # split: that many servers of one torch thread each
            servers.append(Server(spec_file, tokenizer, cfg["batching"], 1 if cfg.get("split") else cfg.get("threads", args.threads),
                                  args.max_batch_size, args.max_wait_ms, args.device, cfg.get("dtype", args.dtype),
                                  cfg.get("ray", 0), admin_token=CHURN_TOKEN if cfg.get("churn") else None,
                                  checkout=cfg.get("checkout"), flags=cfg.get("flags", ())))
        server = servers[0]
        warm = closed_loop(servers, names, texts, args.clients, args.warmup, seed=10_000 + rep, procs=args.client_procs)
        before = _summed(metrics_of(each) for each in servers)
        cpu_before = sum(_cpu_seconds(each.proc.pid) for each in servers)
        threads_before = _summed(_thread_cpu(each.proc.pid) for each in servers)
        stop = threading.Event()
        if cfg.get("churn"):
            churner = threading.Thread(target=lambda: churn.update(admin_churn(server, args.churn_sources, stop)))
            churner.start()
        result = closed_loop(servers, names, texts, args.clients, args.requests, seed=rep, procs=args.client_procs)
        stop.set()
        if cfg.get("churn"):
            churner.join()
        cpu = sum(_cpu_seconds(each.proc.pid) for each in servers) - cpu_before
        threads_after = _summed(_thread_cpu(each.proc.pid) for each in servers)
        after = _summed(metrics_of(each) for each in servers)
        memory = _summed(_status(each.proc.pid) for each in servers)
    finally:
        for each in servers:
            each.stop()
    if warm["failed"] or result["failed"]:
        raise RuntimeError(f"{cfg['key']}: {result['failed'] + warm['failed']} failed requests: {result['failures'] or warm['failures']}")
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    batches = delta.get("bitfit_serve_batch_size_count", 0.0) or 1.0
    by_thread = {kind: 1000 * (seconds - threads_before.get(kind, 0.0)) / result["requests"]
                 for kind, seconds in threads_after.items()}
    return {**result, "rss_bytes": memory["VmRSS"], "server_cpu_ms": 1000 * cpu / result["requests"], "hwm_bytes": memory["VmHWM"],
            "thread_cpu_ms": {kind: ms for kind, ms in by_thread.items() if ms > 0.0},
            "mean_batch": delta.get("bitfit_serve_batch_size_sum", 0.0) / batches,
            "mean_adapters_per_batch": delta.get("bitfit_serve_batch_adapters_sum", 0.0) / (delta.get("bitfit_serve_batch_adapters_count") or 1.0),
            "switches": delta.get("bitfit_serve_adapter_switches_total", 0.0), **churn}


THREAD_ORDER = ("bitfit-worker", "event loop", "bitfit-tokenize", "python", "other processes")


def thread_table(rows: List[dict]) -> List[str]:
    """Markdown lines: each configuration's server CPU per request by thread kind (medians over its runs)."""
    kinds = sorted({kind for row in rows for run in row["runs"] for kind in run.get("thread_cpu_ms", {})},
                   key=lambda kind: (THREAD_ORDER.index(kind) if kind in THREAD_ORDER else len(THREAD_ORDER), kind))
    if not kinds:
        return []
    names = {"bitfit-worker": "worker (and its torch threads)", "bitfit-tokenize": "tokenizing threads",
             "python": "unnamed threads", "event loop": "event loop (HTTP)"}
    lines = ["Server CPU ms per request by thread (the server's threads, by their OS names; a release that names "
             "none shows them as unnamed):", "",
             "| configuration | " + " | ".join(names.get(kind, kind) for kind in kinds) + " |",
             "| --- |" + " ---: |" * len(kinds)]
    for row in rows:
        cells = [statistics.median(run.get("thread_cpu_ms", {}).get(kind, 0.0) for run in row["runs"]) for kind in kinds]
        lines.append(f"| {row['what']} | " + " | ".join(f"{cell:.2f}" for cell in cells) + " |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 8 adapters, 60 requests, 1 rep")
    parser.add_argument("--adapters", default=None, help="comma list of adapter counts (default 1,8,64)")
    parser.add_argument("--methods", default="bitfit", help="comma list of methods the adapters are drawn from in turn "
                        "(default bitfit; the first adapter, the one-adapter run's, is of the first method)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients (default 16)")
    parser.add_argument("--client-procs", type=int, default=1, help="processes the clients are spread over (default 1; "
                        "more where one Python process cannot keep a fast server busy, e.g. on a GPU)")
    parser.add_argument("--requests", type=int, default=None, help="measured requests per run (default 600)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up requests per run (default 64)")
    parser.add_argument("--reps", type=int, default=None, help="runs of each configuration, rotating order (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server (default 1)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--base", default=None, help="a checkpoint folder with its tokenizer (default: all-MiniLM-L6-v2)")
    parser.add_argument("--device", default="cpu", help="the server's --device (default cpu)")
    parser.add_argument("--dtype", default="float32", help="the server's --dtype (default float32)")
    parser.add_argument("--ray-replicas", default=None,
                        help="comma list of replica counts: compare the plain server with `serve --ray --replicas N` "
                             "at the largest --adapters count (needs the ray extra)")
    parser.add_argument("--baseline-checkout", default=None, help="another checkout of bitfit-hf (a git worktree of "
                        "an older commit): also run the largest count mixed with its server, in the same rotation")
    parser.add_argument("--baseline-name", default=None, help="what the tables call the --baseline-checkout "
                        "(default: its git commit; give one for a copy that is no git checkout)")
    parser.add_argument("--baseline-dtype", default=None, help="the --dtype of the --baseline-checkout server "
                        "(default: --dtype)")
    parser.add_argument("--also-padded", action="store_true", help="also run the largest count mixed with "
                        "--packing off (every pass padded), in the same rotation")
    parser.add_argument("--split-servers", type=int, default=0,
                        help="also run the largest count mixed as N servers of one torch thread each, the clients "
                             "split evenly among them (a process per core behind a load balancer), in the same rotation")
    parser.add_argument("--no-switch", action="store_true", help="leave out (b), the largest count switching per "
                        "forward pass (the slowest configuration)")
    parser.add_argument("--workers", type=int, default=0,
                        help="also run the largest count mixed as one server of N worker processes of one torch thread "
                             "each (`serve --workers N --threads 1`), in the same rotation")
    parser.add_argument("--admin-churn", action="store_true", help="also run the largest count while an admin adds "
                        "and removes adapters (a tagger and an (IA)3 classifier) every 0.25 s: p99 with and without")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    counts = [int(x) for x in (args.adapters or ("1,8" if args.quick else "1,8,64")).split(",")]
    args.requests = args.requests or (60 if args.quick else 600)
    args.warmup = args.warmup or (16 if args.quick else 64)
    reps = args.reps or (1 if args.quick else 2)
    info = machine_info()
    info["load_before"] = load_average()
    info["torch_threads"] = args.threads
    info["command"] = " ".join(["python benchmarks/serve_load.py", *(argv if argv is not None else sys.argv[1:])])
    configs = [{"key": "one", "n": 1, "batching": "mixed", "what": "(a) one adapter"}]
    configs += [{"key": f"mixed-{n}", "n": n, "batching": "mixed", "what": f"{n} adapters, mixed batches"} for n in counts if n > 1]
    biggest = max(counts)
    if args.ray_replicas:  # the plain server against Ray Serve deployments of it, same adapters
        configs = [{"key": f"plain-{biggest}", "n": biggest, "batching": "mixed",
                    "what": f"plain server, {biggest} adapters, mixed batches"}]
        configs += [{"key": f"ray-{r}", "n": biggest, "batching": "mixed", "ray": r,
                     "what": f"Ray Serve, {r} replica(s), {biggest} adapters, mixed batches"}
                    for r in (int(x) for x in args.ray_replicas.split(","))]
    elif biggest > 1 and not args.no_switch:
        configs.append({"key": f"switch-{biggest}", "n": biggest, "batching": "switch",
                        "what": f"(b) {biggest} adapters, switching per forward pass"})
    texts = sentences(200)
    with tempfile.TemporaryDirectory() as workdir:
        if args.admin_churn:
            args.churn_sources = build_churn_adapters(workdir, args.base)
            configs.append({"key": f"churn-{biggest}", "n": biggest, "batching": "mixed", "churn": True,
                            "what": f"{biggest} adapters, mixed, while an admin adds and removes adapters"})
        if args.split_servers:
            configs.append({"key": f"split-{biggest}", "n": biggest, "batching": "mixed", "split": args.split_servers,
                            "what": f"{biggest} adapters, mixed batches, {args.split_servers} servers of one torch "
                                    "thread each (the clients split evenly)"})
        if args.workers:
            configs.append({"key": f"workers-{biggest}", "n": biggest, "batching": "mixed", "threads": 1,
                            "flags": ["--workers", str(args.workers)],
                            "what": f"{biggest} adapters, mixed batches, one server of {args.workers} workers of one "
                                    "torch thread each (`--workers`)"})
        if args.also_padded:
            configs.append({"key": f"padded-{biggest}", "n": biggest, "batching": "mixed", "flags": ["--packing", "off"],
                            "what": f"{biggest} adapters, mixed batches, --packing off"})
        if args.baseline_checkout:
            commit = args.baseline_name or subprocess.run(["git", "-C", args.baseline_checkout, "rev-parse", "--short", "HEAD"],
                                                          capture_output=True, text=True).stdout.strip() or "?"
            configs.append({"key": f"baseline-{biggest}", "n": biggest, "batching": "mixed",
                            "checkout": os.path.abspath(args.baseline_checkout),
                            "dtype": args.baseline_dtype or args.dtype,
                            "what": f"{biggest} adapters, mixed batches, the server of commit {commit} "
                                    f"(--dtype {args.baseline_dtype or args.dtype})"})
        runs: Dict[str, List[dict]] = {c["key"]: [] for c in configs}
        print(f"building {biggest} adapters ...", file=sys.stderr, flush=True)
        adapters = build_adapters(workdir, biggest, args.base, [m.strip() for m in args.methods.split(",") if m.strip()])
        for rep in range(reps):
            order = configs[rep % len(configs):] + configs[: rep % len(configs)]
            for cfg in order:
                result = run_config(cfg, adapters, base_path(args.base), args, texts, workdir, rep)
                runs[cfg["key"]].append(result)
                print(f"rep {rep} {cfg['key']}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.1f} ms, "
                      f"p99 {result['p99_ms']:.1f} ms, RSS {result['rss_bytes'] / 2**20:.0f} MiB, "
                      f"batch {result['mean_batch']:.1f} inputs / {result['mean_adapters_per_batch']:.1f} adapters",
                      file=sys.stderr, flush=True)
    full_model = model_bytes(args.base)
    info["load_after"] = load_average()
    rows = []
    one = runs[configs[0]["key"]]  # the reference of the ratios: one adapter, or the plain server against Ray
    for cfg in configs:
        rs = runs[cfg["key"]]
        med = {k: statistics.median(r[k] for r in rs) for k in ("rps", "p50_ms", "p99_ms", "server_cpu_ms", "rss_bytes", "hwm_bytes",
                                                                 "mean_batch", "mean_adapters_per_batch", "switches")}
        med["rps_vs_one"] = statistics.median(r["rps"] / o["rps"] for r, o in zip(rs, one))
        med["cpu_vs_one"] = statistics.median(r["server_cpu_ms"] / o["server_cpu_ms"] for r, o in zip(rs, one))
        med["rss_vs_one"] = statistics.median(r["rss_bytes"] / o["rss_bytes"] for r, o in zip(rs, one))
        rows.append({**cfg, **med, "runs": rs})
    one_rss = statistics.median(r["rss_bytes"] for r in one)
    copies = {n: one_rss + (n - 1) * full_model for n in counts}
    results = {"configs": rows, "full_model_bytes": full_model, "full_copies_rss_bytes": copies, "clients": args.clients,
               "requests": args.requests, "reps": reps, "threads": args.threads, "max_batch_size": args.max_batch_size,
               "max_wait_ms": args.max_wait_ms, "info": info}
    ref = "vs plain server" if args.ray_replicas else "vs one adapter"
    md = [f"| configuration | adapters | req/s | {ref} | p50 ms | p99 ms | server CPU ms / request | {ref} "
          f"| inputs / forward | adapters / forward | RSS MiB | RSS {ref} |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        md.append(f"| {row['what']} | {row['n']} | {row['rps']:.1f} | {row['rps_vs_one']:.3f}× | {row['p50_ms']:.1f} | "
                  f"{row['p99_ms']:.1f} | {row['server_cpu_ms']:.1f} | {row['cpu_vs_one']:.3f}× | {row['mean_batch']:.1f} | {row['mean_adapters_per_batch']:.1f} | "
                  f"{row['rss_bytes'] / 2**20:.0f} | {row['rss_vs_one']:.3f}× |")
    for n, value in copies.items():
        if n > 1 and not args.ray_replicas:
            md.append(f"| (c) one full model copy per task, memory only (computed) | {n} | – | – | – | – | – | – | – | – | "
                      f"{value / 2**20:.0f} | {value / one_rss:.2f}× |")
    baseline = [row for row in rows if row.get("checkout")]
    if baseline:
        md.append("")
        md.append(f"Against {baseline[0]['what'].split(', ', 2)[-1]}, same adapters and clients, in the same rotation "
                  "(medians of per-run ratios):")
        for key in (f"mixed-{biggest}", f"padded-{biggest}", f"split-{biggest}", f"workers-{biggest}"):
            if key in runs:
                rps = statistics.median(o["rps"] / b["rps"] for o, b in zip(runs[key], baseline[0]["runs"]))
                p99 = statistics.median(o["p99_ms"] / b["p99_ms"] for o, b in zip(runs[key], baseline[0]["runs"]))
                what = next(row["what"] for row in rows if row["key"] == key)
                md.append(f"* {what}: **{rps:.2f}×** its requests/s and {p99:.2f}× its p99.")
    churned = [row for row in rows if row.get("churn")]
    if churned:
        plain = runs[f"mixed-{biggest}"]
        ratio = statistics.median(c["p99_ms"] / p["p99_ms"] for c, p in zip(churned[0]["runs"], plain))
        adds = statistics.median(r["adds"] for r in churned[0]["runs"])
        md.append("")
        md.append(f"While an admin added and removed adapters ({adds:.0f} adds per run, one every 0.25 s or as fast as "
                  f"they answered: a tagger, whose first add builds a model for a new head type, and an (IA)³ "
                  f"classifier; slowest add {statistics.median(r['add_ms_max'] for r in churned[0]['runs']):.0f} ms), "
                  f"the other traffic's p99 was **{ratio:.2f}×** its p99 without adds (median of per-run ratios).")
    md.extend(["", *thread_table(rows)])
    md.append("")
    md.append(f"Closed loop: {args.clients} clients, {args.requests} measured requests per run after {args.warmup} "
              f"warm-up, {reps} run(s) per configuration in rotating order (medians; ratios are medians of per-run "
              f"ratios); one sentence of 6-24 words per request, adapter drawn uniformly; server `--threads "
              f"{args.threads} --max-batch-size {args.max_batch_size} --max-wait-ms {args.max_wait_ms}`; client "
              f"and server on the same machine (localhost). (c) = one-adapter RSS + (N-1) × {full_model / 2**20:.1f} "
              f"MiB (the base's parameters and buffers, float32; server `--device {args.device} --dtype {args.dtype}`). "
              "Server CPU ms / request: the server process's user + system CPU time during the measured requests over their number (less sensitive to other load on the machine "
              f"than req/s). The load generator itself used {statistics.median(r['client_cpu_ms'] for rs in runs.values() for r in rs):.2f} "
              f"ms of CPU per request (median over runs) over {args.client_procs} process(es), the busiest of them busy "
              f"{100 * max(r.get('client_busy', 0.0) for rs in runs.values() for r in rs):.0f}% of its wall time at most "
              "(near 100% the load generator, not the server, set the pace: raise --client-procs).")
    markdown = "\n".join(md) + "\n\n" + footer(info)
    print(markdown)
    write_outputs(args.json, args.markdown, results, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
