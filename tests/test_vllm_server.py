"""Rollouts from a vLLM server (``vllm_mode="server"``), for real on vLLM's CPU build: the server started as a user
starts it (``LocalServer``), in a process of its own, on a tiny Qwen2 (two heads of 64: vLLM's CPU attention runs
them); weights synced through a folder after each update; one step off-policy through it; a server that is down,
or serves another model, is one error; a server killed mid-run leaves the run resumable from what it trained."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trl_ext.errors import RolloutEngineError
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.rollout.local_server import LocalServer, free_port

ROOT = Path(__file__).resolve().parents[1]
needs_vllm = pytest.mark.needs_vllm
TOLERANCE = 1e-5  # float32: the log-probs of the same weights in two kernels
PROMPTS = ["the cat", "a dog ran", "one two", "x y z"]


def _policy(path, layers: int = 2):
    from tiny_models import char_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = char_tokenizer(["<pad>", "<eos>", "<unk>"], pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _server(model_dir, log_path):
    return LocalServer(model_dir, log_path, dtype="float32", max_model_len=256, start_timeout=300)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-server")
    model_dir = _policy(root / "policy")
    server = _server(model_dir, root / "server.log")
    yield model_dir, server
    server.stop()


def _length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


def _trainer(model_dir, url, **options):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trl_ext.ppo.trainer import PPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = PPOConfig(
        sampler="vllm",
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_importance_sampling_correction=True,
        dtype="float32",
        learning_rate=1e-2,
        batch_size=8,
        total_episodes=24,
        response_length=8,
        temperature=0.7,
        num_ppo_epochs=1,
        seed=0,
        **options,
    )
    data = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in PROMPTS * 6]})
    return PPOTrainer(str(model_dir), _length_reward, args=cfg, train_dataset=data, processing_class=tok)


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@needs_vllm
def test_server_rollouts_match_the_trainers_log_probs_after_every_sync(served):
    """Every update's rollouts come from the weights the trainer has then: the gap between the server's log-probs
    and the trainer's stays at float32 noise while Adam at 1e-2 moves the weights; one sync an update."""
    model_dir, server = served
    trainer = _trainer(model_dir, server.url)
    assert type(trainer.sampler).__name__ == "VLLMServerSampler"
    before = _params(trainer.policy)
    history = trainer.train()
    gaps = [h["sampling/sampling_logp_difference/max"] for h in history]
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.policy.named_parameters())
    assert len(history) == 3 and moved > 1e-3
    assert max(gaps) <= TOLERANCE, gaps
    assert trainer.sampler.stats["syncs"] == 3


@needs_vllm
def test_one_step_off_policy_through_the_server(served):
    """max_staleness 1: the first batch is on-policy (gap at float noise); the next ones were sampled during the
    update before theirs, from weights one step old (the gap the correction weighs is far above the noise)."""
    model_dir, server = served
    trainer = _trainer(model_dir, server.url, max_staleness=1)
    history = trainer.train()
    gaps = [h["sampling/sampling_logp_difference/max"] for h in history]
    assert [h["sampling/staleness"] for h in history] == [0, 1, 1]
    assert gaps[0] <= TOLERANCE and min(gaps[1:]) > 100 * TOLERANCE, gaps
    assert all(torch.isfinite(torch.tensor(h["loss/policy_avg"])) for h in history)


@needs_vllm
def test_a_server_of_another_model_is_one_error(served, tmp_path):
    """A policy of three layers against a server of two: refused before any weights are sent (vLLM's reload of
    weights of another shape would leave the server half-loaded)."""
    model_dir, server = served
    other = _policy(tmp_path / "three-layers", layers=3)
    trainer = _trainer(other, server.url)
    with pytest.raises(RolloutEngineError, match="another model than the policy: num_hidden_layers 2 \\(the policy: 3"):
        trainer.train()


@needs_vllm
def test_two_training_processes_share_one_server(served):
    """Two CPU ranks (torchrun) sample from one server: rank 0 syncs it after each update, both wait for the sync,
    every update's gap stays at float noise on both ranks, and DDP keeps their weights equal."""
    from launch import torchrun_port_args

    model_dir, server = served
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *torchrun_port_args(),
        str(ROOT / "tests/scripts/vllm_server_two_ranks.py"), str(model_dir), server.url,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    ranks = sorted((json.loads(line) for line in re.findall(r'\{"rank".*?\}', run.stdout)), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["syncs"]) for r in ranks] == [(0, 2, 2), (1, 2, 0)], ranks
    assert all(len(r["gaps"]) == 2 and max(r["gaps"]) <= TOLERANCE for r in ranks), ranks
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_a_server_that_is_down_is_one_error_within_the_timeout():
    """Nothing listens on the port: one RolloutEngineError after vllm_server_timeout, naming the URL and the way
    to start a server (no vLLM needed)."""
    from trl_ext.ppo.rollout.vllm_server import VLLMServerSampler

    url = f"http://127.0.0.1:{free_port()}"
    config = PPOConfig(sampler="vllm", vllm_mode="server", vllm_server_base_url=url, vllm_server_timeout=1.5)
    sampler = VLLMServerSampler(config)
    start = time.monotonic()
    with pytest.raises(RolloutEngineError, match=f"vLLM server at {url} did not answer /v1/models within"):
        sampler.prepare(torch.nn.Linear(1, 1), torch.device("cpu"))
    assert time.monotonic() - start < 10


@needs_vllm
def test_a_server_killed_mid_run_stops_it_with_the_training_saved(tmp_path):
    """The server dies after update 1: update 2's rollout fails within the timeout, the run stops with one error
    that names the checkpoint it saved, and resuming from it gives the weights the run had trained."""
    model_dir = _policy(tmp_path / "policy")
    server = _server(model_dir, tmp_path / "server.log")
    try:
        trainer = _trainer(model_dir, server.url, vllm_server_timeout=10.0, output_dir=str(tmp_path / "run"))
        with pytest.raises(RolloutEngineError, match="resume with resume_from_checkpoint=") as caught:
            trainer.train(lambda update, stats: server.stop() if update == 1 else None)
    finally:
        server.stop()
    path = str(caught.value).rsplit("resume_from_checkpoint=", 1)[1]
    assert path.endswith("checkpoint-1"), str(caught.value)
    resumed = _trainer(model_dir, "http://127.0.0.1:1", output_dir=str(tmp_path / "run"), resume_from_checkpoint=path)
    assert resumed.update_index == 1
    trained = _params(trainer.policy)
    assert all(torch.equal(trained[n], p.detach()) for n, p in resumed.policy.named_parameters())


def test_the_weight_sync_takes_nccl_only_where_both_sides_can():
    """NCCL where the server runs vLLM's NCCL weight-transfer engine and the trainer has CUDA; the folder otherwise
    (vLLM's CPU build has no weight-transfer engine: its server_info says null)."""
    from trl_ext.ppo.rollout.vllm_server import weight_transfer

    nccl = {"weight_transfer_config": {"backend": "nccl"}}
    assert weight_transfer(nccl, cuda=True) == "nccl"
    assert weight_transfer(nccl, cuda=False) == "folder"
    assert weight_transfer({"weight_transfer_config": None}, cuda=True) == "folder"
    assert weight_transfer({"weight_transfer_config": {"backend": "ipc"}}, cuda=True) == "folder"
