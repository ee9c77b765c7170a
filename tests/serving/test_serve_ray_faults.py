"""Ray replicas that recover and agree, on a local Ray cluster (loopback, ephemeral ports, 2 replicas, little
CPU): simultaneous adds on both replicas, an add and a delete 10 ms apart, a replica killed (SIGKILL) under
traffic with an admin add 1 s later, and a replacement started after a deploy-time adapter was deleted and
its folder removed. Each test counts what clients lost (no answer after retrying 500 / 503) and what they
got wrong (an answer that differs from the one before the fault, or an adapter served where it should not
be), and prints the counts."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest
from serve_support import ADMIN_TOKEN, adapters, call, predict, specs  # noqa: F401 - fixtures

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'bitfit-hf[ray]')")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'bitfit-hf[ray]')")

from test_serve_ray import AUTH, _alive, _close, from_every_replica, replicas  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

APP = "bitfit-faults"
BODIES = [{"inputs": "the cat sat on the mat", "adapter": "c0"},
          {"inputs": ["a good film", "it was dull"], "adapter": "c0"},
          {"inputs": "the dog runs in the city", "adapter": "tag"}]


@pytest.fixture(scope="module")
def cluster(adapters, tmp_path_factory):  # noqa: F811
    """2 replicas of c0, tag and ``doomed``, each a copy this module may delete."""
    from ray import serve

    from bitfit_hf.serving.config import AdapterSpec, ServeConfig
    from bitfit_hf.serving.ray import build_app, free_port

    root = tmp_path_factory.mktemp("faults")
    copies = {name: str(shutil.copytree(adapters[src], root / name))
              for name, src in (("c0", "c0"), ("tag", "tag"), ("doomed", "c1"), ("extra", "c2"))}
    os.environ["BITFIT_HF_ADMIN_TOKEN"] = ADMIN_TOKEN  # the workers Ray starts inherit it
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deployed = [AdapterSpec(n, copies[n]) for n in ("c0", "tag", "doomed")]
    serve.run(build_app(deployed, ServeConfig(threads=1, max_wait_ms=5), replicas=2, num_cpus=0.5, change_wait_s=60),
              name=APP, route_prefix="/", blocking=False)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "copies": copies}
    finally:
        del os.environ["BITFIT_HF_ADMIN_TOKEN"]
        serve.shutdown()
        ray.shutdown()


def agreed(url: str) -> dict:
    """``/admin/replicas`` once every live replica serves the catalog's version, its whole set and nothing else."""
    report = replicas(url)
    for tag, state in report["replicas"].items():
        assert state["epoch"] == report["epoch"] and state["version"] == report["version"], (tag, report)
        assert not state["missing"] and not state["extra"] and not state["failed"], (tag, report)
    return report


def admin(url: str, method: str, name: str, source: str = ""):
    """``(status, replica, body, seconds)`` of one admin add (with ``source``) or delete."""
    began = time.monotonic()
    if method == "POST":
        status, headers, body = call(url, "POST", "/admin/adapters", {"name": name, "source": source}, headers=AUTH)
    else:
        status, headers, body = call(url, "DELETE", f"/admin/adapters/{name}", headers=AUTH)
    return status, headers.get("x-bitfit-replica"), body, time.monotonic() - began


