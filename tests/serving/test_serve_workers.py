"""``bitfit-hf serve --workers 2`` (loopback, an ephemeral port, tiny adapters): both processes answer as one
in-process engine does, metrics are summed over them, a worker killed under load is replaced with no request
lost, a replacement serves the adapters that still load, SIGTERM exits 0 with no process left, and what the
mode cannot do is refused at the start with the reason."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from serve_support import adapters, call, metric, predict, specs, start_cli, start_server  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SENTENCES = ["the cat sat on the mat", "a fine film", "nothing happened at all", "rain again"]


def children(pid: int) -> set:
    """The worker processes of the server ``pid`` (its spawned children, not multiprocessing's tracker)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and b"spawn_main" in command:
            found.add(int(entry))
    return found


def start_workers(*adapter_args: str):
    """The CLI with two workers; ``(process, url, log lines)`` once it listens."""
    return start_cli("--workers", "2", "--threads", "1", *adapter_args, drop_env=("BITFIT_HF_ADMIN_TOKEN",))


def stop(server) -> int:
    server.send_signal(signal.SIGTERM)
    return server.wait(120)


def wait_for(predicate, timeout: float = 120.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def close(got, want) -> bool:
    """Equal answers: the same structure and labels, scores within 1e-5."""
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(close, got, want))
    if isinstance(want, float):
        return isinstance(got, (int, float)) and abs(got - want) <= 1e-5
    return got == want


def test_workers_answer_as_one_engine_and_sum_their_metrics(adapters, start_server):  # noqa: F811
    reference = start_server(specs(adapters, "c0", "c1", "tag"))
    server, url, _ = start_workers(f"c0={adapters['c0']}", f"c1={adapters['c1']}", f"tag={adapters['tag']}")
    try:
        assert len(children(server.pid)) == 2
        sent = 0
        for _ in range(3):  # a new connection each: the kernel hands them to either worker
            for adapter in ("c0", "c1", "tag"):
                body = {"inputs": SENTENCES, "adapter": adapter}
                status, _, got = predict(url, body)
                _, _, want = predict(reference.url, body)
                sent += 1
                assert status == 200 and close(got, want), (got, want)
        _, _, text = call(url, "GET", "/metrics")
        answered = sum(metric(text, "bitfit_serve_requests_total", adapter=a, status="200") for a in ("c0", "c1", "tag"))
        assert answered == sent  # whichever worker answered, /metrics (from either) counts both
        assert metric(text, "bitfit_serve_adapters", mode="mixed") == 3.0  # the largest of the workers', not a sum
    finally:
        assert stop(server) == 0
    assert not children(server.pid)


def test_a_killed_worker_is_replaced_and_no_request_is_lost(adapters, tmp_path):  # noqa: F811
    moved = shutil.copytree(adapters["c1"], tmp_path / "c1-copy")
    server, url, log = start_workers(f"c0={adapters['c0']}", f"moved={moved}")
    tally, lock, halt = [], threading.Lock(), threading.Event()

    def client() -> None:  # what a client that retries on a dropped connection sees
        while not halt.is_set():
            for attempt in range(20):
                try:
                    status, _, _ = predict(url, {"inputs": "a fine film", "adapter": "c0"}, timeout=60)
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                status = "lost"
            with lock:
                tally.append(status)

    try:
        workers = children(server.pid)
        assert len(workers) == 2
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        shutil.rmtree(moved)  # its adapter no longer loads: a replacement must start without it
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: len(children(server.pid) - {victim}) == 2), "no replacement started"
        replacement = (children(server.pid) - workers).pop()
        time.sleep(1.0)
        halt.set()
        for t in threads:
            t.join(120)
        assert len(tally) > 20 and set(tally) == {200}, {s: tally.count(s) for s in set(tally)}
        assert wait_for(lambda: any("no longer loads" in line for line in log), 30), "".join(log[-20:])
        for _ in range(6):  # the replacement (or the other worker) answers c0
            assert predict(url, {"inputs": "rain", "adapter": "c0"})[0] == 200
        assert replacement in children(server.pid)
    finally:
        halt.set()
        assert stop(server) == 0
    assert not children(server.pid)


def test_sigterm_under_load_answers_what_it_took_then_refuses(adapters):  # noqa: F811
    server, url, _ = start_workers(f"c0={adapters['c0']}")
    tally, lock, halt = [], threading.Lock(), threading.Event()

    def client() -> None:
        while not halt.is_set():
            try:
                status = predict(url, {"inputs": "a fine film", "adapter": "c0"}, timeout=60)[0]
            except OSError:
                status = "closed"
                time.sleep(0.05)
            with lock:
                tally.append(status)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    code = stop(server)
    time.sleep(0.5)
    halt.set()
    for t in threads:
        t.join(120)
    assert code == 0 and not children(server.pid)
    assert tally.count(200) > 10 and set(tally) <= {200, "closed"}, {s: tally.count(s) for s in set(tally)}


def test_what_workers_cannot_do_is_refused_at_the_start(adapters, tmp_path):  # noqa: F811
    def refused(*args, env=None):
        environment = {k: v for k, v in os.environ.items() if k != "BITFIT_HF_ADMIN_TOKEN"}
        environment.update(env or {})
        proc = subprocess.run([sys.executable, "-m", "bitfit_hf.cli", "serve", "--port", "0", *args], env=environment,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr
        return proc.stderr

    one = f"c0={adapters['c0']}"
    assert "--ray" in refused("--workers", "2", one, env={"BITFIT_HF_ADMIN_TOKEN": "secret-token-0123456789"})
    assert "--replicas" in refused("--workers", "2", "--ray", one)
    assert "at least 1" in refused("--workers", "0", one)
    assert "no adapters to serve" in refused("--workers", "2")  # said before any worker loads a model
    (tmp_path / "empty").mkdir()
    said = refused("--workers", "2", one, f"broken={tmp_path / 'empty'}")
    assert "a worker could not start" in said and "broken" in said
