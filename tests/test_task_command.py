"""``trl-ext rlhf`` as one command from a catalogue model to a scored run: ``--policy catalogue:NAME`` resolved
through ``fetch_model``, and ``--task-eval-size``'s greedy scores on the task's test stream before and after
training. Offline: a tiny chat model stands in for the catalogue's."""

import json
from pathlib import Path

import pytest
from tiny_models import tiny_qwen2

from trl_ext.commands.cli import main
from trl_ext.models import fetch
from trl_ext.runs.task_eval import TaskEval

ROOT = Path(__file__).resolve().parents[1]
TASK = "reasoning-gym:chain_sum"
TINY_RUN = ["--total-episodes", "4", "--batch-size", "2", "--response-length", "4", "--lora-r", "4"]


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("task_command") / "qwen2_chat", chat_template=True)


def rlhf(policy, out: Path, *extra: str) -> int:
    return main(
        ["rlhf", "--policy", str(policy), "--task", TASK, "--task-size", "8", "--out", str(out), *TINY_RUN, *extra]
    )


@pytest.mark.parametrize("backend", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_task_eval_scores_the_test_stream_before_and_after_training(
    chat_policy, tmp_path, capsys, monkeypatch, backend
):
    from trl_ext.data.reasoning_gym import reasoning_gym_dataset

    # Which policy each phase scores: the loaded one without LoRA, then the trained one with its adapter.
    has_lora, score = {}, TaskEval.score

    def spying(self, phase, model, tokenizer):
        has_lora[phase] = any("lora" in name for name, _ in model.named_modules())
        return score(self, phase, model, tokenizer)

    monkeypatch.setattr(TaskEval, "score", spying)
    out = tmp_path / "o"
    code = rlhf(chat_policy, out, "--backend", backend, "--task-eval-size", "2", "--seed", "3")
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert has_lora == {"before": False, "after": True}

    evaluation = json.loads((out / "task_eval.json").read_text())
    assert {k: evaluation[k] for k in ("task", "split", "seed", "prompts", "max_new_tokens")} == {
        "task": TASK,
        "split": "test",
        "seed": 3,
        "prompts": 2,
        "max_new_tokens": 4,
    }
    # both prompts' answers are kept: each phase's score, recounted from them with the task's own verifier
    from trl_ext.rewards.reasoning_gym import ReasoningGymReward

    test_rows = reasoning_gym_dataset(TASK, 2, seed=3, split="test")
    columns = {name: test_rows[name] for name in test_rows.column_names if name != "prompt"}
    for phase in ("before", "after"):
        shown = [e for e in evaluation["examples"] if e["phase"] == phase]
        assert [e["question"] for e in shown] == [p[-1]["content"] for p in test_rows["prompt"]]
        answers = [[{"role": "assistant", "content": e["answer"]}] for e in shown]
        verified = ReasoningGymReward()(prompts=test_rows["prompt"], completions=answers, **columns)
        assert [e["score"] for e in shown] == verified and evaluation[phase] == round(sum(verified) / 2, 4)

    summary = json.loads((out / "summary.json").read_text())
    assert (summary["test_before"], summary["test_after"]) == (evaluation["before"], evaluation["after"])
    # no test question among the training prompts, and how many the setting makes (chain_sum's default: many)
    assert summary["test_overlap"] == evaluation["test_overlap"] == 0
    assert summary["distinct_questions"] == evaluation["distinct_questions"] > 10_000
    assert "[task-eval] before training: greedy score" in captured.out
    assert f"test score {evaluation['before']} -> {evaluation['after']} (task_eval.json)" in captured.out


def test_a_catalogue_policy_is_made_by_fetch_model(chat_policy, tmp_path, capsys, monkeypatch):
    fetched = []
    monkeypatch.setattr(fetch, "fetch_model", lambda name: fetched.append(name) or Path(chat_policy))
    out = tmp_path / "o"
    code = rlhf("catalogue:Qwen2.5-Coder-0.5B-Instruct", out)
    assert code == 0, capsys.readouterr().err[-3000:]
    assert fetched == ["Qwen2.5-Coder-0.5B-Instruct"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2 and "test_before" not in summary
    # the run is recorded as asked for, not by this machine's cache folder
    assert summary["config"]["models"]["policy"] == "catalogue:Qwen2.5-Coder-0.5B-Instruct"


@pytest.mark.parametrize(
    "policy, extra, message",
    [
        (
            "catalogue:Qwen2.5-0.5B",
            [],
            "policy 'catalogue:Qwen2.5-0.5B': no model 'Qwen2.5-0.5B' in the catalogue (it holds "
            "SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct)",
        ),
        (None, ["--task-eval-size", "-1"], "--task-eval-size must be 0 or more (0: no evaluation), got -1"),
        (None, ["--task-configs", "{bad"], "--task-configs is not JSON (Expecting property name"),
        (None, ["--task-configs", "[1]"], "--task-configs: expected a JSON object of task -> settings, got '[1]'"),
        (None, ["--task-configs", '{"leg_counting": {}}'], "name ['leg_counting'], which the spec"),
        (None, ["--task-configs", '{"chain_sum": {"bogus": 1}}'], "its config was refused (TypeError"),
    ],
)
def test_bad_task_command_inputs_are_one_line_and_write_nothing(
    chat_policy, tmp_path, capsys, monkeypatch, policy, extra, message
):
    monkeypatch.setattr(fetch, "fetch_model", lambda name: pytest.fail(f"fetched {name}"))
    out = tmp_path / "o"
    assert rlhf(policy or chat_policy, out, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--task-eval-size", "4"], "--task-eval-size scores --task's test stream: give --task too"),
        (["--answer-format", "last-number"], "--task-configs and --answer-format set --task's questions: give --task"),
    ],
)
def test_task_flags_without_a_task_are_one_line_and_write_nothing(chat_policy, tmp_path, capsys, extra, message):
    out = tmp_path / "o"
    prompts = str(ROOT / "recipes/rlhf/prompts_plain.txt")
    argv = ["rlhf", "--policy", str(chat_policy), "--prompts", prompts, "--reward-fn", "m:f", "--out", str(out)]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_task_eval_size_under_several_processes_is_one_line_and_writes_nothing(
    chat_policy, tmp_path, capsys, monkeypatch
):
    """The evaluation runs on the main process alone: under a launch of several the others would wait in prepare (or
    hang on sharded weights), so it is refused before the output folder is made."""
    from types import SimpleNamespace

    from trl_ext.runs import run as run_module

    one_process = run_module.Run.__init__

    def as_rank_0_of_2(self, spec):
        one_process(self, spec)
        self.state = SimpleNamespace(num_processes=2, is_main_process=True)

    monkeypatch.setattr(run_module.Run, "__init__", as_rank_0_of_2)
    out = tmp_path / "o"
    assert rlhf(chat_policy, out, "--task-eval-size", "2") == 2
    err = capsys.readouterr().err
    assert "--task-eval-size scores on the main process only: use it with one process" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_task_eval_scores_answers_with_the_tasks_verifier(monkeypatch):
    """Right answers score 1 and wrong ones 0, as the verifier scores them in training; greedy, without dropout."""
    import torch

    from trl_ext.data.reasoning_gym import loads_exact
    from trl_ext.models import chat_completions

    evaluation = TaskEval.of_task(TASK, 4, seed=0, max_new_tokens=8, max_prompt_length=64)
    right = [str(loads_exact(entry)["answer"]) for entry in evaluation.rows["entry"]]
    model = torch.nn.Linear(1, 1)  # in training mode, as after an update

    def generate(model_, tokenizer, conversations, *, temperature, max_new_tokens, max_prompt_length):
        assert (model_.training, temperature, max_new_tokens, max_prompt_length) == (False, 0.0, 8, 64)
        return [f"<answer>{a}</answer>" if i < 2 else "<answer>no</answer>" for i, a in enumerate(right)]

    monkeypatch.setattr(chat_completions, "generate", generate)
    assert evaluation.score("before", model, None) == 0.5 and model.training


def test_the_answer_format_and_task_configs_reach_training_and_evaluation(chat_policy, tmp_path, capsys, monkeypatch):
    from trl_ext.data import reasoning_gym

    made, build = [], reasoning_gym.reasoning_gym_dataset

    def recording(*args, **kwargs):
        made.append((kwargs.get("split", "train"), kwargs.get("task_configs"), kwargs.get("answer_format")))
        return build(*args, **kwargs)

    monkeypatch.setattr(reasoning_gym, "reasoning_gym_dataset", recording)
    out = tmp_path / "o"
    configs = '{"chain_sum": {"max_terms": 2, "max_digits": 1}}'
    extra = ["--answer-format", "last-number", "--task-configs", configs, "--task-eval-size", "2"]
    assert rlhf(chat_policy, out, *extra) == 0, capsys.readouterr().err[-3000:]
    wanted = {"chain_sum": {"max_terms": 2, "max_digits": 1}}
    assert ("train", wanted, "last-number") in made and ("test", wanted, "last-number") in made
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["test_overlap"], summary["distinct_questions"]) == (0, 200)  # two one-digit terms, + or -


