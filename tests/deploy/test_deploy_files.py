"""deploy/: the Dockerfile, the Kubernetes manifest and the systemd unit run `bitfit-hf serve` with flags it has.

Each file's serve command line is read from the file (ENTRYPOINT + CMD; the container's command + args;
ExecStart) and parsed by the real `bitfit-hf` parser, every flag spelled in full (argparse would take a prefix);
the files must listen on 0.0.0.0, probe /health on the port they serve, read the admin token from a secret, pin
every Hub adapter to a revision and stop with SIGTERM after --graceful-timeout, before a SIGKILL. The last test
starts the Kubernetes command line on a tiny local adapter and stops it as Kubernetes does. No image is built.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from bitfit_hf.cli.main import build_parser
from bitfit_hf.serving.config import ADMIN_TOKEN_ENV, read_adapters_file

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HEALTH = "/health"


def serve_parser():
    return build_parser()._subparsers._group_actions[0].choices["serve"]


def check_serve_argv(argv: list, where: str):
    """Parse ``argv`` (what follows ``bitfit-hf serve``) as the CLI does; return the namespace."""
    options = {s for action in serve_parser()._actions for s in action.option_strings}
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in options, f"{where}: {flag} is not a `bitfit-hf serve` flag (see bitfit-hf serve --help)"
    try:
        args = build_parser().parse_args(["serve", *argv])
    except SystemExit as exit_:
        raise AssertionError(f"{where}: `bitfit-hf serve {shlex.join(argv)}` is refused by the parser") from exit_
    assert args.host == "0.0.0.0", f"{where}: a server in a container or on a host listens on --host 0.0.0.0"
    assert args.graceful_timeout is not None, f"{where}: bound the drain at shutdown with --graceful-timeout"
    return args


def check_pinned(adapters_file: Path, where: str) -> None:
    """Every adapter from the Hub has a revision; local folders need none."""
    specs, _ = read_adapters_file(str(adapters_file))
    assert specs, where
    for spec in specs:
        local = spec.source.startswith((".", "/", "~"))
        assert local or spec.revision, f"{where}: adapter {spec.name!r} ({spec.source}) is not pinned to a revision"


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list:
    """``(INSTRUCTION, rest)`` pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in (DEPLOY / "Dockerfile").read_text().splitlines()
                                       if not line.lstrip().startswith("#")))
    return [tuple(line.strip().split(None, 1)) for line in text.splitlines() if line.strip()]


def test_dockerfile_serve_command_health_check_and_stop():
    instructions = dockerfile_instructions()
    last = {name: rest for name, rest in instructions}  # the final stage's value wins
    entrypoint, cmd = json.loads(last["ENTRYPOINT"]), json.loads(last["CMD"])
    assert entrypoint[:2] == ["bitfit-hf", "serve"], "exec form, so SIGTERM reaches the server (no shell between)"
    args = check_serve_argv(entrypoint[2:] + cmd, "deploy/Dockerfile")
    assert last["EXPOSE"] == str(args.port)
    assert last["STOPSIGNAL"] == "SIGTERM"
    check = last["HEALTHCHECK"]
    assert f"http://127.0.0.1:{args.port}{HEALTH}" in check and "--start-period" in check
    # the adapters file CMD names is the one deploy/README.md mounts: deploy/adapters.yaml, pinned
    assert cmd == ["--adapters-file", "/etc/bitfit-hf/adapters.yaml"]
    check_pinned(DEPLOY / "adapters.yaml", "deploy/adapters.yaml")
    # both bases: python (CPU torch index) by default, a CUDA base by build argument
    assert ("ARG", "BASE_IMAGE=python:3.12-slim") in instructions
    assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu") in instructions
    assert "nvidia/cuda:" in (DEPLOY / "Dockerfile").read_text()
    # docker stop's SIGKILL comes after --stop-timeout: the documented run gives the drain time to finish
    stop = re.search(r"--stop-timeout (\d+)", (DEPLOY / "Dockerfile").read_text())
    assert stop and int(stop.group(1)) > args.graceful_timeout
    assert last["USER"] != "root" and ADMIN_TOKEN_ENV in (DEPLOY / "Dockerfile").read_text()
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


# --------------------------------------------------------------------------- Kubernetes


def kubernetes_objects() -> dict:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()) if doc}


