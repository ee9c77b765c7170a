"""``bitfit-hf serve --ray``: the server as a Ray Serve application, on a local Ray cluster this module starts
(loopback, ephemeral ports, 2 replicas, little CPU). Checked by what the cluster answers: mixed traffic equals
the in-process server's answers, admin changes reach every replica (and a replica started later), a killed
replica loses no request that a client retries on 503, and shutting down leaves no process behind."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
from serve_support import ADMIN_TOKEN, adapters, call, predict, specs, start_server  # noqa: F401 - fixtures
from tiny import alone, tiny_tokenizer

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'bitfit-hf[ray]')")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'bitfit-hf[ray]')")

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

APP = "bitfit-test"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SERVED = ("c0", "c1", "tag", "qa")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is gone too
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster(adapters):  # noqa: F811
    """A local Ray cluster with the application deployed on 2 replicas; shut down (and checked) afterwards."""
    from ray import serve

    from bitfit_hf.serving.config import ServeConfig
    from bitfit_hf.serving.ray import build_app, free_port

    os.environ["BITFIT_HF_ADMIN_TOKEN"] = ADMIN_TOKEN  # the workers Ray starts inherit it
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_app(specs(adapters, *SERVED), ServeConfig(threads=1, max_wait_ms=5), replicas=2, num_cpus=0.5,
                    change_wait_s=60)
    serve.run(app, name=APP, route_prefix="/", blocking=False)
    url = f"http://127.0.0.1:{port}"
    state = {"url": url, "pids": set()}
    try:
        yield state
    finally:
        del os.environ["BITFIT_HF_ADMIN_TOKEN"]
        serve.shutdown()
        ray.shutdown()


def replicas(url: str):
    status, _, body = call(url, "GET", "/admin/replicas", headers=AUTH)
    assert status == 200, body
    return body


def tagged(url: str, body, retries: int = 0, retry_on=(503,), seen=None):
    """``(status, replica, answer)`` of one /predict, retrying on ``retry_on`` as a client honouring Retry-After
    would; every status met on the way is appended to ``seen``."""
    for _ in range(retries + 1):
        status, headers, answer = predict(url, body)
        if seen is not None:
            seen.append(status)
        if status not in retry_on:
            break
        time.sleep(0.2)
    return status, headers.get("x-bitfit-replica"), answer


def from_every_replica(url: str, body, replicas: int = 0, including=(), clients: int = 3, timeout_s: float = 90.0):
    """``{replica: [(status, answer), ...]}``: every answer to ``body``, sent by ``clients`` concurrent clients
    until ``replicas`` distinct replicas, ``including`` these tags, have answered. Concurrent, because Ray's proxy routes a lone
    sequential client by queue length and may keep every request on one idle replica."""
    answers, stop, lock = {}, threading.Event(), threading.Lock()

    def client() -> None:
        until = time.monotonic() + timeout_s
        while not stop.is_set() and time.monotonic() < until:
            status, replica, answer = tagged(url, body)
            with lock:
                answers.setdefault(replica, []).append((status, answer))
                if len(answers) >= replicas and set(including) <= set(answers):
                    stop.set()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    assert len(answers) >= replicas and set(including) <= set(answers), \
        f"only {sorted(answers)} answered within {timeout_s:.0f} s (wanted {replicas}, including {sorted(including)})"
    return answers


def scores(model, text):
    import torch

    with torch.no_grad():
        probs = model(**tiny_tokenizer()(text, return_tensors="pt")).logits[0].softmax(-1)
    return {model.config.id2label[i]: float(p) for i, p in enumerate(probs)}


def _close(a, b, tol=1e-5):
    """Two JSON answers equal, numbers to ``tol``."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


BODIES = [
    {"inputs": "the cat sat on the mat", "adapter": "c0"},
    {"inputs": ["a good film", "it was dull"], "adapter": "c0"},
    {"inputs": [["a very good movie"], ["the plot was bad", "a mess"]], "adapter": "c1"},
    {"inputs": "the dog runs in the city", "adapter": "tag"},
    {"inputs": {"question": "where is the cat", "context": "the cat sat on the mat by the river"}, "adapter": "qa"},
    {"inputs": "what a tedious story", "adapter": "c1", "raw_scores": True},
]


