"""One update of ours configured as GRPO equals one of TRL's GRPOTrainer with the same tools, on the same multi-turn
rollouts.

Both trainers sample through a script (TRL's ``_generate_single_turn`` replaced, our rollout engine replaced) that
writes each rollout's turns from what its query holds: a first turn that calls ``multiply`` or answers at once,
then an answer after the tool's result. Each trainer runs its own tool loop, so the test also holds that ours
builds the ids and the masks TRL builds (prompt, completion and tool-result tokens). Advantages, losses and
every weight afterwards must agree within 1e-5.
"""

import copy

import numpy as np
import pytest
import torch
from tool_models import ScriptedSampler, call_text, tiny_tool_model, tool_tokenizer
from trl_recording import prepare_trl_trainer

from trl_ext.ppo import PPOConfig, losses
from trl_ext.runs.group_trainers import group_trainer_arguments

pytestmark = pytest.mark.trl_api  # exercises TRL's API: run on every TRL line (scripts/test.sh)

TOLERANCE = 1e-5
PROMPTS = [[{"role": "user", "content": "What is 3 times 4?"}], [{"role": "user", "content": "What is 5 times 6?"}]]
# per prompt, the first turns of its 4 completions; after a tool result the answer is the second element
FIRST_TURNS = {
    "3 times 4": [call_text("multiply", {"a": 3, "b": 4}), "It is 7.", call_text("multiply", {"a": 4, "b": 3}), "12"],
    "5 times 6": ["30", call_text("multiply", {"a": 5, "b": 6}), "It is 11.", call_text("multiply", {"a": 6, "b": 5})],
}
SECOND_TURN = {"3 times 4": "The answer is 12.", "5 times 6": "30."}


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def _turn(tokenizer, text: str, queues: dict) -> str:
    """The scripted turn for a query: the next first turn of its prompt, or its answer after a tool result."""
    key = next(k for k in FIRST_TURNS if k in text)
    if "<tool_response>" in text:
        return SECOND_TURN[key]
    return queues[key].pop(0)


def _score(prompt_key: str, completion_text: str) -> float:
    """A fixed score per rollout: its length and whether it called the tool, so the groups' scores differ."""
    return (
        (len(completion_text) % 7) / 3.0
        + (1.0 if "<tool_call>" in completion_text else 0.0)
        + (0.5 if prompt_key == "5 times 6" else 0.0)
    )


def _trl_update(path, cfg, tmp_path, monkeypatch):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = tool_tokenizer()
    queues = copy.deepcopy(FIRST_TURNS)
    recorded = {"losses": [], "advantages": []}

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations=None, has_tool_images=False):
        out = []
        for ids in prompt_ids:
            text = _turn(tokenizer, tokenizer.decode(ids), queues)
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return out, None

    def fixed_score(prompts, completions, completion_ids, **_):
        keys = [next(k for k in FIRST_TURNS if k in p[-1]["content"]) for p in prompts]
        return [_score(k, tokenizer.decode(ids)) for k, ids in zip(keys, completion_ids)]

    config = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=cfg.batch_size,
        num_generations=cfg.num_generations,
        max_steps=cfg.num_ppo_epochs,
        **group_trainer_arguments("grpo", cfg),
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        disable_dropout=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(path),
        reward_funcs=[fixed_score],
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        tools=[multiply],
    )
    prepare_trl_trainer(trainer, recorded)
    monkeypatch.setattr(type(trainer), "_generate_single_turn", scripted)
    real_loss = type(trainer)._compute_loss

    def recording_loss(self, model, inputs):
        loss = real_loss(self, model, inputs)
        recorded["losses"].append(loss.item())
        recorded["advantages"].append(inputs["advantages"].detach().clone())
        rows = []
        for ids, mask, c_ids, c_mask, t_mask in zip(
            inputs["prompt_ids"],
            inputs["prompt_mask"],
            inputs["completion_ids"],
            inputs["completion_mask"],
            inputs["tool_mask"],
        ):
            n = int(c_mask.sum())
            rows.append((tuple(ids[mask.bool()].tolist()), tuple(c_ids[:n].tolist()), tuple(t_mask[:n].tolist())))
        recorded["rows"] = rows
        return loss

    monkeypatch.setattr(type(trainer), "_compute_loss", recording_loss)
    trainer.train()
    return trainer.model, recorded, fixed_score


