"""``bitfit-hf serve ADAPTER...``: many task adapters on one frozen base over HTTP.

Adapters are local folders or Hub ids (``NAME=SOURCE[@REVISION]``), or come from ``--adapters-file``
(YAML / JSON). Requests for different adapters share forward passes (mixed-task dynamic batching);
adapters that insert modules are served by switching. Routes: POST /predict, GET /adapters, /health,
/info, /metrics, and POST / DELETE /admin/adapters with the token in $BITFIT_HF_ADMIN_TOKEN. See
docs/serving.md; container, Kubernetes and systemd files in deploy/.
"""

from __future__ import annotations

import argparse
import logging
import sys

from bitfit_hf.cli.errors import CliError
from bitfit_hf.inference.inputs import DOC_STRIDE

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


#: Said under the options of ``serve --help``: the environment the server reads.
ENVIRONMENT_HELP = (
    "environment: BITFIT_HF_ADMIN_TOKEN turns the admin routes on (every call needs 'Authorization: Bearer "
    "<token>'; unset: the routes answer 403); HF_TOKEN (or `hf auth login`) reads private Hub adapters and bases; "
    "HF_HOME is the download cache. Pin Hub adapters to a commit (NAME=org/repo@<sha>) so every replica serves "
    "the same files."
)


class _DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in ``--help``, as argparse words it, except where there is no value to show.

    ``None`` (the option is off, or its help says what decides) and a store-true's ``False`` would read as
    values, so those options say their default in their own help instead.
    """

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def register(verbs) -> None:
    parser = verbs.add_parser("serve", help="serve many adapters on one base over HTTP (mixed-task batching)",
                              description=__doc__.split("\n\n")[1].replace("\n", " ").replace("``", ""),
                              epilog=ENVIRONMENT_HELP, formatter_class=_DefaultsHelpFormatter)
    parser.add_argument("adapters", nargs="*", metavar="ADAPTER",
                        help="NAME=SOURCE[@REVISION] (a folder or a Hub id; REVISION a branch, tag or commit of a Hub "
                             "id); the name defaults to the folder / repo name; private Hub ids need HF_TOKEN")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=SOURCE[@REVISION]",
                        help="one more adapter (repeatable)")
    parser.add_argument("--adapters-file",
                        help="YAML or JSON: {base_model: ..., adapters: {name: source or {source, revision}}} "
                             "(default: none; relative folders are read from the file's folder)")
    parser.add_argument("--base-model", help="load this base (folder or Hub id) instead of the one the adapters "
                                             "record (default: the first adapter's recorded base)")
    parser.add_argument("--tokenizer", help="tokenizer folder or Hub id (default: beside the adapters, else the base's)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; 0.0.0.0: every interface. In a container (Docker, Kubernetes) "
                             "pass --host 0.0.0.0: the default answers only inside the container")
    parser.add_argument("--port", type=int, default=8080, help="port; 0 takes any free port and prints it at start")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda when there is one)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="dtype of the base's weights; auto: bfloat16 on a CUDA device, float32 on a CPU")
    parser.add_argument("--threads", type=int, help="torch threads of the worker (default: torch's)")
    parser.add_argument("--workers", type=int, default=1,
                        help="server processes on the one port, each with the base, every adapter and --threads torch "
                             "threads; on a CPU host, one per core with --threads 1 serves most. The adapter set is then "
                             "fixed (no admin token); a worker that dies is replaced")
    parser.add_argument("--batching", default="mixed", choices=("mixed", "switch"),
                        help="mixed: adapters share forward passes; switch: one adapter per forward pass")
    parser.add_argument("--packing", default="auto", choices=("auto", "off"),
                        help="auto: a mixed pass of an encoder runs its inputs packed end to end, computing no "
                             "padding, where a probe at start shows packed and padded passes agree; off: padded")
    parser.add_argument("--max-batch-size", type=int, default=32, help="inputs in one forward pass")
    parser.add_argument("--max-batch-tokens", type=int, default=16384,
                        help="padded tokens in one forward pass (inputs x the longest one), so long inputs take "
                             "fewer rows; one input longer than this runs alone")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch waits to fill")
    parser.add_argument("--max-queue", type=int, default=256, help="requests waiting before 503 + Retry-After")
    parser.add_argument("--max-client-batch-size", type=int, default=32, help="inputs in one request (413 beyond)")
    parser.add_argument("--max-input-length", type=int, help="tokens per input (default: the model's limit)")
    parser.add_argument("--payload-limit", type=int, default=2_000_000, help="bytes in one request body (413 beyond)")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="seconds from arrival to answer (504 beyond)")
    parser.add_argument("--doc-stride", type=int, default=DOC_STRIDE,
                        help="tokens two neighbouring windows of a long QA context share (lowered where the question "
                             "leaves less room); the context is read whole, window by window")
    parser.add_argument("--auto-truncate", action="store_true",
                        help="cut over-long inputs unless a request says truncate: false (default: off, refused)")
    parser.add_argument("--graceful-timeout", type=float,
                        help="seconds to finish queued requests after SIGTERM / Ctrl-C (default: all of them, "
                             "however long; keep it below a process manager's kill timeout)")
    parser.add_argument("--access-log", action="store_true", help="log every request line, never headers (default: off)")
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log level of the server")
    ray = parser.add_argument_group("Ray Serve (the 'ray' extra; docs/serving.md, 'Serving on a Ray cluster')")
    ray.add_argument("--ray", action="store_true",
                     help="serve as a Ray Serve application: replicas each holding the base and every adapter, "
                          "batching mixed adapters; --host / --port are Ray's HTTP proxy (default: off)")
    ray.add_argument("--replicas", type=int, default=1, help="with --ray: replicas of the server")
    ray.add_argument("--autoscale", metavar="MIN:MAX",
                     help="with --ray: autoscale between MIN and MAX replicas instead of --replicas (default: off)")
    ray.add_argument("--replica-cpus", type=float,
                     help="with --ray: CPUs Ray reserves per replica (default: --threads, else 1)")
    ray.add_argument("--ray-address",
                     help="with --ray: the cluster to deploy on ('auto', or ray://host:10001; default: $RAY_ADDRESS, "
                          "else a local cluster started and stopped with the server)")
    parser.set_defaults(run=run)


def _missing_extra() -> str:
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            return module
    return ""


def run(args: argparse.Namespace) -> int:
    missing = _missing_extra()
    if missing:
        raise CliError(f"serve needs {missing.replace('_', '-')}: pip install 'bitfit-hf[serve]'.")
    from bitfit_hf.serving.config import ServeConfig, ServeError, parse_adapter_arg, read_adapters_file, unique_specs

    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be 0-65535 (got {args.port}).")
    config = ServeConfig(
        max_batch_size=args.max_batch_size, max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue,
        max_client_batch_size=args.max_client_batch_size, max_input_length=args.max_input_length,
        payload_limit=args.payload_limit, request_timeout_s=args.request_timeout, auto_truncate=args.auto_truncate,
        batching=args.batching, device=args.device, dtype=args.dtype, threads=args.threads, doc_stride=args.doc_stride,
        packing=args.packing,
    )
    specs = [parse_adapter_arg(text) for text in [*args.adapters, *args.adapter]]
    base_model = args.base_model
    if args.adapters_file:
        from_file, file_base = read_adapters_file(args.adapters_file)
        specs = from_file + specs
        base_model = base_model or file_base
    specs = unique_specs(specs)
    logging.getLogger("bitfit_hf").setLevel(args.log_level.upper())
    if args.workers < 1:
        raise CliError(f"--workers must be at least 1 (got {args.workers}).")
    if args.ray:
        if args.workers != 1:
            raise CliError("--workers is the plain server's; with --ray, give --replicas (a process each).")
        return _run_ray(args, specs, config, base_model)
    if args.workers > 1:
        return _run_workers(args, specs, config, base_model)
    from bitfit_hf.serving.engine import Engine  # here: the supervisor of --workers holds no model
    from bitfit_hf.serving.server import serve_forever

    log = logging.getLogger("bitfit_hf.serving")
    log.info("bitfit-hf serve: loading %d adapter(s)", len(specs))
    try:
        engine = Engine.create(specs, config, base_model=base_model, tokenizer=args.tokenizer,
                               admin_token=Engine.admin_token_from_env(), start=False)
    except ServeError as err:
        lines = str(err).splitlines()
        if not all(line.startswith("adapter '") for line in lines):
            raise
        for line in lines:  # one line per refused adapter, then the summary
            print(f"bitfit-hf serve: error: {line}", file=sys.stderr)
        raise CliError(f"{len(lines)} of {len(specs)} adapter(s) refused; nothing is served.") from None

    def ready(url: str) -> None:
        entries = engine.registry.entries
        mixed = sum(e.mode == "mixed" for e in entries.values())
        print(f"bitfit-hf serve: {len(entries)} adapter(s) ({mixed} mixed, {len(entries) - mixed} switched) on "
              f"{engine.registry.backbone.source}, listening on {url}", file=sys.stderr, flush=True)

    serve_forever(engine, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log,
                  graceful_timeout=args.graceful_timeout, on_ready=ready)
    return 0


def _run_workers(args: argparse.Namespace, specs, config, base_model) -> int:
    """``--workers N``: N processes of the plain server on one port (bitfit_hf.serving.workers)."""
    from bitfit_hf.serving.config import require_specs
    from bitfit_hf.serving.workers import serve_workers

    require_specs(specs)  # here, before N processes load a model to say it

    def ready(url: str) -> None:
        print(f"bitfit-hf serve: {len(specs)} adapter(s) in each of {args.workers} workers, listening on {url}",
              file=sys.stderr, flush=True)

    started = serve_workers(specs, config, args.workers, base_model, args.tokenizer, host=args.host, port=args.port,
                            log_level=args.log_level, access_log=args.access_log,
                            graceful_timeout=args.graceful_timeout, on_ready=ready)
    if not started:
        raise CliError("a worker could not start (its error is above); nothing is served.")
    return 0


def _run_ray(args: argparse.Namespace, specs, config, base_model) -> int:
    """``--ray``: the same adapters and limits, deployed as a Ray Serve application (bitfit_hf.serving.ray)."""
    import os

    try:
        from bitfit_hf.serving import ray as on_ray
    except ImportError as err:
        raise CliError(f"serve --ray needs Ray Serve ({err}): pip install 'bitfit-hf[ray]'.") from None
    if args.replicas < 1:
        raise CliError(f"--replicas must be at least 1 (got {args.replicas}).")
    autoscale = on_ray.parse_autoscale(args.autoscale) if args.autoscale else None
    cpus = args.replica_cpus if args.replica_cpus is not None else float(args.threads or 1)
    if cpus <= 0:
        raise CliError(f"--replica-cpus must be positive (got {cpus}).")

    def ready(url: str) -> None:
        scale = f"{autoscale[0]}-{autoscale[1]} replicas (autoscaling)" if autoscale else f"{args.replicas} replica(s)"
        print(f"bitfit-hf serve: {len(specs)} adapter(s) on Ray Serve, {scale}, listening on {url}", file=sys.stderr,
              flush=True)

    on_ray.serve_on_ray(specs, config, base_model, args.tokenizer, host=args.host, port=args.port,
                        replicas=args.replicas, autoscale=autoscale, num_cpus=cpus,
                        address=args.ray_address or os.environ.get("RAY_ADDRESS") or None,
                        access_log=args.access_log, on_ready=ready)
    return 0
