"""Issue 52: reasoning-gym's tasks as prompt datasets (trl_ext.data.reasoning_gym) and its verifiers as a reward
(trl_ext.rewards.reasoning_gym), against reasoning-gym's own generators and score_answer; `rlhf --task`."""

import json
import math
import pickle
import random
import string
import sys

import pytest
import torch
from tiny_models import tiny_qwen2

from trl_ext.data.reasoning_gym import TEST_SEED_OFFSET, loads_exact, reasoning_gym_dataset, stream_seed
from trl_ext.errors import BackendUnavailableError, InputError
from trl_ext.rewards.reasoning_gym import ReasoningGymReward, reasoning_gym_task

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.utils import extract_answer  # noqa: E402

TASKS = [
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "gsm_symbolic",
    "letter_counting",
    "spell_backward",
    "number_sorting",
    "coin_flip",
]
ENTRIES = 100  # x 10 answers each: 1,000 answers a task


def columns(dataset) -> dict:
    return {name: dataset[name] for name in ("task", "task_config", "entry")}


def answers(right: str, rng: random.Random) -> dict[str, str]:
    """Ten completions of one question: right, wrong and malformed, as a model might write them."""
    wrong = "x" + (right if rng.random() < 0.5 else right[::-1])  # never right: appended digits can be, in tolerance
    garbage = "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 40)))
    return {
        "right": f"<think>step by step</think>\n<answer>{right}</answer>",
        "right_spaced": f"Working it out.\n<answer> {right} </answer>\n",
        "wrong": f"<answer>{wrong}</answer>",
        "last_tag_wins": f"<answer>{right}</answer> no, wait: <answer>{wrong}</answer>",
        "extra_text_in_tags": f"<answer>The answer is {right}.</answer>",
        "no_tags": right,
        "unclosed": f"<answer>{right}",
        "empty": "",
        "empty_tags": "<answer></answer>",
        "garbage": garbage,
    }


# ------------------------------------------------------------------ the target: reasoning-gym's own scores


def test_the_eight_tasks_exist():
    from trl_ext.data.reasoning_gym import task_names

    names = task_names()
    assert set(TASKS) <= set(names) and "composite" not in names and len(names) >= 100


