"""The supervised loop split over two processes (the demo's pretraining on its two workers) takes the steps one
process takes on the whole batch: the same weights, the same losses."""

from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from weight_gaps import assert_same_adam_steps

STEPS, BATCH = 6, 7  # an odd batch: the ranks get 3 and 4 rows


def _train(rank: int, world_size: int, out: str) -> None:
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.supervised import supervised_loop
    from trl_ext.tasks.doubling.task import pretrain_dataset
    from trl_ext.tasks.doubling.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    model = build_policy(tokenizer, seed=0)
    for module in model.modules():  # dropout masks are each rank's own: without them the runs must agree
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    data = pretrain_dataset(tokenizer, STEPS * BATCH, 0)
    result = supervised_loop(
        model,
        data,
        tokenizer.pad_token_id,
        batch_size=BATCH,
        lr=3e-3,
        warmup_steps=2,
        use_labels=False,
        seed=0,
        desc="test",
        show_progress=False,
        rank=rank,
        world_size=world_size,
    )
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    save_file({**weights, "losses": torch.tensor(result.losses)}, f"{out}/rank{rank}_of{world_size}.safetensors")


def _rank(rank: int, world_size: int, out: str, told: tuple[int, int] | None = None) -> None:
    """``rank`` of a gloo group, training as rank ``told[rank]`` (default: its own); a refusal goes to a file."""
    from datetime import timedelta

    import torch.distributed as dist

    from trl_ext.errors import InputError

    dist.init_process_group(
        "gloo", init_method=f"file://{out}/store", rank=rank, world_size=world_size, timeout=timedelta(minutes=2)
    )
    try:
        _train(rank if told is None else told[rank], world_size, out)
    except InputError as error:
        Path(out, f"refused{rank}.txt").write_text(str(error))
    finally:
        dist.destroy_process_group()


def test_two_ranks_take_the_steps_of_one_process(tmp_path):
    _train(0, 1, str(tmp_path))
    mp.spawn(_rank, args=(2, str(tmp_path)), nprocs=2)
    assert not list(tmp_path.glob("refused*"))
    one = load_file(tmp_path / "rank0_of1.safetensors")
    ranks = [load_file(tmp_path / f"rank{r}_of2.safetensors") for r in (0, 1)]
    for name in one:
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # the ranks stay in sync, bit for bit
    # Six Adam steps at lr 3e-3 with the gradient summed in another order: every element within 2e-6 but a few of
    # the attention's key bias, whose gradient is 0 up to rounding (an Intel Xeon: 3 of 210,944 at 2.3e-6)
    assert_same_adam_steps(
        {n: w for n, w in ranks[0].items() if n != "losses"},
        {n: w for n, w in one.items() if n != "losses"},
        tolerance=2e-6,
    )
    # the loss each step reports is the whole batch's mean, as one process computes it
    torch.testing.assert_close(ranks[0]["losses"], one["losses"], atol=1e-6, rtol=1e-6)
    assert one["losses"][-1] < one["losses"][0]  # it trained


def test_a_rank_that_is_not_the_group_s_is_refused(tmp_path):
    mp.spawn(_rank, args=(2, str(tmp_path), (1, 0)), nprocs=2)  # each told the other's rank
    assert (tmp_path / "refused0.txt").read_text() == "rank 1 of world_size 2 given, but this process is rank 0 of 2"


def test_rank_outside_the_group_is_refused():
    import pytest
    from datasets import Dataset

    from trl_ext.errors import InputError
    from trl_ext.tasks.doubling.supervised import supervised_loop

    with pytest.raises(InputError, match="rank 2 of world_size 2"):
        supervised_loop(
            None,
            [None] * 8,
            0,
            batch_size=4,
            lr=1e-3,
            warmup_steps=1,
            use_labels=False,
            seed=0,
            desc="x",
            rank=2,
            world_size=2,
        )
    with pytest.raises(InputError, match="needs an initialised torch.distributed process group"):
        supervised_loop(
            torch.nn.Linear(2, 2),
            Dataset.from_dict({"input_ids": [[1, 2]] * 8}),
            0,
            batch_size=4,
            lr=1e-3,
            warmup_steps=1,
            use_labels=False,
            seed=0,
            desc="x",
            rank=0,
            world_size=2,
        )
