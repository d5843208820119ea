"""What TRL's trainers' runners read of our config is what the command line's check says they read: each runner is
built on a config that records every option asked of it. An option outside its reads (and outside what it fixes)
is refused where a user gives it, so a read missing from the table would refuse an option that acts, and a stale
entry would let one through that acts on nothing."""

import pytest

from trl_ext.ppo import PPOConfig
from trl_ext.runs.runners import RUN_READS, RunInputs


class ReadRecorder:
    """A config that notes each option read of it."""

    def __init__(self, config: PPOConfig):
        self.config, self.read = config, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self.config, name)


def _assert_reads(recorded: set, reads: frozenset, fixed: dict, refused=frozenset()):
    """Every option read is declared (or fixed, or read to refuse it), and every declared one is read."""
    assert recorded - RUN_READS - refused <= reads | fixed.keys(), "read, not declared"
    assert reads <= recorded, "declared, never read"


@pytest.mark.trl_api
@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_trls_group_runners_read_what_their_tables_say(kind, tmp_path):
    from datasets import Dataset
    from tiny_models import tiny_qwen2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.runs.group_trainers import TRL_GROUP_FIXED, TRL_GROUP_READS
    from trl_ext.runs.runners import RUNNERS

    path = tiny_qwen2(tmp_path / "policy")
    policy, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    config = ReadRecorder(PPOConfig(batch_size=4, total_episodes=4, num_generations=2, output_dir=str(tmp_path)))

    def prompts(n):
        return Dataset.from_dict({"prompt": ["say a"] * n, "input_ids": [[1, 2]] * n})

    RUNNERS[kind](RunInputs(config, policy, tokenizer, lambda completions, **_: [0.0] * len(completions), prompts))
    _assert_reads(config.read, TRL_GROUP_READS[kind], TRL_GROUP_FIXED[kind])


@pytest.mark.needs_trl_ppo
def test_trls_ppo_runner_reads_what_its_table_says(trained_artifacts, tmp_path):
    from trl_ext.runs.runners import RUNNERS
    from trl_ext.tasks.doubling.artifacts import load_classifier, load_policy
    from trl_ext.tasks.doubling.rewards import doubling_classifier_reward
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset
    from trl_ext.trl_compat.backend import TRL_PPO_FIXED, TRL_PPO_READS

    policy, tokenizer = load_policy(trained_artifacts["policy"])
    reward = doubling_classifier_reward(*load_classifier(trained_artifacts["reward"]))
    config = ReadRecorder(PPOConfig(batch_size=4, total_episodes=4, output_dir=str(tmp_path)))
    inputs = RunInputs(config, policy, tokenizer, reward, lambda n: ppo_prompt_dataset(tokenizer, n, 0))
    RUNNERS["trl"](inputs)
    # the builder reads these only to refuse them: TRL's PPO has neither
    _assert_reads(config.read, TRL_PPO_READS, TRL_PPO_FIXED, refused={"critic_adapter", "chunked_lm_head"})