def serve_container(objects: dict) -> dict:
    (container,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_kubernetes_deployment_probes_secret_pinning_and_graceful_stop(tmp_path):
    objects = kubernetes_objects()
    assert set(objects) == {"ConfigMap", "Deployment", "Service"}, "the Secret is created by hand, never committed"
    container = serve_container(objects)
    assert container["command"] == ["bitfit-hf", "serve"]
    argv = [str(a) for a in container["args"]]
    args = check_serve_argv(argv, "deploy/kubernetes.yaml")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": args.port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == HEALTH and ports.get(get["port"], get["port"]) == args.port, probe
    env = {e["name"]: e for e in container["env"]}
    assert env[ADMIN_TOKEN_ENV]["valueFrom"]["secretKeyRef"]["name"] == "bitfit-hf-serve"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    # stop: preStop sleep, then SIGTERM, then up to --graceful-timeout of drain, all inside the grace period
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > sleep + args.graceful_timeout
    # the adapters file the command reads is the ConfigMap, mounted read-only, every Hub adapter pinned
    mount = {m["name"]: m for m in container["volumeMounts"]}["adapters"]
    assert args.adapters_file == mount["mountPath"] + "/adapters.yaml" and mount["readOnly"]
    volume = {v["name"]: v for v in pod["volumes"]}["adapters"]
    config_map = objects["ConfigMap"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    (tmp_path / "adapters.yaml").write_text(config_map["data"]["adapters.yaml"])
    check_pinned(tmp_path / "adapters.yaml", "deploy/kubernetes.yaml ConfigMap")
    service = objects["Service"]["spec"]
    assert service["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert service["ports"][0]["targetPort"] == "http"


# --------------------------------------------------------------------------- systemd


def unit_settings() -> dict:
    """``{key: [values]}`` of the unit file, continuation lines joined, comments dropped."""
    settings: dict = {}
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "bitfit-hf-serve.service").read_text())
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_command_readiness_secret_and_stop():
    settings = unit_settings()
    (exec_start,) = settings["ExecStart"]
    tokens = shlex.split(exec_start)
    assert tokens[0].endswith("/bin/bitfit-hf") and tokens[1] == "serve"
    args = check_serve_argv(tokens[2:], "deploy/bitfit-hf-serve.service")
    assert any(f"http://127.0.0.1:{args.port}{HEALTH}" in value for value in settings["ExecStartPost"])
    assert settings["KillSignal"] == ["SIGTERM"] and int(settings["TimeoutStopSec"][0]) > args.graceful_timeout
    assert settings["EnvironmentFile"][0].lstrip("-") == "/etc/bitfit-hf/serve.env"
    assert args.adapters_file == "/etc/bitfit-hf/adapters.yaml"
    assert settings["Restart"] == ["on-failure"]


def test_systemd_unit_is_valid_for_systemd(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    proc = subprocess.run(["systemd-analyze", "verify", str(DEPLOY / "bitfit-hf-serve.service")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                if line.strip() and "is not executable" not in line]  # the venv is not installed here
    assert not problems, problems


def test_the_three_files_and_the_readme_run_one_command_line():
    """deploy/README.md says all three run the same command line: the same options, once parsed (Kubernetes adds
    --threads to match its CPU request)."""
    def options(argv, where):
        return {k: v for k, v in vars(check_serve_argv(argv, where)).items() if k not in ("threads", "run")}

    readme = (DEPLOY / "README.md").read_text()
    tokens = shlex.split(readme.split("```bash\n", 1)[1].split("```", 1)[0])
    assert tokens[:2] == ["bitfit-hf", "serve"]
    last = {name: rest for name, rest in dockerfile_instructions()}
    files = {
        "deploy/Dockerfile": json.loads(last["ENTRYPOINT"])[2:] + json.loads(last["CMD"]),
        "deploy/kubernetes.yaml": [str(a) for a in serve_container(kubernetes_objects())["args"]],
        "deploy/bitfit-hf-serve.service": shlex.split(unit_settings()["ExecStart"][0])[2:],
    }
    expected = options(tokens[2:], "deploy/README.md")
    for where, argv in files.items():
        assert options(argv, where) == expected, where


# --------------------------------------------------------------------------- serve --help


def test_serve_help_shows_every_default_and_the_container_host():
    """Each option's help, as `serve --help` prints it, says its default (a repeatable option has none)."""
    parser = serve_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            shown = formatter._expand_help(action)  # the help string with argparse's "(default: ...)" added
            assert "default" in shown or "repeatable" in shown, f"{action.option_strings[0]}: {shown!r}"
    help_text = " ".join(parser.format_help().split())
    assert "--host 0.0.0.0" in help_text and "(default: 127.0.0.1)" in help_text and "(default: 8080)" in help_text
    assert "HF_TOKEN" in help_text and ADMIN_TOKEN_ENV in help_text


# --------------------------------------------------------------------------- the Kubernetes command, run


@pytest.mark.slow
def test_kubernetes_command_serves_health_and_stops_on_sigterm(tmp_path):
    """The manifest's command line on a tiny local adapter: /health answers 200, SIGTERM ends it by the signal
    within --graceful-timeout."""
    spec = importlib.util.spec_from_file_location("serving_tiny", REPO / "tests" / "serving" / "tiny.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    base = tiny.save_base(str(tmp_path / "base"))
    tiny.make_adapter(base, str(tmp_path / "mrpc"))
    (tmp_path / "adapters.yaml").write_text("adapters:\n  mrpc: ./mrpc\n")

    argv = [str(a) for a in serve_container(kubernetes_objects())["args"]]
    args = check_serve_argv(argv, "deploy/kubernetes.yaml")
    argv[argv.index("--adapters-file") + 1] = str(tmp_path / "adapters.yaml")
    argv[argv.index("--port") + 1] = "0"
    argv[argv.index("--threads") + 1] = "1"
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           ADMIN_TOKEN_ENV: "t" * 48, "HF_HOME": str(tmp_path / "hf_home")}
    proc = subprocess.Popen([sys.executable, "-m", "bitfit_hf.cli", "serve", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server did not start"
        assert url.startswith("http://0.0.0.0:")
        port = url.rsplit(":", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{HEALTH}", timeout=10) as answer:
            assert answer.status == 200 and json.load(answer)["status"] == "ok"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(args.graceful_timeout + 10)
        assert time.monotonic() - started < args.graceful_timeout
        assert proc.returncode == 0, proc.stderr.read()[-2000:]  # a drained stop is a clean exit for a supervisor
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
