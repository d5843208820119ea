"""Every PPO row's KL at update 1 is about 0 when the policy starts equal to its reference (LoRA's B = 0), with the
tokenizer as a user gives it: padding on the right, as a checkpoint that sets no padding_side loads.

TRL 1.12's PPO generates right after its collated queries. Given right-padded ones, transformers' generate numbers
the response from the pad's position (0) while TRL's forward passes number it from the prompt's length, and the
update-1 KL was 5-6 nats an answer here (6.1 on SmolLM2 in benchmarks/real_model.py) instead of about 0.
"""

import logging

import pytest
import torch
from tiny_models import QWEN2_VOCAB, tiny_qwen2

WORDS = ["hi", "a much longer question about rivers", "x", "tell me a story about the sea and the stones"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # bf16 with Qwen2's real vocabulary, saved as hub checkpoints are. Weights of std 0.2: at the default 0.02 a
    # random model's next token barely depends on the context, so mispositioned responses would not show.
    return tiny_qwen2(
        tmp_path_factory.mktemp("tiny") / "qwen2",
        chat_template="qwen2.5",
        vocab_size=QWEN2_VOCAB,
        dtype=torch.bfloat16,
        initializer_range=0.2,
    )


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _first_update_kl(checkpoint, runner_name, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.ppo.config import PPOConfig
    from trl_ext.runs.runners import RUNNERS, RunInputs

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, padding_side="right")  # the user's, as given
    policy = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    conversations = [[{"role": "user", "content": w}] for w in WORDS]

    def prompts(n):  # conversations of different lengths: the batch is padded
        rows = [conversations[i % len(conversations)] for i in range(n)]
        ids = [tokenizer.apply_chat_template(r, add_generation_prompt=True, tokenize=True) for r in rows]
        ids = [i["input_ids"] if hasattr(i, "keys") else i for i in ids]
        return Dataset.from_dict({"prompt": rows, "input_ids": ids})

    def length(completions, **kwargs):
        return [len(c[0]["content"]) / 8 for c in completions]

    cfg = PPOConfig(
        output_dir=str(tmp_path / runner_name),
        batch_size=8,
        total_episodes=8,
        response_length=8,
        temperature=0.7,
        seed=0,
        value_head_init="zero",
    )
    lora = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear")
    runner = RUNNERS[runner_name](RunInputs(cfg, policy, tokenizer, length, prompts=prompts, peft_config=lora))
    kls, records = [], _Records()
    logging.getLogger("transformers").addHandler(records)
    try:
        runner.train(lambda update, stats: kls.append(float(stats["objective/kl"])) or True)
    finally:
        logging.getLogger("transformers").removeHandler(records)
    assert tokenizer.padding_side == "right", "the user's tokenizer object must be left as it was"
    return kls[0], records.messages, runner


@pytest.mark.parametrize("runner_name", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_update1_kl_is_about_zero_with_a_right_padding_tokenizer(checkpoint, tmp_path, runner_name):
    kl, messages, runner = _first_update_kl(checkpoint, runner_name, tmp_path)
    # bf16 leaves TRL a few hundredths of a nat (its rollout log-probs come from generate's cached passes)
    assert abs(kl) < 0.1, f"{runner_name}: update-1 KL {kl:.3f} nats an answer with policy == reference"
    assert not [m for m in messages if "right-padding" in m], messages
    if runner_name == "trl":
        assert runner.trainer.processing_class.padding_side == "left"  # what TRL pads its queries with