def test_mixed_traffic_equals_the_in_process_server(cluster, adapters, start_server):  # noqa: F811
    url = cluster["url"]
    local = start_server(specs(adapters, *SERVED), threads=1, max_wait_ms=5)  # the cluster's limits
    expected = [predict(local.url, body)[2] for body in BODIES]
    got = [None] * (3 * len(BODIES))

    def client(k: int) -> None:
        for i in range(k, len(got), 3):
            got[i] = tagged(url, BODIES[i % len(BODIES)])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, (status, _, answer) in enumerate(got):
        assert status == 200, answer
        assert _close(answer, expected[i % len(BODIES)]), (BODIES[i % len(BODIES)], answer, expected[i % len(BODIES)])
    assert len({replica for _, replica, _ in got}) == 2  # both replicas answered
    for path in ("/adapters", "/info", "/health"):  # the other routes answer as the plain server's
        status, _, body = call(url, "GET", path)
        assert status == 200
        plain = call(local.url, "GET", path)[2]
        if path == "/adapters":
            assert body == plain
        elif path == "/info":
            assert {k: v for k, v in body.items() if k != "admin"} == {k: v for k, v in plain.items() if k != "admin"}
        else:
            assert body["status"] == "ok" and body["adapters"] == len(SERVED)
    status, _, text = call(url, "GET", "/metrics")
    assert status == 200 and "bitfit_serve_requests_total" in text
    status, _, body = predict(url, {"inputs": "x", "adapter": "nope"})
    assert status == 404 and body["error_type"] == "not_found" and body["adapters"] == sorted(SERVED)


