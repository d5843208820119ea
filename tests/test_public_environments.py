"""GEM's and TextArena's games by name (``trl_ext.agents.public_environments``), played through the
``step_environment`` rollout: a scripted binary-search player wins every game of the real environments; per-turn
rewards land where the record says; train and test games never meet; a bad name and an environment that needs the
network are one line before anything is written; ``trl-ext rlhf --environment gem:...`` trains in one command, and
one PPO update through PPOTrainer records the environment's own turns. Skipped without the packages (the gem and
textarena extras: ``scripts/setup.sh latest`` installs them)."""

import json
import re

import pytest
from test_step_environments import ScriptedSampling
from tool_models import tiny_tool_model, tool_tokenizer

from trl_ext.agents.public_environments import TEST_SEED_OFFSET, environment_factory, game_rows, game_seeds
from trl_ext.data.batching import pad_batch
from trl_ext.errors import InputError
from trl_ext.rollouts import StepEnvironment

GEM = "gem:game:GuessTheNumber-v0-easy"  # 1-10, 4 turns
TEXTARENA = "textarena:GuessTheNumber-v0"  # 1-20, 10 turns
GAMES = {GEM: ("gem", 1, 10, "\\boxed{{{}}}"), TEXTARENA: ("textarena", 1, 20, "[{}]")}


def needs(spec: str):
    pytest.importorskip(GAMES[spec][0])


