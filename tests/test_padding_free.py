"""Padding-free passes (``padding_free``): the batch's sequences packed end to end, position ids restarting at each,
attention kept within a sequence by a 4D block-diagonal causal mask, read back per sequence. They give the padded
passes' log-probs, values, losses and updated weights (fp32, 1e-5), single-turn and multi-turn (tool results: holes
in the loss mask), with the passes filled by tokens; packing by position ids alone does not (sdpa lets the second
sequence attend to the first). Attention that would ignore the mask is refused."""

import copy
from dataclasses import replace
from functools import partial

import pytest
import torch
from tool_models import ScriptedSampler, call_text, tiny_tool_model, tool_tokenizer

from trl_ext.errors import InputError
from trl_ext.ppo import forward as forward_module
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.packing import pack, token_parts
from trl_ext.ppo.trainer import PPOTrainer

TOLERANCE = 1e-5
# The critic's correlation over 4 rows divides by the values' small spread, so a float32 rounding in a value (held to
# TOLERANCE itself) moves it by up to ~3e-5 (test_one_forward_update holds it apart likewise).
STAT_TOLERANCE = {"val/first_value_return_corr": 1e-4}
RESPONSES = ["12E", "二四E", "E", "陆陆肆零E", "246E", "4", "8E", "1234567"]
SINGLE_TURN = {
    "ppo-4-epochs": dict(),  # the one-forward path: the experience phase's pass is the first step's
    "ppo-micro-batches": dict(num_mini_batches=2, micro_batch_size=2, local_rollout_forward_batch_size=3),
    "ppo-separate-critic": dict(separate_critic=True, num_ppo_epochs=2, num_mini_batches=2),
    "grpo-beta-entropy": dict(
        advantage_estimator="grpo", num_generations=4, kl_coef=0.0, beta=0.1, loss_type="grpo", ent_coef=0.01
    ),
    "ppo-chunked-head": dict(chunked_lm_head=True, num_mini_batches=2),
}


def test_pack_puts_each_rows_real_tokens_end_to_end_and_reads_them_back():
    # left-padded queries (P = 3) and right-padded responses (R = 3); 0 is padding
    ids = torch.tensor([[0, 5, 6, 7, 8, 0], [4, 4, 4, 9, 0, 0], [0, 0, 3, 2, 0, 0]])
    mask = (ids != 0).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack(ids, mask, positions, torch.float32)
    # lengths 4, 4, 2 in rows of at most 6: first fit, longest first -> [row 0, row 2], [row 1]
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 3, 2], [4, 4, 4, 9, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 0]]
    allowed = packed.attention_mask[0, 0] == 0
    assert allowed[5].tolist() == [False] * 4 + [True, True]  # the second sequence sees itself alone
    assert allowed[3].tolist() == [True] * 4 + [False, False]  # causal within the first
    assert (packed.attention_mask[1, 0, 4:] == 0).tolist() == [[False] * 4 + [True, False], [False] * 5 + [True]]
    assert torch.equal(packed.unpack(packed.input_ids), ids)  # padding reads back as 0
    # each response token's log-prob sits at the position before it; the row's padding reads back as 0
    next_token = packed.responses(packed.tokens.float(), 3)
    assert next_token.tolist() == [[7, 8, 0], [9, 0, 0], [2, 0, 0]]
    # consecutive rows up to a budget of tokens (4 + 4 + 2)
    assert [(p.start, p.stop) for p in token_parts(mask.sum(1), 5)] == [(0, 1), (1, 2), (2, 3)]
    assert [(p.start, p.stop) for p in token_parts(mask.sum(1), 6)] == [(0, 1), (1, 3)]
    assert [(p.start, p.stop) for p in token_parts(mask.sum(1), 8)] == [(0, 2), (2, 3)]


