"""A recipe that finishes destroys its process groups; one that stops on bad input leaves them alone."""

import pytest
import torch.distributed as dist

from bitfit_hf.recipe_kit.run import cli_entry
from bitfit_hf.training.backend import release_process_group
from bitfit_hf.utils.errors import UserError


@pytest.fixture
def one_process_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)  # no port: a file on disk
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_release_is_a_no_op_in_a_single_process():
    assert not dist.is_initialized()
    assert release_process_group() is False


def test_a_finished_recipe_destroys_its_process_group(one_process_group):
    ran = []
    cli_entry(lambda: ran.append(dist.get_world_size()))
    assert ran == [1]  # the group was alive while the recipe ran
    assert not dist.is_initialized()


def test_a_recipe_stopped_by_bad_input_leaves_the_group_to_its_launcher(one_process_group):
    def bad_input():
        raise UserError("--task_name: no such task")

    with pytest.raises(SystemExit) as stop:
        cli_entry(bad_input)
    assert stop.value.code == 2
    assert dist.is_initialized()
