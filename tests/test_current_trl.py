"""trl-ext in current TRL's conventions: GRPO-shaped constructor, conversational datasets, reward
functions called as GRPO calls them, reward-model paths, and the refusal of the `trl` backend on TRL >= 1.13.
Everything here runs on both TRL lines; tiny models are built in the test (no download)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from recomputation import RecomputeCounter
from tiny_models import tiny_deberta_reward, tiny_qwen2

from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig, PPOTrainer
from trl_ext.rewards import ClassifierReward, RewardError
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config
from trl_ext.trl_compat import trl_ppo_available

pytestmark = pytest.mark.trl_api  # exercises TRL's API: run on every TRL line (scripts/test.sh)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("current_trl")
    return {
        "chat_policy": tiny_qwen2(root / "qwen2_chat", chat_template=True),
        "plain_policy": tiny_qwen2(root / "qwen2_plain"),
        "reward": tiny_deberta_reward(root / "deberta"),
        "chat_reward": tiny_deberta_reward(root / "deberta_chat", chat_template=True),
    }


def conversations(n: int) -> Dataset:
    words = ["apple", "river", "stone", "cloud"]
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"say {words[i % 4]}"}] for i in range(n)],
            "target": [words[i % 4] for i in range(n)],
        }
    )


def test_in_house_ppo_on_conversations_with_two_reward_functions(models):
    calls = []

    def short(completions, completion_ids, **kwargs):
        calls.append(
            {
                "completions": completions,
                "completion_ids": completion_ids,
                **kwargs,
                "step_at_call": kwargs["trainer_state"].global_step,
            }
        )
        return [-len(ids) / 8 for ids in completion_ids]

    def mentions_target(prompts, completions, target, **kwargs):
        return [float(t in c[0]["content"]) for c, t in zip(completions, target)]

    args = doubling_ppo_config(
        batch_size=4,
        total_episodes=8,
        response_length=6,
        num_ppo_epochs=1,
        learning_rate=1e-2,
        reward_weights=[1.0, 0.5],
    )
    trainer = PPOTrainer(
        str(models["chat_policy"]), [short, mentions_target], args=args, train_dataset=conversations(8)
    )
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    history = trainer.train()

    assert len(history) == 2 and trainer.episode == 8
    seen = calls[0]
    # GRPO's calling convention: one assistant message per completion, ids up to and including eos
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen["completions"])
    assert all(0 < len(ids) <= 6 for ids in seen["completion_ids"])
    assert seen["prompts"][0] == [{"role": "user", "content": "say apple"}]
    assert seen["target"] == ["apple", "river", "stone", "cloud"]
    assert [c["step_at_call"] for c in calls] == [0, 1]
    assert callable(seen["log_metric"]) and callable(seen["log_extra"])
    # the score is the weighted sum of the two functions
    for stats in history:
        expected = stats["rewards/short/mean"] * 1.0 + stats["rewards/mentions_target/mean"] * 0.5
        assert stats["objective/scores"] == pytest.approx(expected, abs=1e-6)
        assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float))
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    # the prompts were rendered with the chat template and its generation prompt
    tok = trainer.tokenizer
    rendered = tok.apply_chat_template(conversations(1)[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert rendered == "[user]say apple\n[assistant]"
    assert trainer.train_dataset[0]["input_ids"] == tok(rendered, add_special_tokens=False)["input_ids"]


def test_reward_model_path_in_reward_funcs_and_text_prompts(models):
    data = Dataset.from_dict({"prompt": ["hello there", "what is up", "abc", "xyz"]})
    args = doubling_ppo_config(batch_size=4, total_episodes=4, response_length=4, num_ppo_epochs=1)
    trainer = PPOTrainer(str(models["plain_policy"]), str(models["reward"]), args=args, train_dataset=data)
    classifier = trainer.reward_funcs[0]
    assert isinstance(classifier, ClassifierReward)
    calls, score = [], classifier.score

    def recording(prompts, completions, **columns):
        calls.append((prompts, completions, score(prompts, completions, **columns)))
        return calls[-1][2]

    classifier.score = recording
    history = trainer.train()
    ((prompts, completions, scores),) = calls
    assert sorted(prompts) == sorted(data["prompt"]) and all(isinstance(c, str) for c in completions)
    mean = sum(scores) / len(scores)
    assert history[0]["objective/scores"] == pytest.approx(mean, abs=1e-6)
    assert history[0]["rewards/deberta/mean"] == pytest.approx(mean, abs=1e-6)
    # text prompts: the classifier reads each (prompt, completion) as a pair, as it would alone
    tok, model = classifier.tokenizer, classifier.model.eval()
    for prompt, completion, got in zip(prompts, completions, scores):
        pair = tok(prompt, completion, return_tensors="pt")
        pair.pop("token_type_ids", None)
        with torch.no_grad():
            assert got == pytest.approx(model(**pair).logits[0, 0].item(), abs=1e-5)


def test_classifier_reward_scores_conversations_with_the_chat_template(models):
    with_template = ClassifierReward.from_pretrained(models["chat_reward"])
    prompts = [[{"role": "user", "content": "say apple"}], [{"role": "user", "content": "hi"}]]
    completions = [[{"role": "assistant", "content": "apple"}], [{"role": "assistant", "content": "hello you"}]]
    scores = with_template(prompts, completions)
    tok, model = with_template.tokenizer, with_template.model.eval()
    text = tok.apply_chat_template(prompts[1] + completions[1], tokenize=False)
    assert text == "[user]hi\n[assistant]hello you\n"
    with torch.no_grad():
        direct = model(**tok(text, add_special_tokens=False, return_tensors="pt")).logits[0, 0].item()
    assert scores[1] == pytest.approx(direct, abs=1e-5)
    # no chat template: a pair of the prompt's and the completion's contents
    pair = ClassifierReward.from_pretrained(models["reward"])
    enc = pair.tokenizer("hi", "hello you", return_tensors="pt")
    enc.pop("token_type_ids", None)
    with torch.no_grad():
        direct = pair.model.eval()(**enc).logits[0, 0].item()
    assert pair(prompts, completions)[1] == pytest.approx(direct, abs=1e-5)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_grpo_and_rloo_step_with_classifier_reward_on_conversations(models, tmp_path, kind):
    import trl

    Config, Trainer = (trl.GRPOConfig, trl.GRPOTrainer) if kind == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    reward = ClassifierReward.from_pretrained(models["chat_reward"])
    args = Config(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=1,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=str(models["chat_policy"]), reward_funcs=[reward], args=args, train_dataset=conversations(8)
    )
    calls, score = [], reward.score

    def recording(prompts, completions, **columns):
        calls.append((prompts, completions, score(prompts, completions, **columns)))
        return calls[-1][2]

    reward.score = recording
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(math.isfinite(h["reward"]) for h in logged)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    # TRL called the classifier on the dataset's conversations and its own completions, and logged their scores
    ((prompts, completions, scores),) = calls
    assert all(p in conversations(8)["prompt"] for p in prompts) and len(prompts) == args.generation_batch_size
    assert all(c[0]["role"] == "assistant" for c in completions) and len(set(scores)) > 1
    (name,) = trainer.reward_func_names
    assert logged[0][f"rewards/{name}/mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_trl_group_trainer_recomputes_activations_when_asked(kind, models, tmp_path, monkeypatch):
    """``gradient_checkpointing`` reaches TRL's GRPOTrainer and RLOOTrainer (it was always passed as off): every
    backward runs each decoder block's forward again (counted at the MLP's forward: module hooks stay outside the
    checkpoint)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.qwen2 import modeling_qwen2

    from trl_ext.runs.group_trainers import build_group_trainer

    counter = RecomputeCounter(monkeypatch, modeling_qwen2.Qwen2MLP)
    policy = AutoModelForCausalLM.from_pretrained(models["chat_policy"])
    tokenizer = AutoTokenizer.from_pretrained(models["chat_policy"])
    cfg = PPOConfig(
        advantage_estimator=kind,
        kl_coef=0.0,
        batch_size=4,
        total_episodes=4,
        response_length=6,
        gradient_checkpointing=True,
        output_dir=str(tmp_path),
    )

    def length(completions, **_):
        return [float(len(str(c))) for c in completions]

    trainer = build_group_trainer(kind, cfg, policy, tokenizer, length, conversations(4), tmp_path, num_generations=2)
    counter.watch(trainer.accelerator)
    trainer.train()
    # one backward a micro-batch: PPOConfig's 4 epochs of one minibatch, without gradient accumulation
    assert counter.counts["backwards"] == trainer.state.global_step == cfg.num_ppo_epochs
    assert counter.counts["recomputed"] == counter.counts["backwards"] * policy.config.num_hidden_layers, counter.counts


