"""Unit tests of the distributed helpers (no processes launched): backend choice, how launch requests are read,
which states count as degraded, DeepSpeed optimizer blocks, and that every shipped accelerate config resolves
(like accelerate's own launch validation) to the launcher and process count its comment promises."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bitfit_hf.training import backend as B
from bitfit_hf.training import deepspeed_groups as G
from bitfit_hf.training import distributed
from bitfit_hf.training import eval_wrapping as W
from bitfit_hf.training import launch_checks as C
from bitfit_hf.training import launcher as L

CONFIGS = Path(__file__).resolve().parents[2] / "accelerate_configs"

# config -> (launcher accelerate picks, total processes, machines, distributed_type)
EXPECTED = {
    "single_gpu.yaml": ("simple", 1, 1, "NO"),
    "multi_gpu.yaml": ("multi_gpu", 8, 1, "MULTI_GPU"),
    "deepspeed_zero2.yaml": ("deepspeed", 8, 1, "DEEPSPEED"),
    "deepspeed_zero3.yaml": ("deepspeed", 8, 1, "DEEPSPEED"),
    "deepspeed_zero3_offload.yaml": ("deepspeed", 8, 1, "DEEPSPEED"),
    "deepspeed_two_node.yaml": ("deepspeed", 16, 2, "DEEPSPEED"),
    "multi_node_ddp.yaml": ("multi_gpu", 16, 2, "MULTI_GPU"),
    "cpu_ddp.yaml": ("multi_gpu", 2, 1, "MULTI_GPU"),
    "cpu_deepspeed_zero2.yaml": ("deepspeed", 2, 1, "DEEPSPEED"),
    "cpu_deepspeed_zero3.yaml": ("deepspeed", 2, 1, "DEEPSPEED"),
    "cpu_two_node_ddp.yaml": ("multi_gpu", 2, 2, "MULTI_GPU"),
    "cpu_two_node_deepspeed.yaml": ("deepspeed", 2, 2, "DEEPSPEED"),
}


def test_every_config_is_listed_and_documents_its_launch():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)
    for path in CONFIGS.glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("#"), f"{path.name} must start with a comment saying what it is for"
        assert f"--config_file accelerate_configs/{path.name}" in text, f"{path.name} must show its launch command"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_resolves_like_accelerate(name):
    request = L.parse_accelerate_launch(["--config_file", str(CONFIGS / name), "train.py"])
    assert request is not None
    launcher, processes, machines, dtype = EXPECTED[name]
    assert (request.launcher, request.num_processes, request.num_machines, request.distributed_type) == (
        launcher, processes, machines, dtype)
    import yaml

    data = yaml.safe_load((CONFIGS / name).read_text())
    if name.startswith("cpu_"):
        # CPU variants: DDP ones need use_cpu (torchrun + gloo); DeepSpeed ones must NOT set it (it turns DeepSpeed off)
        assert data["use_cpu"] is (dtype == "MULTI_GPU"), name
    if dtype == "DEEPSPEED":
        ds = data["deepspeed_config"]
        assert "gradient_accumulation_steps" not in ds and "gradient_clipping" not in ds  # "auto": follow the recipe
        if ds["zero_stage"] == 3:
            assert ds.get("zero3_save_16bit_model") is True and ds.get("zero3_init_flag") is True


def test_command_line_flags_override_the_config():
    request = L.parse_accelerate_launch(["--config_file", str(CONFIGS / "cpu_ddp.yaml"), "--num_processes", "4", "x.py"])
    assert request.num_processes == 4
    request = L.parse_accelerate_launch(["--config_file", str(CONFIGS / "cpu_deepspeed_zero2.yaml"), "--cpu", "x.py"])
    assert request.launcher == "simple" and request.use_deepspeed and request.cpu_flag


MULTI_CPU_CONFIG = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_machines: 1\n"
                    "num_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\n")


def test_multi_cpu_resolves_to_the_one_process_launcher(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(MULTI_CPU_CONFIG)
    request = L.parse_accelerate_launch(["--config_file", str(cfg), "x.py"])
    assert (request.launcher, request.num_processes, request.distributed_type) == ("simple", 2, "MULTI_CPU")


def _cross_check_cases():
    cases = [["--config_file", str(CONFIGS / name), "x.py"] for name in sorted(EXPECTED)]
    cases += [
        ["--config_file", str(CONFIGS / "cpu_ddp.yaml"), "--num_processes", "4", "x.py"],
        ["--config_file", str(CONFIGS / "cpu_deepspeed_zero2.yaml"), "--cpu", "x.py"],
        ["--config_file", str(CONFIGS / "multi_node_ddp.yaml"), "--machine_rank", "1", "x.py"],
        ["--cpu", "--num_processes", "2", "x.py"],
        ["--multi_gpu", "--num_processes", "2", "--num_machines", "2", "x.py"],
        ["--use_deepspeed", "--num_processes", "3", "x.py"],
        ["--num_processes", "2", "--mpirun_hostfile", "hosts", "x.py"],
        ["x.py", "--config_file", "ignored"],
        ["--config_file", "{multi_cpu}", "x.py"],
        ["--config_file", "{multi_cpu}", "--num_machines", "2", "--machine_rank", "1", "x.py"],
    ]
    return cases


@pytest.mark.parametrize("argv", _cross_check_cases())
def test_resolution_matches_accelerates_own_validation(argv, monkeypatch, tmp_path):
    """The library resolves launch commands with accelerate's public config loader; its private validation is the
    reference here only, so an accelerate release that resolves differently shows up as a failing test."""
    launch = pytest.importorskip("accelerate.commands.launch")
    validate = getattr(launch, "_validate_launch_command", None)
    if validate is None:
        pytest.skip("accelerate no longer has _validate_launch_command")
    import logging

    monkeypatch.setattr(logging.getLogger("accelerate.commands.launch"), "level", logging.ERROR)
    cfg = tmp_path / "multi_cpu.yaml"
    cfg.write_text(MULTI_CPU_CONFIG)
    argv = [str(cfg) if arg == "{multi_cpu}" else arg for arg in argv]
    reference_args = launch.launch_command_parser().parse_args(argv)
    reference_args, defaults, _ = validate(reference_args)
    reference = L.launcher_request(argv, reference_args, L._enum_name(getattr(defaults, "distributed_type", "")))
    assert L.parse_accelerate_launch(argv) == reference


def test_launch_request_is_read_only_for_processes_accelerate_started(monkeypatch):
    def no_proc(*args, **kwargs):
        raise AssertionError("read another process's /proc entries")

    for name in [name for name in __import__("os").environ if name.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(L, "ancestor_processes", no_proc)
    assert L.find_launcher_request() is None  # torchrun, deepspeed or python: the environment says enough

    cfg = str(CONFIGS / "cpu_ddp.yaml")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # exported by every accelerate launcher
    monkeypatch.setattr(L, "ancestor_processes", lambda: [(42, ["bash"]), (41, ["accelerate", "launch", "--config_file",
                                                                                   cfg, "x.py"])])
    request = L.find_launcher_request()
    assert (request.command, request.num_processes, request.launcher) == (
        f"accelerate launch --config_file {cfg} x.py", 2, "multi_gpu")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/usr/bin/python3", "/venv/bin/accelerate", "launch", "--config_file", "c.yaml", "t.py"], ["--config_file", "c.yaml", "t.py"]),
        (["accelerate", "launch", "t.py", "--x"], ["t.py", "--x"]),
        (["python", "-m", "accelerate.commands.launch", "--num_processes", "2", "t.py"], ["--num_processes", "2", "t.py"]),
        (["python", "-m", "accelerate.commands.accelerate_cli", "launch", "t.py"], ["t.py"]),
        (["python3.11", "-u", "-m", "accelerate.commands.launch", "t.py"], ["t.py"]),
        (["accelerate", "config"], None),
        (["python", "-m", "torch.distributed.run", "t.py"], None),
        (["python", "train.py", "accelerate", "launch"], None),
    ],
)
def test_accelerate_command_lines_are_recognised(argv, expected):
    assert L.accelerate_launch_argv(argv) == expected


def _state(n=1, dtype="NO", ds=False, group=None, stage=None):
    return C.LaunchState(num_processes=n, distributed_type=dtype, deepspeed_active=ds, zero_stage=stage,
                         process_group_size=group if group is not None else n, backend="gloo")


def _request(n=2, machines=1, launcher="simple", dtype="MULTI_CPU", ds=False, cpu=False):
    return L.LauncherRequest(command="accelerate launch x.py", config_file="c.yaml", distributed_type=dtype,
                             num_processes=n, num_machines=machines, machine_rank=0, launcher=launcher,
                             use_deepspeed=ds, use_cpu=True, cpu_flag=cpu)


class _Args:
    def __init__(self, use_cpu=True, deepspeed=None):
        self.use_cpu, self.deepspeed = use_cpu, deepspeed


def _accelerator(monkeypatch, available: bool) -> None:
    """Pretend this machine has (or lacks) an accelerator, for the backend choice and the launch checks alike."""
    for module in (B, C):
        monkeypatch.setattr(module, "accelerator_available", lambda: available)


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("WORLD_SIZE", "ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_CONFIG_FILE",
                 C.EXPECTED_ENV, C.SKIP_ENV) + L.MPI_SIZE_ENVS:
        monkeypatch.delenv(name, raising=False)
    _accelerator(monkeypatch, False)
    return monkeypatch


def test_healthy_launches_pass(clean_env):
    assert C._problems(_state(), None, _Args()) == []
    clean_env.setenv("WORLD_SIZE", "2")
    assert C._problems(_state(2, "MULTI_CPU"), _request(launcher="multi_gpu", dtype="MULTI_GPU"), _Args()) == []
    assert C._problems(_state(2, "DEEPSPEED", ds=True, stage=3), _request(launcher="deepspeed", dtype="DEEPSPEED", ds=True),
                       _Args(), "ACCELERATE_USE_DEEPSPEED=true") == []


def test_ranks_alone_without_use_cpu(clean_env):
    clean_env.setenv("WORLD_SIZE", "2")
    (problem,) = C._problems(_state(1, "NO", group=2), None, _Args(use_cpu=False))
    assert "WORLD_SIZE=2" in problem and "use_cpu=False" in problem and "training_args_kwargs" in problem


def test_process_group_without_distributed_type(clean_env):
    clean_env.setenv("WORLD_SIZE", "2")
    (problem,) = C._problems(_state(2, "NO"), None, _Args(use_cpu=False))
    assert "distributed_type is NO" in problem


def test_multi_cpu_one_process(clean_env):
    (problem,) = C._problems(_state(1), _request(), _Args())
    assert "asked for 2 processes" in problem and "mpirun" in problem and "cpu_ddp.yaml" in problem


def test_multi_node_missing_processes(clean_env):
    (problem,) = C._problems(_state(1), _request(n=4, machines=2, launcher="multi_gpu", dtype="MULTI_GPU"), _Args())
    assert "2-machine" in problem and "machine_rank" in problem


def test_expected_world_size_from_environment(clean_env):
    clean_env.setenv(C.EXPECTED_ENV, "4")
    (problem,) = C._problems(_state(2, "MULTI_CPU"), None, _Args())
    assert f"{C.EXPECTED_ENV}=4" in problem


def test_deepspeed_switched_off_by_accelerate_use_cpu(clean_env):
    clean_env.setenv("ACCELERATE_USE_CPU", "true")
    problems = C._problems(_state(2, "MULTI_CPU"), None, _Args(), "ACCELERATE_USE_DEEPSPEED=true")
    assert len(problems) == 1 and "ACCELERATE_USE_CPU=true" in problems[0]


def test_deepspeed_requested_by_training_arguments():
    assert "ds.json" in C._deepspeed_requested(_Args(deepspeed="ds.json"))


def test_skip_switch(clean_env):
    clean_env.setenv(C.SKIP_ENV, "1")
    assert C.check_launch(accelerator=None) == []


def test_training_args_kwargs_on_cpu(clean_env):
    assert B.training_args_kwargs({"output_dir": "o"})["use_cpu"] is True
    assert B.training_args_kwargs(output_dir="o", use_cpu=False)["use_cpu"] is False  # explicit wins
    out = B.training_args_kwargs(output_dir="o", fp16=True)
    assert out["fp16"] is False and out["bf16"] is True
    assert B.default_use_cpu() is True


def test_training_args_kwargs_with_gpu(monkeypatch):
    _accelerator(monkeypatch, True)
    assert B.training_args_kwargs(output_dir="o", fp16=True) == {"output_dir": "o", "fp16": True}
    assert B.default_use_cpu() is False


def test_recipes_use_the_helper(monkeypatch):
    from bitfit_hf.recipe_kit.args import default_use_cpu

    _accelerator(monkeypatch, False)
    assert default_use_cpu() is True
    _accelerator(monkeypatch, True)
    assert default_use_cpu() is False


# ---------------------------------------------------------------------------- DeepSpeed optimizer blocks
@pytest.fixture
def trainer(tmp_path, make_tiny):
    from transformers import TrainingArguments

    from bitfit_hf import BitFitConfig, BitFitTrainer

    args = TrainingArguments(**B.training_args_kwargs(output_dir=str(tmp_path), report_to=[], learning_rate=1e-3,
                                                      weight_decay=0.1))
    return BitFitTrainer(make_tiny("bert", num_labels=2), args,
                         method_config=BitFitConfig(bias_learning_rate=1e-2, head_learning_rate=1e-3))


def test_optimizer_block_gets_bitfit_groups(trainer):
    from accelerate.utils import DummyOptim

    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    dummy = DummyOptim(params=list(trainable))
    assert trainer.create_optimizer() is not None  # plain path still works
    trainer.optimizer = dummy
    assert trainer.create_optimizer() is dummy
    groups = dummy.params
    assert all(isinstance(g, dict) and "name" not in g for g in groups)
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in trainable}
    by_lr = {(g["lr"], g["weight_decay"]) for g in groups}
    assert (1e-2, 0.0) in by_lr and (1e-3, 0.1) in by_lr  # biases: own lr, no decay; head weight: decay


def test_optimizer_block_over_other_parameters_is_refused(trainer):
    from accelerate.utils import DummyOptim

    frozen = next(p for p in trainer.model.parameters() if not p.requires_grad)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    with pytest.raises(C.LaunchError, match="differ from BitFit's selection"):
        G.keep_trained_groups_in_deepspeed_optimizer(trainer, DummyOptim(params=trainable + [frozen]))


def test_scheduler_block_with_group_lrs_is_refused(trainer, monkeypatch):
    monkeypatch.setattr(C, "deepspeed_config", lambda t: {"scheduler": {"type": "WarmupLR"}, "optimizer": {}})
    with pytest.raises(C.LaunchError, match="WarmupLR"):
        C.check_deepspeed_optimizer(trainer)
    monkeypatch.setattr(C, "_group_lrs", lambda t: [1e-3])
    C.check_deepspeed_optimizer(trainer)  # one learning rate: a DeepSpeed scheduler is fine


def test_single_process_launch_passes(trainer):
    assert C.check_launch(trainer.accelerator, trainer.args) == []
    assert C.launch_state(trainer.accelerator).num_processes == 1


class _Stub:
    """Just enough of a Trainer for check_training_wrapper."""

    def __init__(self, wrapped, n=2, dtype="MULTI_CPU"):
        import types

        state = types.SimpleNamespace(num_processes=n, distributed_type=dtype, deepspeed_plugin=None, backend="gloo")
        self.accelerator = types.SimpleNamespace(state=state, deepspeed_engine_wrapped=None)
        self.model_wrapped = wrapped


def test_training_must_start_wrapped_in_ddp(clean_env):
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(C.LaunchError, match="not wrapped in DistributedDataParallel"):
        C.check_training_wrapper(_Stub(plain))
    C.check_training_wrapper(_Stub(plain, n=1, dtype="NO"))  # one process: nothing to synchronise


def test_evaluation_marking_is_reset(trainer):
    """accelerate marks a model prepared for evaluation as prepared; training would then skip DDP."""
    model = trainer.model
    model._is_accelerate_prepared = True
    assert W.reset_evaluation_wrapping(trainer) == ["_is_accelerate_prepared"]
    assert model._is_accelerate_prepared is False
    assert W.reset_evaluation_wrapping(trainer) == []


# --- accelerate launch's one-thread default for a CPU process ---------------------------------------
LAUNCH = ["/usr/bin/python", "/usr/local/bin/accelerate", "launch", "recipes/glue.py"]


@pytest.fixture
def one_thread(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # exported by every accelerate launcher
    _accelerator(monkeypatch, False)
    yield
    torch.set_num_threads(before)


def test_threads_pinned_by_launcher_default(one_thread):
    # accelerate launch, no thread flag, no OMP_NUM_THREADS in its environment: the 1 is accelerate's default
    assert B.threads_pinned_by_launcher([(42, ["bash"]), (41, LAUNCH)], environ_of=lambda pid: {"PATH": "/bin"})


@pytest.mark.parametrize("ancestors,environ", [
    ([(41, LAUNCH[:3] + ["--num_cpu_threads_per_process", "1", "recipes/glue.py"])], {}),  # asked for 1
    ([(41, LAUNCH[:3] + ["--num_cpu_threads_per_process=1", "recipes/glue.py"])], {}),
    ([(41, LAUNCH)], {"OMP_NUM_THREADS": "1"}),  # the user's own OMP_NUM_THREADS
    ([(41, ["/usr/bin/python", "recipes/glue.py"])], {}),  # not launched by accelerate
    ([(41, LAUNCH)], None),  # the launcher's environment cannot be read: keep what was set
])
def test_threads_kept_when_chosen_or_unknown(one_thread, ancestors, environ):
    assert not B.threads_pinned_by_launcher(ancestors, environ_of=lambda pid: environ)


def test_threads_kept_for_several_processes_or_more_threads(one_thread, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # a multi-process CPU launch shares the cores on purpose
    assert not B.threads_pinned_by_launcher([(41, LAUNCH)], environ_of=lambda pid: {})
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert not B.threads_pinned_by_launcher([(41, LAUNCH)], environ_of=lambda pid: {})


def test_use_available_cpu_threads_raises_the_count(one_thread, monkeypatch):
    monkeypatch.setattr(B, "threads_pinned_by_launcher", lambda: True)
    monkeypatch.setattr(B.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert B.use_available_cpu_threads() == 3 and torch.get_num_threads() == 3
    monkeypatch.setattr(B, "threads_pinned_by_launcher", lambda: False)
    torch.set_num_threads(1)
    assert B.use_available_cpu_threads() is None and torch.get_num_threads() == 1


def test_documented_names_stay_importable_from_distributed():
    """docs/distributed.md tells users to import these from bitfit_hf.training.distributed."""
    assert (distributed.training_args_kwargs, distributed.use_available_cpu_threads, distributed.torch_extensions_dir,
            distributed.default_use_cpu) == (B.training_args_kwargs, B.use_available_cpu_threads, B.torch_extensions_dir,
                                             B.default_use_cpu)
    assert (distributed.LaunchError, distributed.check_launch, distributed.SKIP_ENV) == (C.LaunchError, C.check_launch,
                                                                                         C.SKIP_ENV)
    assert distributed.reset_evaluation_wrapping is W.reset_evaluation_wrapping
    assert distributed.release_process_group is B.release_process_group


def test_library_calls_no_private_accelerate_launch_api():
    package = Path(B.__file__).resolve().parents[1]
    assert [p.name for p in package.rglob("*.py") if "_validate_launch_command" in p.read_text()] == []