def _step_twice(tokenizer, policy, options):
    """Two ``step`` calls on fixed rollouts: the stats of each, the experience of the first, the weights after. Half
    the queries are cut to their last 2-5 tokens, so that short sequences share a packed row with others."""
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    cfg = PPOConfig(batch_size=len(RESPONSES), learning_rate=1e-5, response_length=7, **options)
    trainer = PPOTrainer(policy, args=cfg, processing_class=tokenizer)
    experiences, make = [], trainer._experience

    def experience(*args):
        out = make(*args)
        experiences.append(out[0])
        return out

    trainer._experience = experience
    queries = ppo_prompt_dataset(tokenizer, len(RESPONSES), seed=0)["input_ids"]
    queries = [q[-2 - i // 2 :] if i % 2 else q for i, q in enumerate(queries)]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    history = [trainer.step(queries, responses, [0.5 * i - 1.5 + u for i in range(len(RESPONSES))]) for u in range(2)]
    return history, experiences[0], {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _assert_same_experience(packed, padded):
    """Log-probs where the responses hold tokens, values where the critic reads them."""
    real = padded.attention_mask[:, padded.query_length :].bool()
    assert real.sum() < real.numel()  # there is padding to drop
    for name in ("old_logprobs", "ref_logprobs"):
        gap = (getattr(packed, name) - getattr(padded, name))[real].abs().max().item()
        assert gap < TOLERANCE, name
    if padded.outcome.values is not None:
        assert (packed.outcome.values - padded.outcome.values).abs().max().item() < TOLERANCE
    for name in ("advantages", "returns", "rewards"):
        ours, theirs = getattr(packed.outcome, name), getattr(padded.outcome, name)
        if theirs is not None:
            assert (ours - theirs).abs().max().item() < TOLERANCE, name


def _assert_same_update(packed, padded, packed_weights, padded_weights):
    for ours, theirs in zip(packed, padded):
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            if isinstance(value, float) and not name.startswith("timing/") and name != "eps":  # eps: episodes/s
                assert ours[name] == pytest.approx(value, abs=STAT_TOLERANCE.get(name, TOLERANCE)), name
    assert max((packed_weights[n] - padded_weights[n]).abs().max().item() for n in padded_weights) < TOLERANCE


@pytest.mark.parametrize("case", list(SINGLE_TURN))
def test_packed_passes_give_the_padded_passes_update_single_turn(tokenizer, case):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=1)
    assert policy.config._attn_implementation == "sdpa"
    padded, padded_exp, padded_weights = _step_twice(tokenizer, copy.deepcopy(policy), SINGLE_TURN[case])
    packed, packed_exp, packed_weights = _step_twice(
        tokenizer, copy.deepcopy(policy), {**SINGLE_TURN[case], "padding_free": True}
    )
    _assert_same_experience(packed_exp, padded_exp)
    _assert_same_update(packed, padded, packed_weights, padded_weights)
    start = dict(policy.named_parameters())["transformer.h.0.mlp.c_fc.weight"]
    assert (packed_weights["policy.transformer.h.0.mlp.c_fc.weight"] - start).abs().max() > 5e-6  # it moved


def _causal_only(*args):
    """``pack`` without the blocks: a causal mask over the whole packed row."""
    packed = pack(*args)
    length = packed.input_ids.shape[1]
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    mask = torch.zeros_like(packed.attention_mask).masked_fill(future, torch.finfo(packed.attention_mask.dtype).min)
    return replace(packed, attention_mask=mask)


def test_packing_without_the_block_mask_lets_sequences_attend_to_each_other(tokenizer, monkeypatch):
    """The control: with a causal mask over the whole packed row (what position ids alone give where the model
    builds its mask from the row's length: transformers 5.25 reads packed sequences from position ids only when given
    no mask and no cache), a sequence packed after another reads it and its log-probs move."""
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=1)
    options = {**SINGLE_TURN["ppo-micro-batches"], "padding_free": True}
    _, masked, _ = _step_twice(tokenizer, copy.deepcopy(policy), options)
    monkeypatch.setattr(forward_module, "pack", _causal_only)
    _, unmasked, _ = _step_twice(tokenizer, copy.deepcopy(policy), options)
    real = masked.mask.bool()
    assert (unmasked.old_logprobs - masked.old_logprobs)[real].abs().max().item() > 1e-2


class Counter:
    """A scripted environment: ``increment`` adds to a counter, ``get_reward`` reads it."""

    def reset(self, **row):
        self.value = row["start"]
        return f" Start at {row['start']}."

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        return f"now {self.value}"

    def get_reward(self) -> float:
        return float(self.value)


def _multi_turn_run(path, options):
    """One multi-turn update on scripted conversations of different lengths and turns (tool results in them; one
    of ten calls, so that the others share packed rows): its stats, its experience, the weights after."""
    from datasets import Dataset

    def length(completions, **_):
        return [float(len(c[-1]["content"])) for c in completions]

    config = PPOConfig(
        batch_size=4,
        total_episodes=4,
        response_length=1000,
        learning_rate=1e-3,
        sampler="loop",
        kl_coef=0.05,
        max_tool_calling_iterations=10,
        **options,
    )
    prompts = [[{"role": "user", "content": f"Count {i}."}] for i in range(4)]
    dataset = Dataset.from_dict({"prompt": prompts, "start": list(range(4))})
    trainer = PPOTrainer(
        str(path),
        args=config,
        train_dataset=dataset,
        processing_class=tool_tokenizer(),
        environment_factory=Counter,
        reward_funcs=[length],
    )
    call = call_text("increment", {"step": 1})
    rows = {"Count 0.": [call, "done"], "Count 1.": ["ok"], "Count 2.": [call] * 10 + ["done, at last"]}
    trainer.sampler = ScriptedSampler(trainer.tokenizer, ["no tool needed here, the answer is plain"], rows=rows)
    captured, update = {}, trainer._update

    def spy(exp, forward=None):
        captured["exp"] = exp
        return update(exp, forward)

    trainer._update = spy
    history = trainer.train()
    return history, captured["exp"], {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    return tiny_tool_model(tmp_path_factory.mktemp("tool-model"))


@pytest.mark.parametrize(
    "options",
    [
        dict(num_ppo_epochs=1),  # one minibatch: the one-forward path
        # no-grad experience passes of 1 row's tokens, micro-batches of 1 row's tokens (two short rows share one)
        dict(num_ppo_epochs=2, num_mini_batches=2, micro_batch_size=1, local_rollout_forward_batch_size=1),
        dict(separate_critic=True, num_mini_batches=2, advantage_estimator="turn_gae"),
    ],
    ids=["one-forward", "token-filled-micro-batches", "separate-critic-turn-gae"],
)
def test_packed_passes_give_the_padded_passes_update_multi_turn(tool_model, options):
    padded, padded_exp, padded_weights = _multi_turn_run(tool_model, options)
    packed, packed_exp, packed_weights = _multi_turn_run(tool_model, {**options, "padding_free": True})
    # the rows hold tool results: real tokens (attended to) out of the loss mask, before the model's last token
    attended = padded_exp.attention_mask[:, padded_exp.query_length :].bool()
    holes = attended & ~padded_exp.mask.bool() & (padded_exp.mask.flip(-1).cumsum(-1).flip(-1) > 0)
    assert holes.any(1).sum() == 2 and padded_exp.mask.sum(1).unique().numel() == 4
    _assert_same_experience(packed_exp, padded_exp)
    _assert_same_update(packed, padded, packed_weights, padded_weights)


def test_token_filled_micro_batches_run_fewer_passes(tokenizer):
    """Micro-batches of 2 rows' tokens: rows shorter than the batch's longest share a pass."""
    from trl_ext.tasks.doubling.models import build_policy

    counts = {False: 0, True: 0}
    for padding_free in counts:
        policy = build_policy(tokenizer, seed=1)
        policy.register_forward_hook(partial(_count, counts, padding_free))
        _step_twice(tokenizer, policy, dict(num_ppo_epochs=1, micro_batch_size=2, padding_free=padding_free))
    assert counts[True] < counts[False]


def _count(counts, key, *_):
    counts[key] += 1


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention"])
def test_attention_that_ignores_the_block_mask_is_refused(tokenizer, implementation):
    from trl_ext.tasks.doubling.models import build_policy

    policy = build_policy(tokenizer, seed=1)
    policy.config._attn_implementation = implementation
    PPOTrainer(copy.deepcopy(policy), args=PPOConfig(batch_size=8), processing_class=tokenizer)  # padded: fine
    with pytest.raises(InputError, match=f"padding_free .*{implementation}.* attn_implementation='sdpa'"):
        PPOTrainer(policy, args=PPOConfig(batch_size=8, padding_free=True), processing_class=tokenizer)