def test_bad_inputs_are_named(models):
    from trl_ext.data.prompt_dataset import DatasetError
    from trl_ext.models.directory import ArtifactError

    args = doubling_ppo_config(batch_size=4, total_episodes=4, response_length=4)
    with pytest.raises(DatasetError, match=r"row 0 is a conversation, but the tokenizer .*qwen2_plain.* has no chat"):
        PPOTrainer(str(models["plain_policy"]), lambda **kw: [], args=args, train_dataset=conversations(4))
    with pytest.raises(
        ArtifactError, match=r"qwen2_chat' holds a causal LM \(Qwen2ForCausalLM\), not a sequence classifier"
    ):
        PPOTrainer(str(models["chat_policy"]), str(models["chat_policy"]), args=args)

    def zero(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(InputError, match="reward_weights has 3 values for 2 reward functions"):
        PPOTrainer(str(models["chat_policy"]), [zero, zero], args=PPOConfig(reward_weights=[1, 2, 3]))
    with pytest.raises(DatasetError, match="needs a 'prompt' column"):
        PPOTrainer(str(models["chat_policy"]), zero, args=args, train_dataset=Dataset.from_dict({"text": ["a"]}))

    def only_first(completions, **kwargs):
        return [1.0] + [None] * (len(completions) - 1)

    def never(completions, **kwargs):
        return [None] * len(completions)

    trainer = PPOTrainer(str(models["chat_policy"]), [only_first, never], args=args, train_dataset=conversations(4))
    with pytest.raises(
        RewardError,
        match=r"every reward function \(only_first, never\) returned None for row 1 "
        r"\(prompt \[\{'role': 'user', 'content': 'say river'\}\]\)",
    ):
        trainer.train()


def test_trl_backend_refused_on_newer_trl(monkeypatch, tmp_path, capsys):
    """Simulated TRL 1.16 in-process (runs on both lines): one line, the version, the install command, exit 2."""
    import trl_ext.trl_compat as compat
    from trl_ext.commands.cli import main

    monkeypatch.setattr(compat, "installed_trl_version", lambda: "1.16.0")
    code = main(
        [
            "ppo",
            "--backend",
            "trl",
            "--policy",
            str(tmp_path),
            "--reward",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "installed TRL is 1.16.0" in err[0] and "pip install 'trl-ext[trl-ppo]'" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(trl_ppo_available(), reason="TRL <= 1.12 is installed: the trl backend is available here")
def test_trl_backend_refused_by_the_installed_trl(tmp_path):
    import trl

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "trl_ext.commands.cli",
            "ppo",
            "--backend",
            "trl",
            "--policy",
            str(tmp_path),
            "--reward",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == run.stderr.strip().splitlines()[0]
    assert f"installed TRL is {trl.__version__}" in run.stderr and "trl-ext[trl-ppo]" in run.stderr


def test_packaging_admits_current_trl_and_keeps_trl_ppo_behind_an_extra():
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "trl"]
    assert len(core) == 1 and core[0].specifier.contains("1.16.0") and core[0].specifier.contains("1.12.0")
    extra = [Requirement(r) for r in project["optional-dependencies"]["trl-ppo"]]
    assert [r.name for r in extra] == ["trl"]
    assert extra[0].specifier.contains("1.12.0") and not extra[0].specifier.contains("1.13.0")


def test_library_imports_neither_trl_ppo_nor_the_task_nor_the_command_line():
    """Every module of the library, found by its file (importing a package to walk it would load the ones left out)."""
    package = Path(__file__).resolve().parents[1] / "trl_ext"
    library = sorted(
        ".".join(("trl_ext", *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        for p in package.rglob("*.py")
        if p.relative_to(package).parts[0] not in ("commands", "tasks", "__main__.py")
    )
    assert len(library) > 50 and "trl_ext.runs.runners" in library and "trl_ext.ppo.trainer" in library
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {library!r}]; "
        "assert 'trl.experimental.ppo' not in sys.modules, 'trl.experimental.ppo'; "
        "loaded = [m for m in sys.modules if m.startswith(('trl_ext.tasks', 'trl_ext.commands'))]; "
        "assert not loaded, loaded"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_trl_rewards_own_functions_work_unchanged(models):
    """`trl.rewards`' functions take GRPO's calling convention; the scratch trainer speaks it."""
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    overlong = get_soft_overlong_punishment(max_completion_len=6, soft_punish_cache=2)  # reads completion_ids
    args = doubling_ppo_config(batch_size=4, total_episodes=4, response_length=6, num_ppo_epochs=1)
    trainer = PPOTrainer(
        str(models["chat_policy"]), [think_format_reward, overlong], args=args, train_dataset=conversations(4)
    )
    handed, score = [], trainer.rewards.score
    trainer.rewards.score = lambda columns, prompts, completions, ids, state: (
        handed.append((completions, ids)) or score(columns, prompts, completions, ids, state)
    )
    trained, update = [], trainer._update
    trainer._update = lambda exp, forward=None: trained.append(exp.mask.sum(1).tolist()) or update(exp, forward)
    stats = trainer.train()[0]
    # the logged mean is the function's on the completions handed (a random policy writes no <think> block, a
    # completion with one scores 1)
    ((completions, ids),), (lengths,) = handed, trained
    assert len(completions) == 4 and all(c[0]["role"] == "assistant" for c in completions)
    thought = think_format_reward(completions=completions)
    assert stats["rewards/think_format_reward/mean"] == pytest.approx(sum(thought) / 4) == 0.0
    assert think_format_reward(completions=[[{"role": "assistant", "content": "<think>\nhm\n</think>\nok"}]]) == [1.0]
    # the functions get each rollout's own ids, unpadded: the soft punishment by hand from their lengths
    assert [len(i) for i in ids] == lengths
    by_hand = [0.0 if n <= 4 else (4 - n) / 2 for n in lengths]  # 0 up to max - cache, then down to -1 at max
    assert stats[f"rewards/{overlong.__name__}/mean"] == pytest.approx(sum(by_hand) / 4)


@pytest.mark.parametrize("config", ["GRPOConfig", "RLOOConfig", "RewardConfig", "SFTConfig"])
def test_trl_configs_built_with_checkpointing_off_say_nothing(config, tmp_path):
    """TRL's configs default activation checkpointing to True; ours turn it off under the name the installed
    transformers takes (5.24 renamed it), without its deprecation warning."""
    import warnings

    import trl

    from trl_ext.models.activation_checkpointing import checkpointing_training_argument

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.* is deprecated", category=FutureWarning)
        args = getattr(trl, config)(output_dir=str(tmp_path), use_cpu=True, **checkpointing_training_argument(False))
    assert args.gradient_checkpointing is False  # TRL's trainers read the old name