GRPO = dict(advantage_estimator="grpo", kl_coef=0.0, scale_rewards="group")
CASES = {
    "grpo-beta": dict(GRPO, beta=0.04, loss_type="grpo"),
    "grpo-bnpo": dict(GRPO, beta=0.0, loss_type="bnpo"),
    "dr-grpo-2-iterations": dict(GRPO, beta=0.04, loss_type="dr_grpo", num_ppo_epochs=2, lr_scheduler_type="constant"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_multi_turn_update_equals_trl_grpo_with_tools(case, tmp_path, monkeypatch):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_ext.ppo.trainer import PPOTrainer

    path = tiny_tool_model(tmp_path / "policy")
    cfg = PPOConfig(
        **{
            **dict(
                num_generations=4,
                batch_size=8,
                num_mini_batches=1,
                num_ppo_epochs=1,
                total_episodes=8,
                learning_rate=1e-4,
                response_length=200,
                max_grad_norm=1.0,
                temperature=1.0,
                sampler="loop",
            ),
            **CASES[case],
        }
    )
    theirs, trl, fixed_score = _trl_update(path, cfg, tmp_path, monkeypatch)
    assert len(trl["losses"]) == cfg.num_ppo_epochs
    assert sum(1 for _, _, mask in trl["rows"] if 0 in mask) == 4  # four rollouts called the tool

    recorded = {"losses": []}
    real_policy_loss = losses.policy_loss

    def recording(*args, **kwargs):
        loss, stats = real_policy_loss(*args, **kwargs)
        recorded["losses"].append(loss.item())
        return loss, stats

    real_experience = PPOTrainer._experience

    def recording_experience(self, batch, scores):
        exp, forward = real_experience(self, batch, scores)
        rows = []
        for q, qm, r, a, m in zip(
            batch.query_ids, batch.query_mask, batch.responses, batch.attention_mask, batch.loss_mask
        ):
            n = int(a.sum())
            rows.append((tuple(q[qm.bool()].tolist()), tuple(r[:n].tolist()), tuple(m[:n].tolist())))
        recorded["rows"], recorded["advantages"] = rows, exp.outcome.advantages.clone()
        return exp, forward

    monkeypatch.setattr(losses, "policy_loss", recording)
    monkeypatch.setattr(PPOTrainer, "_experience", recording_experience)
    trainer = PPOTrainer(
        AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=[fixed_score],
        args=cfg,
        processing_class=tool_tokenizer(),
        ref_model=trl["ref_model"],
        tools=[multiply],
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    queues = copy.deepcopy(FIRST_TURNS)
    trainer.sampler = ScriptedSampler(trainer.tokenizer, [])
    trainer.sampler.sample = _replay(trainer.tokenizer, queues)
    stats = trainer.train()[0]

    # the same rollouts, token for token, with the same masks
    assert sorted(recorded["rows"]) == sorted(trl["rows"])
    # TRL's advantage is one per completion; ours is that value on each model token
    ours = {
        row: adv[torch.tensor(row[2]).bool().nonzero()[0, 0]].item()
        for row, adv in zip(recorded["rows"], recorded["advantages"])
    }
    np.testing.assert_allclose([ours[row] for row in trl["rows"]], trl["advantages"][0].tolist(), atol=TOLERANCE)
    assert recorded["losses"] == pytest.approx(trl["losses"], abs=TOLERANCE)
    if cfg.beta > 0:
        logged = [entry["kl"] for entry in trl["logs"] if "kl" in entry]
        assert abs(logged[0]) > 1e-3
        assert stats["loss/kl_avg"] == pytest.approx(np.mean(logged), abs=TOLERANCE)
    theirs_params = dict(theirs.named_parameters())
    gap = max(
        (p.detach() - theirs_params[name].detach()).abs().max().item() for name, p in trainer.policy.named_parameters()
    )
    assert gap < TOLERANCE
    moved = max(
        (p.detach() - q.detach()).abs().max().item()
        for p, q in zip(trainer.policy.parameters(), AutoModelForCausalLM.from_pretrained(path).parameters())
    )
    assert moved > 5e-5


def _replay(tokenizer, queues):
    """Our rollout engine's ``sample``, writing the script's turn for each query."""
    from trl_ext.ppo.rollout.interface import Completions

    def sample(model, query_ids, query_mask, options, generator=None):
        out = []
        for ids, mask in zip(query_ids, query_mask):
            text = _turn(tokenizer, tokenizer.decode(ids[mask.bool()]), queues)
            out.append(
                (tokenizer(text, add_special_tokens=False)["input_ids"] + [options.eos_token_id])[
                    : options.max_new_tokens
                ]
            )
        width = max(len(ids) for ids in out)
        return Completions(torch.tensor([ids + [options.pad_token_id] * (width - len(ids)) for ids in out]))

    return sample