def test_task_eval_reads_the_last_number_when_the_run_does(monkeypatch):
    import torch

    from trl_ext.data.reasoning_gym import loads_exact
    from trl_ext.models import chat_completions

    evaluation = TaskEval.of_task(TASK, 4, seed=0, max_new_tokens=8, answer_format="last-number")
    right = [str(loads_exact(entry)["answer"]) for entry in evaluation.rows["entry"]]

    def generate(model_, tokenizer, conversations, *, temperature, max_new_tokens, max_prompt_length):
        return [f"so the sum is {a}." if i < 3 else "no idea" for i, a in enumerate(right)]

    monkeypatch.setattr(chat_completions, "generate", generate)
    assert evaluation.score("before", torch.nn.Linear(1, 1), None) == 0.75


def test_evaluation_prompts_are_cut_on_the_left_as_training_cuts_them(chat_policy):
    """``generate(max_prompt_length=N)`` hands the model each templated prompt's last N tokens: the run's
    ``--max-prompt-length`` reaches ``--task-eval-size``'s answers as it reaches training's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.models.chat_completions import generate

    model, tokenizer = AutoModelForCausalLM.from_pretrained(chat_policy), AutoTokenizer.from_pretrained(chat_policy)
    conversations = [[{"role": "user", "content": "say apple " * n}] for n in (1, 6)]
    whole = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
    whole = [w["input_ids"] if isinstance(w, dict) or hasattr(w, "keys") else w for w in whole]
    seen, real = [], model.generate

    def recording(input_ids, attention_mask, **kwargs):
        seen.append([row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)])
        return real(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model.generate = recording
    generate(model, tokenizer, conversations, max_new_tokens=2, max_prompt_length=8)
    assert seen == [[w[-8:] for w in whole]] and len(whole[1]) > 8
