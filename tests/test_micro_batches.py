"""Memory options change nothing but memory: chunked log-probs and entropy, micro-batched experience
passes and gradient accumulation in the update equal the one-pass computations."""

import copy

import pytest
import torch
from weight_gaps import assert_same_adam_steps

from trl_ext.ppo import core
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.forward import LOGITS_BUDGET, rows_per_pass
from trl_ext.ppo.trainer import PPOTrainer

TOLERANCE = 1e-5
RESPONSES = ["12E", "二四E", "E", "陆陆肆零E", "246E", "4", "8E", "1234567"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# 120: 2 rows of 50 per chunk (one (6, 50) row of the batch is over it: row by row); 650: two whole (6, 50) rows
# of the batch per chunk; 10**6: all in one
@pytest.mark.parametrize("budget, chunks", [(120, 9), (650, 2), (10**6, 1)])
def test_chunked_logprobs_and_entropy_equal_the_full_softmax(monkeypatch, dtype, budget, chunks):
    torch.manual_seed(0)
    whole = (torch.randn(3, 9, 50) * 4).to(dtype)
    logits = whole[:, 2:-1]  # response positions of a longer sequence: a view that cannot be flattened
    tokens = torch.randint(0, 50, (3, 6))
    log_p = torch.log_softmax(logits.float() / 0.7, dim=-1)
    expected = log_p.gather(-1, tokens[..., None]).squeeze(-1)
    expected_entropy = -(log_p.exp() * log_p).sum(-1)
    monkeypatch.setattr(core, "CHUNK_ELEMENTS", budget)
    assert len(core._row_chunks(logits)) == chunks and all(c.numel() <= budget for c in core._row_chunks(logits))
    assert torch.allclose(core.logprobs_from_logits(logits, tokens, 0.7), expected, atol=1e-6)
    assert torch.allclose(core.entropy_from_logits(logits, 0.7), expected_entropy, atol=1e-5)
    assert core.logprobs_from_logits(logits, tokens).dtype == torch.float32


def _saved_bytes(function, *inputs) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``function(*inputs)``."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        function(*inputs)
    return sum(saved)


def test_log_probs_with_gradients_keep_no_float32_copy_of_the_logits(monkeypatch):
    monkeypatch.setattr(core, "CHUNK_ELEMENTS", 2 * 7 * 40)  # several chunks
    logits = torch.randn(4, 7, 40, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(0, 40, (4, 7))

    def plain(x, t):  # the same selective log-softmax, its float32 copies kept by autograd
        x = x.float() / 0.7
        return x.gather(-1, t[..., None]).squeeze(-1) - torch.logsumexp(x, dim=-1)

    ours = core.logprobs_from_logits(logits, tokens, 0.7)
    (grad,) = torch.autograd.grad(ours.sum(), logits)
    (expected_grad,) = torch.autograd.grad(plain(logits, tokens).sum(), logits)
    assert torch.equal(ours, plain(logits, tokens)) and torch.equal(grad, expected_grad)
    # The chunks keep views of the bf16 logits (2 bytes an element, shared with them) and the ids; the plain graph a
    # float32 copy besides (4 bytes an element)
    assert _saved_bytes(core.logprobs_from_logits, logits, tokens, 0.7) <= logits.numel() * 2 + tokens.numel() * 8
    assert _saved_bytes(plain, logits, tokens) >= logits.numel() * 4
    entropy_grad = torch.autograd.grad(core.entropy_from_logits(logits, 0.7).sum(), logits)[0]
    assert torch.isfinite(entropy_grad.float()).all() and entropy_grad.abs().sum() > 0


def test_automatic_rows_follow_the_gpu_memory_on_a_gpu(monkeypatch):
    from types import SimpleNamespace

    from trl_ext.ppo import forward

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * 2**30))
    budget = forward.logits_budget(torch.device("cuda"))
    assert budget == 80 * 2**30 // 64 and forward.logits_budget(torch.device("cpu")) == LOGITS_BUDGET
    assert rows_per_pass(0, 64, 129, 151936, budget) == 64  # an 80 GB card: Qwen's 64x128 batch in one pass
    assert rows_per_pass(0, 64, 129, 151936, 24 * 2**30 // 64) == 20  # a 24 GB card: 20 rows a pass


def test_automatic_rows_bound_the_logits_of_one_pass():
    assert rows_per_pass(0, 64, 65, 151936) == 13  # Qwen's vocabulary, 64 response tokens: 13 rows a pass
    assert rows_per_pass(0, 64, 9, 42) == 64  # a tiny vocabulary: the whole batch in one pass
    assert rows_per_pass(0, 4, 10**6, 10**6) == 1
    assert rows_per_pass(3, 64, 65, 151936) == 3 and rows_per_pass(100, 8, 1, 1) == 8
    with pytest.raises(ValueError, match="micro_batch_size must not be negative"):
        PPOConfig(micro_batch_size=-1)


def _update(tokenizer, policy, options, forwards=None, **trainer_options):
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    defaults = dict(batch_size=len(RESPONSES), num_mini_batches=2, num_ppo_epochs=2, learning_rate=1e-3)
    cfg = PPOConfig(**{**defaults, "response_length": 7, **options})
    trainer = PPOTrainer(policy, args=cfg, processing_class=tokenizer, **trainer_options)
    if forwards is not None:
        trainer.policy.register_forward_hook(lambda module, args, out: forwards.append(1))
    queries = ppo_prompt_dataset(tokenizer, len(RESPONSES), seed=0)["input_ids"]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    stats = trainer.step(queries, responses, [0.5 * i - 1.5 for i in range(len(RESPONSES))])
    weights = {}
    for name, p in trainer.actor_critic.named_parameters():
        if name.endswith("attn.c_attn.bias"):
            # GPT-2's key bias shifts every score of a row alike: its gradient is 0 up to rounding, and Adam
            # turns that noise into steps of up to lr (tests/test_trl_equality.py measures the same)
            width = p.shape[0] // 3
            p = torch.cat([p[:width], p[2 * width :]])
        weights[name] = p.detach().clone()
    return stats, weights


@pytest.mark.parametrize(
    "options",
    [
        {},  # PPO: GAE, a shared critic, the token-mean loss
        {"advantage_estimator": "grpo", "num_generations": 2, "loss_type": "grpo", "beta": 0.1, "ent_coef": 0.01},
        {"advantage_estimator": "rloo", "num_generations": 2, "policy_loss": "sequence_clip", "loss_type": "dr_grpo"},
    ],
    ids=["ppo-bnpo", "grpo-sequence-mean-beta-entropy", "rloo-sequence-clip-dr-grpo"],
)
def test_micro_batches_equal_one_pass(tokenizer, options):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=1)
    forwards = []
    whole_stats, whole_weights = _update(tokenizer, copy.deepcopy(policy), options)
    # 1 row per experience pass; 3 rows per update pass: minibatches of 4 in uneven parts (3 + 1)
    micro_stats, micro_weights = _update(
        tokenizer,
        copy.deepcopy(policy),
        {**options, "local_rollout_forward_batch_size": 1, "micro_batch_size": 3},
        forwards,
    )
    experience_passes = len(RESPONSES)  # the reference is a separate copy: the policy's passes alone counted
    update_passes = 2 * 2 * 2  # epochs x minibatches x (3 + 1)
    assert len(forwards) == experience_passes + update_passes
    for name, value in whole_stats.items():
        if isinstance(value, float):
            # relative too: a sequence ratio can be ~40 at this learning rate, where 1e-5 is float32's last bits
            assert micro_stats[name] == pytest.approx(value, rel=1e-6, abs=TOLERANCE), name
    start = policy.state_dict()
    assert (
        whole_weights["policy.transformer.h.0.mlp.c_fc.weight"] - start["transformer.h.0.mlp.c_fc.weight"]
    ).abs().max() > 1e-4  # it moved
    # Four Adam steps at lr 1e-3, micro-batch sums rounded otherwise. Measured: one element of 210k at 1.7e-5 (it
    # moved 3.3e-3 in all), every other below 3e-6; a wrong micro-batch weighting moves thousands by 1e-4 and more.
    assert_same_adam_steps(whole_weights, micro_weights)