class BinarySearch(ScriptedSampling):
    """A player that halves the range the game's hints leave (its guesses in its own turns, the hints "higher" /
    "lower" in the user turns after them), written in the game's move format."""

    def __init__(self, tokenizer, spec: str, **options):
        super().__init__(tokenizer, [], **options)
        _, self.low, self.high, self.move = GAMES[spec]

    def guess(self, conversation: str) -> int:
        low, high, last = self.low, self.high, None
        for segment in conversation.split("<|im_start|>")[1:]:
            role, _, text = segment.partition("\n")
            if role == "assistant" and re.search(r"\d", text):
                last = int(re.findall(r"\d+", text)[-1])
            elif role == "user" and last is not None and "higher" in text:
                low = last + 1
            elif role == "user" and last is not None and "lower" in text:
                high = last - 1
        return (low + high) // 2

    def sample(self, query_ids, query_mask, max_new_tokens=None):
        tok, out = self.tokenizer, []
        for ids, mask in zip(query_ids, query_mask):
            move = self.move.format(self.guess(tok.decode(ids[mask.bool()])))
            out.append((tok(move, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:max_new_tokens])
        responses, mask = pad_batch(out, tok.pad_token_id, side="right")
        return responses, mask, None


class Counting:
    """Counts the steps of the environment it wraps (the environment's own turns)."""

    steps = 0

    def __init__(self, factory):
        self.env = factory()

    def reset(self, **row):
        return self.env.reset(**row)

    def step(self, action):
        Counting.steps += 1
        return self.env.step(action)


@pytest.fixture(scope="module")
def tok():
    return tool_tokenizer()


@pytest.mark.parametrize("spec", [GEM, TEXTARENA])
def test_a_binary_search_player_wins_every_game_of_the_real_environment(tok, spec):
    needs(spec)
    rollout = StepEnvironment(environment_factory(spec))
    rows = game_rows(6, seed=11)
    player = BinarySearch(tok, spec, response_length=1500)
    rollout.check(player.config, tok)
    batch = rollout.rollout(rows, player)
    assert batch.columns["environment_reward"] == [1.0] * 6  # the win is the last turn's reward: the score
    counters = batch.counters
    assert counters["terminated"] == 6 and counters["truncated"] == 0 and counters["episode_return"] == 6.0
    for completion in batch.completions:  # observations as user turns, the moves as assistant turns
        roles = [m["role"] for m in completion]
        assert roles == ["assistant", "user"] * (len(roles) // 2) + ["assistant"]
    # GEM's and TextArena's first observation is the game's prompt, written into the row's user turn
    assert all("Guess The Number" in p[-1]["content"] for p in batch.prompts)
    turns = sum((len(c) + 1) // 2 for c in batch.completions)
    assert counters["turns"] == turns and turns > 6  # some games take more than a guess


def test_gems_rewards_reach_the_record_where_it_says(tok):
    needs(GEM)
    # a reply without \boxed{} is -0.1 and ends the game: a one-turn episode, its reward the score
    unreadable = ScriptedSampling(tok, ["no idea"], response_length=1500)
    batch = StepEnvironment(environment_factory(GEM)).rollout(game_rows(2, seed=3), unreadable)
    assert batch.columns["environment_reward"] == [-0.1, -0.1] and float(batch.turn_rewards.abs().sum()) == 0.0
    assert batch.counters["turns"] == 2 and batch.counters["terminated"] == 2
    # always 1: GEM pays nothing on turns 1-3 and a partial score on the fourth, when its own limit truncates it
    for rewards in ("turn", "final"):
        always_one = ScriptedSampling(tok, ["\\boxed{1}"], response_length=1500)
        rollout = StepEnvironment(environment_factory(GEM), rewards=rewards)
        batch = rollout.rollout(game_rows(6, seed=0), always_one)
        assert float(batch.turn_rewards.abs().sum()) == 0.0
        lost = 0
        for completion, score in zip(batch.completions, batch.columns["environment_reward"]):
            won = score == 1.0 and len(completion) == 1
            lost += not won
            assert won or (len(completion) == 7 and 0.0 <= score < 1.0)  # 4 moves, 3 observations
        assert lost and batch.counters["truncated"] == lost and batch.counters["episode_return"] < 6


def test_train_and_test_games_never_meet_and_a_seed_is_one_game():
    train, test = game_seeds(1000, seed=5), game_seeds(1000, seed=5, split="test")
    assert train[0] == 5 and test[0] == 5 + TEST_SEED_OFFSET and not set(train) & set(test)
    assert max(game_seeds(10, seed=2**31 - 10)) < TEST_SEED_OFFSET <= min(game_seeds(10, seed=0, split="test"))
    with pytest.raises(InputError, match="must stay in"):
        game_seeds(20, seed=2**31 - 10)
    needs(GEM)
    make = environment_factory(GEM)
    first = [make().reset(seed=s)[0] for s in (7, 7)]
    assert first[0] == first[1]
    targets = set()
    for s in game_seeds(12, seed=0):
        env = make()
        env.reset(seed=s)
        targets.add(env.env.game_number)
    assert len(targets) > 3  # the seeds make different games


def _rlhf(policy, out, *extra):
    from trl_ext.commands.cli import main

    return main(
        ["rlhf", "--policy", str(policy), "--out", str(out), "--total-episodes", "4", "--batch-size", "2"]
        + ["--response-length", "48", "--turn-tokens", "8", "--lora-r", "4", "--environment-games", "8", *extra]
    )


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return tiny_tool_model(tmp_path_factory.mktemp("public_environments") / "policy")


@pytest.mark.parametrize(
    "spec, package, message",
    [
        ("gem:game:GuessTheNumbr-v0-easy", "gem", "close names: gem:game:GuessTheNumber-v0-easy"),
        ("gem:math:GSM8K", "gem", "gem:math:GSM8K loads its dataset from the Hugging Face hub: not offline"),
        ("textarena:GuessTheNumbr-v0", "textarena", "close names: textarena:GuessTheNumber-v0"),
        ("textarena:Wordle-v0", "textarena", "textarena:Wordle-v0 needs an nltk download: not offline"),
    ],
)
def test_a_bad_name_or_an_online_environment_is_one_line_and_writes_nothing(
    policy, tmp_path, capsys, spec, package, message
):
    pytest.importorskip(package)
    out = tmp_path / "o"
    assert _rlhf(policy, out, "--environment", spec) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists(), err


def test_environment_options_are_refused_where_they_mean_nothing(policy, tmp_path, capsys):
    out = tmp_path / "o"
    assert _rlhf(policy, out, "--environment", GEM, "--prompts", "p.txt") == 2
    assert "makes its games' prompts: give it without --prompts or --task" in capsys.readouterr().err
    assert _rlhf(policy, out, "--prompts", "p.txt", "--turn-tokens", "4") == 2
    assert "set a public environment's turns" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("spec", [GEM, TEXTARENA])
def test_rlhf_trains_a_public_game_by_name_in_one_command(policy, tmp_path, capsys, spec):
    needs(spec)
    out = tmp_path / "o"
    assert _rlhf(policy, out, "--environment", spec, "--seed", "3") == 0, capsys.readouterr().err[-2000:]
    said = capsys.readouterr().out
    assert f"[prompts] 8 train games of {spec} (seeds 3-10;" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2
    games = summary["games"]
    assert games["train_seeds"] == [3, 10] and games["test_seeds_from"] == 3 + TEST_SEED_OFFSET
    assert games["first_return"] is not None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(row["turns/per_rollout"] >= 1.0 and row["tokens/model_per_rollout"] <= 48 for row in rows)


def test_one_ppo_update_on_a_gem_game_records_the_environments_own_turns(policy):
    needs(GEM)
    from datasets import Dataset

    from trl_ext.ppo import PPOConfig, PPOTrainer

    config = PPOConfig(
        batch_size=4,
        total_episodes=4,
        response_length=40,
        learning_rate=1e-3,
        num_ppo_epochs=1,
        sampler="loop",
        temperature=1.0,
        advantage_estimator="gae",
    )
    make = environment_factory(GEM)
    Counting.steps = 0
    rollout = StepEnvironment(lambda: Counting(make), max_turn_tokens=6)
    trainer = PPOTrainer(
        str(policy),
        args=config,
        train_dataset=Dataset.from_dict(game_rows(4, seed=0)),
        processing_class=tool_tokenizer(),
        rollout=rollout,
    )
    [stats] = trainer.train()
    assert stats["turns/per_rollout"] * 4 == Counting.steps  # every model turn was one step of the game
    assert stats["tokens/model_per_rollout"] <= 6 * stats["turns/per_rollout"]  # the cap a turn
    assert stats["env/terminated"] + stats["env/truncated"] >= 1.0  # every episode ended, one way or both
    assert stats["rewards/environment_reward/mean"] <= 1.0 and stats["loss/value_avg"] == stats["loss/value_avg"]