@pytest.mark.parametrize("task", TASKS)
def test_reward_equals_reasoning_gyms_own_verifier_on_1000_answers(task):
    rows = reasoning_gym_dataset(task, size=ENTRIES, seed=5)
    generator = reasoning_gym.create_dataset(task, size=ENTRIES, seed=5)  # the same stream, made by reasoning-gym
    entries = [generator[i] for i in range(ENTRIES)]
    assert [p[-1]["content"] for p in rows["prompt"]] == [e["question"] for e in entries]
    assert rows["task"] == [task] * ENTRIES

    rng = random.Random(task)
    kinds, prompts, completions, cols = [], [], [], {name: [] for name in ("task", "task_config", "entry")}
    for i, entry in enumerate(entries):
        for kind, text in answers(entry["answer"], rng).items():
            kinds.append(kind)
            prompts.append(rows[i]["prompt"])
            # TRL hands text or one assistant message: both, alternately
            completions.append(text if len(kinds) % 2 else [{"role": "assistant", "content": text}])
            for name in cols:
                cols[name].append(rows[i][name])
    assert len(completions) == 10 * ENTRIES

    rewards = ReasoningGymReward()(prompts, completions, **cols)
    expected = [
        generator.score_answer(extract_answer(text if isinstance(text, str) else text[0]["content"]), entries[n // 10])
        for n, text in enumerate(completions)
    ]
    assert rewards == expected
    by_kind = {k: [r for r, kind in zip(rewards, kinds) if kind == k] for k in set(kinds)}
    assert min(by_kind["right"] + by_kind["right_spaced"]) == 1.0
    assert max(by_kind["wrong"] + by_kind["last_tag_wins"]) < 1.0
    assert max(by_kind["no_tags"] + by_kind["unclosed"] + by_kind["empty"]) == 0.0  # no answer read: 0


def test_gsm_symbolic_gives_its_own_partial_credit_and_a_raising_verifier_scores_zero():
    rows = reasoning_gym_dataset("gsm_symbolic", size=4, seed=1)
    reward = ReasoningGymReward()
    wrong_number = [f"<answer>{int(loads_exact(e)['answer']) + 1}</answer>" for e in rows["entry"]]
    assert reward(rows["prompt"], wrong_number, **columns(rows)) == [0.01] * 4

    rows = reasoning_gym_dataset("prime_factorization", size=2, seed=1)
    generator = reasoning_gym.create_dataset("prime_factorization", size=2, seed=1)
    with pytest.raises(ValueError):  # reasoning-gym's verifier raises on this answer ...
        generator.score_answer("abc", generator[0])
    assert reward(rows["prompt"], ["<answer>abc</answer>"] * 2, **columns(rows)) == [0.0, 0.0]  # ... a wrong one


def test_a_weighted_mix_is_reasoning_gyms_composite_and_each_row_scored_by_its_task():
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    rows, reward = reasoning_gym_task(
        "reasoning-gym:chain_sum:3,leg_counting:1", size=200, seed=2, task_configs={"chain_sum": {"max_terms": 3}}
    )
    mix = CompositeDataset(
        CompositeConfig(
            size=200,
            seed=2,
            datasets=[DatasetSpec("chain_sum", 3.0, {"max_terms": 3}), DatasetSpec("leg_counting", 1.0, {})],
        )
    )
    entries = [mix[i] for i in range(200)]
    assert [loads_exact(e) for e in rows["entry"]] == entries
    assert 110 < rows["task"].count("chain_sum") < 190 and set(rows["task"]) == {"chain_sum", "leg_counting"}
    assert all(
        len(e["metadata"]["expression"].split()) <= 5 for e in entries if e["metadata"]["source_dataset"] == "chain_sum"
    )  # the per-task config reached its generator: at most 3 terms
    right = [f"<answer>{e['answer']}</answer>" for e in entries]
    wrong = [f"<answer>{e['answer']}0</answer>" for e in entries]
    assert reward(rows["prompt"], right, **columns(rows)) == [1.0] * 200
    assert reward(rows["prompt"], wrong, **columns(rows)) == [mix.score_answer(e["answer"] + "0", e) for e in entries]


@pytest.mark.parametrize("task", ["graph_color", "gsm_symbolic", "course_schedule", "complex_arithmetic"])
def test_entries_that_plain_json_would_change_come_back_equal(task):
    """int dict keys (graph_color), fractions (gsm_symbolic), tuples: what score_answer gets is the entry."""
    rows = reasoning_gym_dataset(task, size=100, seed=5)
    generator = reasoning_gym.create_dataset(task, size=100, seed=5)
    entries = [generator[i] for i in range(100)]
    assert [loads_exact(e) for e in rows["entry"]] == entries
    assert any(json.loads(json.dumps(e, default=str)) != e for e in entries)  # plain JSON would not do
    rebuilt = reasoning_gym.create_dataset(task, **loads_exact(rows["task_config"][0]))
    assert rebuilt.config == generator.config


def test_rows_are_conversations_with_reasoning_gyms_system_prompt():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    rows = reasoning_gym_dataset("chain_sum", size=3, seed=0)
    assert rows[0]["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPTS["default"]}
    assert "<answer>" in rows[0]["prompt"][0]["content"] and rows[0]["prompt"][1]["role"] == "user"
    bare = reasoning_gym_dataset("chain_sum", size=3, seed=0, system_prompt=None)
    assert [p[0]["role"] for p in bare["prompt"]] == ["user"] * 3
    direct = reasoning_gym_dataset("chain_sum", size=3, seed=0, system_prompt="direct")
    assert direct[0]["prompt"][0]["content"] == SYSTEM_PROMPTS["direct"]


# ------------------------------------------------------------------ train and test streams


@pytest.mark.parametrize("spec", ["chain_sum", "chain_sum,basic_arithmetic:2"])
def test_train_and_test_streams_never_share_a_generator_seed(spec):
    train = reasoning_gym_dataset(spec, size=200, seed=3)
    test = reasoning_gym_dataset(spec, size=200, seed=3, split="test")
    assert train["entry"] == reasoning_gym_dataset(spec, size=200, seed=3)["entry"]  # deterministic
    assert not {p[-1]["content"] for p in train["prompt"]} & {p[-1]["content"] for p in test["prompt"]}
    assert stream_seed(3, "train") == 3 and stream_seed(3, "test") == 3 + TEST_SEED_OFFSET
    # the test stream is reasoning-gym's own stream of the offset seed ...
    if spec == "chain_sum":
        generator = reasoning_gym.create_dataset("chain_sum", size=200, seed=3 + TEST_SEED_OFFSET)
        assert [loads_exact(e)["question"] for e in test["entry"]] == [generator[i]["question"] for i in range(200)]
    # ... which no train stream reaches: a train seed whose items would run into it is refused
    with pytest.raises(InputError, match="must stay within 2\\*\\*31"):
        reasoning_gym_dataset(spec, size=200, seed=TEST_SEED_OFFSET - 200)
    reasoning_gym_dataset(spec, size=1, seed=TEST_SEED_OFFSET - 4)  # the last seeds below it are fine


# ------------------------------------------------------------------ one error for each bad input


@pytest.mark.parametrize(
    "spec, kwargs, message",
    [
        ("chain_sums", {}, "unknown task 'chain_sums'; did you mean chain_sum"),
        ("composite", {}, "unknown task 'composite'"),
        ("reasoning-gym:chain_sum,nope", {}, "unknown task 'nope'"),
        ("chain_sum:x", {}, "task 'chain_sum' has weight 'x'; a weight is a positive number"),
        ("chain_sum:0", {}, "has weight '0'"),
        ("chain_sum:-1,leg_counting", {}, "has weight '-1'"),
        ("chain_sum:nan", {}, "has weight 'nan'"),
        ("chain_sum:", {}, "has weight ''"),
        ("", {}, "empty task name"),
        ("chain_sum,,leg_counting", {}, "empty task name"),
        (":2", {}, "empty task name"),
        ("chain_sum,leg_counting,chain_sum:2", {}, "task 'chain_sum' is named twice"),
        ("chain_sum", {"task_configs": {"leg_counting": {}}}, "name ['leg_counting'], which the spec 'chain_sum' does"),
        ("chain_sum", {"task_configs": {"chain_sum": {"seed": 1}}}, "sets ['seed']: seed and size come from"),
        (
            "chain_sum",
            {"task_configs": {"chain_sum": {"bogus": 1}}},
            "task chain_sum: its config was refused (TypeError",
        ),
        (
            "chain_sum",
            {"task_configs": {"chain_sum": {"min_terms": 5, "max_terms": 2}}},
            "its config was refused (AssertionError",
        ),
        ("chain_sum", {"split": "valid"}, "split must be one of train, test; got 'valid'"),
        ("chain_sum", {"system_prompt": "nope"}, "system_prompt must be one of reasoning-gym's"),
        ("chain_sum", {"size": 0}, "size must be a positive integer"),
        ("chain_sum", {"seed": -1}, "seed must be a non-negative integer"),
        ("chain_sum", {"answer_format": "json"}, "answer_format must be one of tags, last-number; got 'json'"),
        ("spell_backward", {"answer_format": "last-number"}, "not a number: answer_format 'last-number' cannot"),
        ("chain_sum", {"answer_format": "last-number", "system_prompt": "simple"}, "brings its own system prompt"),
    ],
)
def test_each_bad_input_gives_one_error_naming_it(spec, kwargs, message):
    with pytest.raises(InputError) as caught:
        reasoning_gym_dataset(spec, **{"size": 4, **kwargs})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_without_the_extra_both_halves_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    for build in (lambda: reasoning_gym_dataset("chain_sum", size=2), ReasoningGymReward):
        with pytest.raises(BackendUnavailableError, match=r"pip install 'trl-ext\[reasoning-gym\]'$"):
            build()


def test_rows_the_reward_cannot_read_are_named():
    from trl_ext.rewards import RewardError

    rows = reasoning_gym_dataset("chain_sum", size=1)
    good = columns(rows)
    cases = [
        ({"task": good["task"], "entry": good["entry"]}, "needs the dataset column 'task_config'"),
        ({**good, "entry": ["not json"]}, "the 'entry' of a 'chain_sum' row is not the JSON"),
        ({**good, "task": ["nope"]}, "cannot rebuild task 'nope' from its task_config (ValueError"),
        ({**good, "task_config": ['{"bogus": 1}']}, "cannot rebuild task 'chain_sum' from its task_config (TypeError"),
    ]
    for cols, message in cases:
        with pytest.raises(RewardError) as caught:
            ReasoningGymReward()(["q"], ["<answer>1</answer>"], **cols)
        assert message in str(caught.value) and str(caught.value).startswith("reward 'reasoning_gym'"), message


# ------------------------------------------------------------------ the last-number answer format

NUMERIC_TASKS = ["basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "letter_counting", "coin_flip"]


def test_last_number_reads_the_replys_last_number():
    from trl_ext.data.reasoning_gym import last_number

    assert last_number("6 + 5 = 11.") == "11"
    assert last_number("1 - 8 gives -7") == "-7"
    assert last_number("It costs 1,234 dollars, not 12") == "12"
    assert last_number("about 1,234") == "1234"
    assert last_number("p = 0.25\n") == "0.25" and last_number("p is 3.05e-05") == "3.05e-05"
    assert last_number("no number here") is None and last_number("") is None


@pytest.mark.parametrize("task", NUMERIC_TASKS)
def test_last_number_format_is_scored_by_the_tasks_own_verifier(task):
    from trl_ext.data.reasoning_gym import LAST_NUMBER_PROMPT, last_number

    rows = reasoning_gym_dataset(task, size=20, seed=3, answer_format="last-number")
    generator = reasoning_gym.create_dataset(task, size=20, seed=3)
    assert rows["answer_format"] == ["last-number"] * 20
    assert all(p[0] == {"role": "system", "content": LAST_NUMBER_PROMPT} for p in rows["prompt"])
    prompts, completions, cols, expected, right = (
        [],
        [],
        {name: [] for name in (*columns(rows), "answer_format")},
        [],
        [],
    )
    for i in range(20):
        entry, answer = generator[i], generator[i]["answer"]
        wrong = str(float(answer) + 3)
        for text, is_right in (
            (f"Adding them up, the answer is {answer}.", True),
            (f"First 3, then {answer}", True),
            (f"{answer}? No: {wrong}", False),
            ("I cannot tell.", False),
        ):
            prompts.append(rows[i]["prompt"])
            completions.append([{"role": "assistant", "content": text}])
            for name in cols:
                cols[name].append(rows[i][name])
            expected.append(generator.score_answer(last_number(text), entry))
            right.append(is_right)
    rewards = ReasoningGymReward()(prompts, completions, **cols)
    assert rewards == expected
    assert all(r == 1.0 for r, ok in zip(rewards, right) if ok) and all(
        r < 1.0 for r, ok in zip(rewards, right) if not ok
    )


def test_a_row_with_an_unknown_answer_format_is_named():
    from trl_ext.rewards import RewardError

    rows = reasoning_gym_dataset("chain_sum", size=1)
    with pytest.raises(RewardError, match="a row's answer_format is 'xml'; expected one of tags, last-number"):
        ReasoningGymReward()(["q"], ["1"], **columns(rows), answer_format=["xml"])


# ------------------------------------------------------------------ in the trainers


def test_called_as_grpo_calls_reward_functions():
    from transformers import TrainerState

    rows, reward = reasoning_gym_task("chain_sum,leg_counting", size=4, seed=0)
    assert reward.__name__ == "reasoning_gym"
    answers_ = [loads_exact(e)["answer"] for e in rows["entry"]]
    completions = [[{"role": "assistant", "content": f"<answer>{a}</answer>"}] for a in answers_]
    logged = []
    values = reward(
        prompts=rows["prompt"],
        completions=completions,
        completion_ids=[[1, 2]] * 4,
        trainer_state=TrainerState(),
        log_metric=lambda *a: logged.append(a),
        log_extra=lambda *a: None,
        other_column=["x"] * 4,
        **columns(rows),
    )
    assert values == [1.0] * 4
    text = reward(
        prompts=[p[-1]["content"] for p in rows["prompt"]], completions=["<answer>no</answer>"] * 4, **columns(rows)
    )
    assert max(text) < 1.0
    again = pickle.loads(pickle.dumps(reward))  # launched processes get it pickled
    assert again(rows["prompt"], completions, **columns(rows)) == values


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("reasoning_gym") / "qwen2_chat", chat_template=True)


def _recording_columns(reward) -> list:
    """Each call's prompts, task columns and scores of ``reward`` (a ``ReasoningGymReward``), from now on."""
    calls, score = [], reward.score

    def recording(prompts, completions, **columns):
        calls.append((prompts, columns, score(prompts, completions, **columns)))
        return calls[-1][2]

    reward.score = recording
    return calls


def _check_columns_are_their_prompts(calls, rows, logged_mean: float) -> None:
    """Every completion was graded against its own prompt's row, and the logged mean is the scores'."""
    by_prompt = {json.dumps(r["prompt"]): r for r in rows}
    assert len(by_prompt) == len(rows)  # distinct questions: a prompt names its row
    ((prompts, columns, scores),) = calls
    for i, prompt in enumerate(prompts):
        row = by_prompt[json.dumps(prompt)]
        assert [columns[c][i] for c in ("task", "task_config", "entry")] == [
            row["task"],
            row["task_config"],
            row["entry"],
        ]
    assert logged_mean == pytest.approx(sum(scores) / len(scores), abs=1e-6)


def test_one_update_of_trl_ext_ppo_on_a_task(chat_policy):
    from trl_ext.ppo import PPOConfig, PPOTrainer

    rows, reward = reasoning_gym_task("chain_sum,basic_arithmetic", size=4, seed=0, system_prompt="direct")
    args = PPOConfig(
        batch_size=4, total_episodes=4, response_length=6, num_ppo_epochs=1, learning_rate=1e-2, report_to="none"
    )
    trainer = PPOTrainer(str(chat_policy), reward_funcs=[reward], args=args, train_dataset=rows)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    calls = _recording_columns(reward)
    history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["rewards/reasoning_gym/mean"])
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters())
    _check_columns_are_their_prompts(calls, rows, history[0]["rewards/reasoning_gym/mean"])


def test_through_the_trl_ppo_reward_model_adapter(chat_policy):
    """TRL 1.12's PPO scores (prompt + response) token ids through the adapter: the task's columns reach the reward."""
    from transformers import AutoTokenizer

    from trl_ext.data.prompt_dataset import prepare_prompt_dataset
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    tok = AutoTokenizer.from_pretrained(chat_policy)
    rows, reward = reasoning_gym_task("chain_sum", size=2, seed=0, system_prompt="direct")
    dataset = prepare_prompt_dataset(rows, tok)
    answer_ids = [
        tok(text=f"<answer>{loads_exact(e)['answer']}</answer>")["input_ids"] + [tok.eos_token_id]
        for e in rows["entry"]
    ]
    sequences = [dataset["input_ids"][0] + answer_ids[0], dataset["input_ids"][1] + answer_ids[0]]  # 2nd: wrong
    width = max(map(len, sequences))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(s)) + s for s in sequences])
    model = as_ppo_reward_model(reward, tok, dataset)
    scores = model.reward_backbone(input_ids=ids, attention_mask=ids != tok.pad_token_id).hidden_states[0][:, -1, 0]
    first, second = (loads_exact(e)["answer"] for e in rows["entry"])
    assert scores[0].item() == 1.0 and scores[1].item() == (1.0 if first == second else 0.0)