def together(*calls):
    """Run the calls in threads released at the same moment (``(delay_s, fn, args)``); their results."""
    results, gate = [None] * len(calls), threading.Barrier(len(calls))

    def run(i, delay_s, fn, args):
        gate.wait()
        time.sleep(delay_s)
        results[i] = fn(*args)

    threads = [threading.Thread(target=run, args=(i, *c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_simultaneous_adds_on_two_replicas_agree(cluster):
    """Two adds of different names at the same moment, 10 rounds: after both answered, every replica
    serves both (the catalog's version is every replica's, with nothing missing), and both answer."""
    url, source = cluster["url"], cluster["copies"]["extra"]
    crossed, diverged = 0, 0
    for i in range(10):
        a, b = together((0, admin, (url, "POST", f"a{i}", source)), (0, admin, (url, "POST", f"b{i}", source)))
        assert a[0] == b[0] == 201, (a, b)
        assert not a[2]["replicas"]["pending"] and not b[2]["replicas"]["pending"], (a, b)
        crossed += a[1] != b[1]
        try:
            agreed(url)
        except AssertionError:
            diverged += 1
    wrong = sum(status != 200 for name in ("a0", "b9") for met in from_every_replica(
        url, {"inputs": "a good film", "adapter": name}, replicas=2).values() for status, _ in met)
    print(f"simultaneous adds: 10 rounds ({crossed} on two different replicas), {diverged} diverged, "
          f"{wrong} wrong answers")
    assert diverged == 0 and wrong == 0
    for i in range(10):
        for name in (f"a{i}", f"b{i}"):
            assert admin(url, "DELETE", name)[0] == 200
    agreed(url)


def test_an_add_and_a_delete_10_ms_apart_never_reserve_it(cluster):
    """The delete, if it was recorded after the add, leaves the adapter nowhere: no replica answers it."""
    url, source = cluster["url"], cluster["copies"]["extra"]
    reserved = 0
    for i in range(5):
        name = f"brief{i}"
        added, deleted = together((0, admin, (url, "POST", name, source)), (0.01, admin, (url, "DELETE", name)))
        assert added[0] == 201 and deleted[0] in (200, 404), (added, deleted)
        if deleted[0] == 404:  # the delete reached the catalog first: the add stands; delete it now
            assert admin(url, "DELETE", name)[0] == 200
        assert name not in agreed(url)["adapters"]
        answers = from_every_replica(url, {"inputs": "a good film", "adapter": name}, replicas=2)
        reserved += sum(status == 200 for met in answers.values() for status, _ in met)
    print(f"add then delete 10 ms apart: 5 rounds, {reserved} answers from a deleted adapter")
    assert reserved == 0


def test_a_sigkilled_replica_loses_nothing_retried_and_an_add_1_s_later_does_not_wait_for_it(cluster):
    """4 clients retrying 500 (Ray's proxy, for the requests the dead replica held) and 503; SIGKILL one
    replica; 1 s later an admin add, answered without waiting for the dead replica; Ray's replacement starts
    from the catalog (the add included) and serves."""
    url = cluster["url"]
    expected = [predict(url, body)[2] for body in BODIES]
    before = replicas(url)["replicas"]
    victim_tag, victim = sorted(before.items())[0]
    stop, lock = threading.Event(), threading.Lock()
    tally = {"requests": 0, "lost": 0, "wrong": 0, "met": []}

    def client(k: int) -> None:
        n = k
        while not stop.is_set():
            i, n = n % len(BODIES), n + 1
            for _ in range(60):
                try:
                    status, _, answer = predict(url, BODIES[i], timeout=60)
                except OSError:
                    status, answer = "closed", None
                with lock:
                    tally["met"].append(status)
                if status not in (500, 503, "closed"):
                    break
                time.sleep(0.2)
            with lock:
                tally["requests"] += 1
                tally["lost"] += status != 200
                tally["wrong"] += status == 200 and not _close(answer, expected[i])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        killed = time.monotonic()
        os.kill(victim["where"]["pid"], signal.SIGKILL)
        time.sleep(1.0)
        status, _, added, took = admin(url, "POST", "late", cluster["copies"]["extra"])
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(180)
    met = tally["met"]
    print(f"SIGKILL under 4 clients: {tally['requests']} requests, {tally['lost']} lost, {tally['wrong']} wrong; "
          f"met on the way: {met.count(500)} x 500, {met.count(503)} x 503, {met.count('closed')} closed, "
          f"{met.count(404)} x 404; admin add 1 s after the kill: {status} in {took:.2f} s")
    assert tally["requests"] and tally["lost"] == 0 and tally["wrong"] == 0
    assert set(met) <= {200, 500, 503, "closed"} and met.count(500) <= 4, met
    assert status == 201 and took < 10.0, (status, took, added)
    assert victim_tag not in added["replicas"]["updated"] and not added["replicas"]["pending"], added

    fresh = []
    while not fresh and time.monotonic() < killed + 120:
        fresh = [t for t in replicas(url)["replicas"] if t not in before]
        time.sleep(0.2)
    assert fresh, "no replacement replica within 120 s"
    answers = from_every_replica(url, {"inputs": "a good film", "adapter": "late"}, including=fresh[:1], timeout_s=60)
    print(f"replacement {fresh[0]} serving {time.monotonic() - killed:.1f} s after the kill")
    assert all(status == 200 for met in answers.values() for status, _ in met), answers
    assert not _alive(victim["where"]["pid"])
    agreed(url)
    assert admin(url, "DELETE", "late")[0] == 200


def test_a_deploy_time_adapter_deleted_and_gone_never_blocks_a_replacement(cluster):
    """Delete ``doomed`` (deployed with the application), remove its folder, kill a replica: the replacement
    starts from the catalog, which no longer lists it, and the application stays healthy."""
    from ray import serve

    url = cluster["url"]
    assert admin(url, "DELETE", "doomed")[0] == 200
    shutil.rmtree(cluster["copies"]["doomed"])
    before = replicas(url)["replicas"]
    victim = sorted(before.values(), key=lambda r: r["where"]["pid"])[0]
    killed = time.monotonic()
    os.kill(victim["where"]["pid"], signal.SIGKILL)
    fresh = []
    while not fresh and time.monotonic() < killed + 120:
        fresh = [t for t in replicas(url)["replicas"] if t not in before]
        time.sleep(0.2)
    assert fresh, "no replacement replica within 120 s"
    print(f"replacement after a deleted deploy-time adapter: reported {time.monotonic() - killed:.1f} s after the kill")
    report = agreed(url)
    assert sorted(report["adapters"]) == ["c0", "tag"] and len(report["replicas"]) == 2
    answers = from_every_replica(url, BODIES[0], including=fresh[:1], timeout_s=60)
    assert all(status == 200 for met in answers.values() for status, _ in met), answers
    assert predict(url, {"inputs": "a good film", "adapter": "doomed"})[0] == 404
    until = time.monotonic() + 30
    while serve.status().applications[APP].status != "RUNNING" and time.monotonic() < until:
        time.sleep(0.5)
    app = serve.status().applications[APP]
    assert app.status == "RUNNING" and app.deployments["BitFitServe"].status == "HEALTHY", app
