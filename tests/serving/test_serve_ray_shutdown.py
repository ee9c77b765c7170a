"""SIGTERM to ``bitfit-hf serve --ray`` under load (its own local Ray cluster, loopback, an ephemeral port, 2
replicas): requests already taken are answered, new ones meet 503 with Retry-After and then a refused
connection, never a 404 (which in this API means "no such adapter", and which clients do not retry); the
process exits 0 and leaves no Ray process behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from serve_support import adapters, predict, start_cli  # noqa: F401 - fixtures

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'bitfit-hf[ray]')")

from test_serve_ray import _alive  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

BODY = {"inputs": "the cat sat on the mat", "adapter": "c0"}


def descendants(pid: int) -> set:
    """Every process below ``pid`` (Ray's GCS, raylet, workers and their children)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def start_front(adapters):  # noqa: F811
    """The CLI on a local cluster; ``(process, url, log lines)`` once it listens."""
    return start_cli("--ray", "--replicas", "2", "--replica-cpus", "0.5", "--threads", "1", "--max-wait-ms", "5",
                     f"c0={adapters['c0']}", f"tag={adapters['tag']}", drop_env=("RAY_ADDRESS",))


def test_sigterm_under_load_answers_503_then_closes_never_404(adapters):  # noqa: F811
    front, url, log = start_front(adapters)
    tally, lock, stop = [], threading.Lock(), threading.Event()
    signalled = {}

    def client() -> None:
        refused_since = None
        while not stop.is_set():
            sent = time.monotonic()
            try:
                status, headers, _ = predict(url, BODY, timeout=60)
                refused_since = None
            except OSError:
                status, headers = "closed", {}
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since > 1.0:
                    return
                time.sleep(0.05)
            with lock:
                tally.append((sent < signalled.get("at", float("inf")), status, headers.get("retry-after")))

    try:
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        processes = descendants(front.pid)
        signalled["at"] = time.monotonic()
        front.send_signal(signal.SIGTERM)
        code = front.wait(120)
        exited = time.monotonic() - signalled["at"]
        stop.set()
        for t in threads:
            t.join(90)
    finally:
        if front.poll() is None:
            front.kill()
            front.wait(30)
    before = [status for taken, status, _ in tally if taken]
    after = [status for taken, status, _ in tally if not taken]
    print(f"SIGTERM under 4 clients: sent before: {before.count(200)} x 200, {before.count(503)} x 503, "
          f"{before.count('closed')} closed; sent after: {after.count(200)} x 200, {after.count(503)} x 503, "
          f"{after.count('closed')} closed, {after.count(404) + before.count(404)} x 404, "
          f"{after.count(500) + before.count(500)} x 500; exit {code} after {exited:.1f} s")
    assert code == 0, "".join(log[-30:])
    assert before and set(before) <= {200, 503}, before  # taken before the signal: answered (503: just after it)
    assert set(after) <= {200, 503, "closed"}, sorted(set(map(str, after)))
    assert all(retry for _, status, retry in tally if status == 503)
    until = time.monotonic() + 30
    while any(_alive(p) for p in processes) and time.monotonic() < until:
        time.sleep(0.2)
    assert not [p for p in processes if _alive(p)], "Ray processes left behind"