def test_admin_changes_reach_every_replica(cluster, adapters, tmp_path):  # noqa: F811
    url = cluster["url"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, _, body = call(url, "POST", "/admin/adapters", {"name": "late", "source": adapters["c2"]}, headers=headers)
        assert status == 401 and body["error_type"] == "unauthorized"
        assert call(url, "GET", "/admin/replicas", headers=headers)[0] == 401
    status, _, added = call(url, "POST", "/admin/adapters", {"name": "late", "source": adapters["c2"]}, headers=AUTH)
    assert status == 201, added
    assert added["name"] == "late" and len(added["labels"]) == 5
    assert len(added["replicas"]["updated"]) == 2 and not added["replicas"]["pending"] and not added["replicas"]["failed"]
    want = scores(alone(adapters["c2"]), "a good film")
    answers = from_every_replica(url, {"inputs": "a good film", "adapter": "late"}, replicas=2)
    for replica, met in answers.items():
        for status, body in met:
            assert status == 200, (replica, body)
            assert {g["label"]: g["score"] for g in body} == pytest.approx(want, abs=1e-5)
    assert call(url, "POST", "/admin/adapters", {"name": "late", "source": adapters["c1"]}, headers=AUTH)[0] == 409

    # a source no replica can load: refused where it arrives, the catalog is unchanged
    damaged = shutil.copytree(adapters["c2"], tmp_path / "damaged")
    (damaged / "adapter_model.safetensors").write_bytes(b"not a tensor file")
    status, _, body = call(url, "POST", "/admin/adapters", {"name": "bad", "source": str(damaged)}, headers=AUTH)
    assert status == 422 and body["error_type"] == "load_failed"
    assert "bad" not in replicas(url)["adapters"]

    # an adapter a replica cannot load that reaches the catalog anyway (e.g. a folder missing on that node):
    # every replica reports it, and keeps serving the others
    from ray import serve

    from bitfit_hf.serving.ray import CATALOG_DEPLOYMENT

    catalog = serve.get_deployment_handle(CATALOG_DEPLOYMENT, app_name=APP)
    catalog.add.remote({"name": "gone", "source": str(tmp_path / "missing"), "revision": None}).result()
    until = time.monotonic() + 60
    while time.monotonic() < until:
        report = replicas(url)
        if len(report["replicas"]) == 2 and all("gone" in r["failed"] for r in report["replicas"].values()):
            break
        time.sleep(0.2)
    assert all("gone" in r["failed"] for r in report["replicas"].values()), report
    for _ in range(6):
        assert tagged(url, {"inputs": "the cat", "adapter": "c0"})[0] == 200
    assert tagged(url, {"inputs": "the cat", "adapter": "gone"})[0] == 404
    status, _, body = call(url, "DELETE", "/admin/adapters/gone", headers=AUTH)  # removable from any replica
    assert status == 200, body
    assert "gone" not in replicas(url)["adapters"]

    status, _, body = call(url, "DELETE", "/admin/adapters/late", headers=AUTH)
    assert status == 200 and "late" not in body["adapters"]
    for _ in range(8):
        assert tagged(url, {"inputs": "a good film", "adapter": "late"})[0] == 404


def test_a_killed_replica_loses_no_request_that_is_retried(cluster, adapters):  # noqa: F811
    """Kill one replica mid-traffic (``ray.kill``: no drain, as a crash or a lost node): every request ends with
    its answer for a client that retries 503 and, for the requests the dead replica held, the 500 Ray's proxy
    gives them (a prediction is safe to repeat; Ray cannot know that, so it does not retry a request a replica
    had accepted). Requests not yet on the dead replica are routed to the other by Ray. Ray then starts a
    replacement, which loads the adapter set as it is now (including one added at run time)."""
    url = cluster["url"]
    status, _, added = call(url, "POST", "/admin/adapters", {"name": "kept", "source": adapters["c2"]}, headers=AUTH)
    assert status == 201, added
    before = replicas(url)["replicas"]
    victim_tag, victim = sorted(before.items())[0]
    stop = threading.Event()
    results, met = [], []

    def client(k: int) -> None:
        while not stop.is_set():
            body = BODIES[(len(results) + k) % len(BODIES)]
            results.append(tagged(url, body, retries=50, retry_on=(500, 503), seen=met))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        ray.kill(ray.get_actor(victim["where"]["actor"], namespace="serve"), no_restart=True)
        time.sleep(3.0)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    statuses = [status for status, _, _ in results]
    assert results and statuses.count(200) == len(statuses), sorted(set(statuses))
    assert set(met) <= {200, 500, 503} and met.count(500) <= 3, met  # at most one 500 per client: those in flight
    print(f"kill: {len(results)} requests, all answered; met on the way: {met.count(500)} x 500, "
          f"{met.count(503)} x 503")

    until = time.monotonic() + 120  # Ray replaces the replica; the new one loads the current set before serving
    fresh = []
    while not fresh and time.monotonic() < until:
        fresh = [t for t in replicas(url)["replicas"] if t not in before]
        time.sleep(0.5)
    assert fresh, "no replacement replica within 120 s"
    answers = from_every_replica(url, {"inputs": "a good film", "adapter": "kept"}, including=fresh[:1], timeout_s=60)
    assert all(status == 200 for met in answers.values() for status, _ in met), answers
    assert not _alive(victim["where"]["pid"])


def test_shutdown_leaves_no_process(cluster):
    """Deleting the application stops its replicas (they drain first); nothing of them stays running."""
    from ray import serve

    pids = [r["where"]["pid"] for r in replicas(cluster["url"])["replicas"].values()]
    assert pids
    serve.delete(APP)
    until = time.monotonic() + 60
    while time.monotonic() < until and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    assert call(cluster["url"], "GET", "/health")[0] == 404  # the proxy answers: no application at this route


def test_the_serve_run_config_builds(adapters, tmp_path):  # noqa: F811
    """deploy/ray-serve.yaml is a valid Ray Serve config, and its builder makes the two deployments."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from bitfit_hf.serving.config import ServeError
    from bitfit_hf.serving.ray import app_builder, parse_autoscale

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "deploy", "ray-serve.yaml")) as handle:
        config = yaml.safe_load(handle)
    ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(config)
    args = dict(config["applications"][0]["args"])
    args["adapters_file"] = str(tmp_path / "adapters.yaml")
    (tmp_path / "adapters.yaml").write_text(f"adapters:\n  c0: {adapters['c0']}\n")
    built = app_builder(args)
    assert type(built).__name__ == "Application"
    assert parse_autoscale("1:4") == (1, 4)
    for bad in ("4:1", "0:2", "x", "3"):
        with pytest.raises(ServeError):
            parse_autoscale(bad)
    with pytest.raises(ServeError, match="unknown args"):
        app_builder({"adapter": {}})