@pytest.mark.trl_api  # TRL's own GRPOTrainer
def test_one_step_of_trls_grpo_trainer_on_a_task(chat_policy, tmp_path):
    import trl

    rows, reward = reasoning_gym_task("reasoning-gym:leg_counting", size=4, seed=0, system_prompt="direct")
    args = trl.GRPOConfig(
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
    trainer = trl.GRPOTrainer(model=str(chat_policy), reward_funcs=[reward], args=args, train_dataset=rows)
    calls = _recording_columns(reward)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "rewards/reasoning_gym/mean" in h]
    assert logged and math.isfinite(logged[0]["rewards/reasoning_gym/mean"])
    _check_columns_are_their_prompts(calls, rows, logged[0]["rewards/reasoning_gym/mean"])


# ------------------------------------------------------------------ the command


@pytest.mark.parametrize("backend", ["scratch", pytest.param("trl", marks=pytest.mark.needs_trl_ppo)])
def test_rlhf_trains_on_a_task_by_name(chat_policy, tmp_path, capsys, backend):
    from trl_ext.commands.cli import main

    out = tmp_path / "o"
    code = main(
        [
            "rlhf",
            "--backend",
            backend,
            "--policy",
            str(chat_policy),
            "--task",
            "reasoning-gym:chain_sum,basic_arithmetic",
            "--task-size",
            "8",
            "--out",
            str(out),
            "--total-episodes",
            "4",
            "--batch-size",
            "2",
            "--response-length",
            "4",
            "--lora-r",
            "4",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert "[prompts] 8 conversations from reasoning-gym:chain_sum,basic_arithmetic" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["first_score"] is not None
    assert summary["config"]["data"]["task"] == "reasoning-gym:chain_sum,basic_arithmetic"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--task", "reasoning-gym:chain_sums"], "unknown task 'chain_sums'; did you mean chain_sum"),
        (["--task", "reasoning-gym:chain_sum:two"], "task 'chain_sum' has weight 'two'"),
        (["--task", "chain_sum"], "--task 'chain_sum': expected 'reasoning-gym:TASK'"),
        (["--task", "reasoning-gym:chain_sum", "--prompts", "p.txt"], "give --prompts or --task, not both"),
        ([], "give --prompts (a prompt file) or --task (a public task"),
    ],
)
def test_rlhf_refuses_a_bad_task_in_one_line_and_writes_nothing(chat_policy, tmp_path, capsys, extra, message):
    from trl_ext.commands.cli import main

    out = tmp_path / "o"
    assert main(["rlhf", "--policy", str(chat_policy), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists(), err
