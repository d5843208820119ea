"""The logits of the kept positions are asked of HF as indices, never as an int. With an int HF slices the hidden
states into a non-contiguous view, and torch multiplies that view by the (V, H) head through a batched copy of the
head: 100x slower at SmolLM2's 49k vocabulary on CPU (``benchmarks/lm_head_slice.py``). Every forward of an update
(policy with and without gradients, reference) and the loop's and static sampler's prefill hand indices; the
logits are the int's."""

import pytest
import torch

from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.rollout.interface import SamplingOptions
from trl_ext.ppo.rollout.loop import last_positions, sample_responses
from trl_ext.ppo.rollout.static_sampler import StaticDecoder
from trl_ext.ppo.trainer import PPOTrainer


def test_last_positions_are_the_last_count_of_the_length():
    assert last_positions(10, 3).tolist() == [7, 8, 9]
    assert last_positions(5, 1).tolist() == [4]


def test_indices_give_the_logits_an_int_gives(tokenizer):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=0).eval()
    ids = torch.randint(0, len(tokenizer), (3, 9))
    with torch.no_grad():
        by_int = policy(input_ids=ids, logits_to_keep=4).logits
        by_index = policy(input_ids=ids, logits_to_keep=last_positions(9, 4)).logits
    assert by_index.shape == by_int.shape == (3, 4, len(tokenizer))
    torch.testing.assert_close(by_index, by_int, rtol=0, atol=1e-6)


def test_indices_on_a_bf16_checkpoint_of_a_real_vocabulary(tmp_path):
    """A Qwen2 saved as real checkpoints are (bf16, 151,936 tokens), loaded back: the same logits either way, up to
    bf16 rounding of the two matrix products."""
    from tiny_models import QWEN2_VOCAB, tiny_qwen2
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_qwen2(tmp_path, vocab_size=QWEN2_VOCAB, dtype=torch.bfloat16))
    assert policy.dtype == torch.bfloat16
    ids = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        by_int = policy(input_ids=ids, logits_to_keep=3).logits.float()
        by_index = policy(input_ids=ids, logits_to_keep=last_positions(7, 3)).logits.float()
    assert by_index.shape == (2, 3, QWEN2_VOCAB)
    torch.testing.assert_close(by_index, by_int, rtol=0, atol=2e-2)


def _recording(module, seen: list):
    module.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(type(kwargs.get("logits_to_keep"))), with_kwargs=True
    )


@pytest.mark.parametrize("epochs", [1, 2])
def test_every_pass_of_an_update_and_every_prefill_hands_indices(tokenizer, epochs):
    from trl_ext.tasks.doubling.models import build_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    cfg = PPOConfig(batch_size=4, response_length=6, num_ppo_epochs=epochs, kl_coef=0.1)
    trainer = PPOTrainer(build_policy(tokenizer, seed=0), args=cfg, processing_class=tokenizer)
    seen = []
    _recording(trainer.policy, seen)
    _recording(trainer.ref_policy, seen)
    queries = ppo_prompt_dataset(tokenizer, 4, seed=0)["input_ids"]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in ["12E", "4E", "E", "246E"]]
    trainer.step(queries, responses, [0.0, 1.0, 0.5, -1.0])
    assert len(seen) == epochs + 1  # the fused first epoch, the later ones, the reference
    assert set(seen) == {torch.Tensor}

    seen.clear()
    ids = torch.tensor([queries[0], queries[1]])
    options = SamplingOptions(3, tokenizer.eos_token_id, tokenizer.pad_token_id, temperature=1.0)
    sample_responses(trainer.policy, ids, torch.ones_like(ids), options, torch.Generator().manual_seed(0))
    assert len(seen) == 3 and set(seen) == {torch.Tensor}  # the prefill and every decode step

    seen.clear()
    StaticDecoder()(trainer.policy, ids, torch.ones_like(ids), options, torch.Generator().manual_seed(0))
    assert seen[0] is torch.Tensor  # the prefill; a decode step's input is one position, already contiguous
