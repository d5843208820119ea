"""``step()`` environments as a rollout kind (``trl_ext.rollouts.StepEnvironment``), token in and token out, with a
scripted player and a scripted Gym environment: observations come back as user turns in the chat template's own
rendering; each step's reward lands on its turn's last token (the last one is the score) or the return is the score
alone; a turn cap and a token cap a turn; termination and truncation as Gym means them; the one turn loop."""

import re
from types import SimpleNamespace

import pytest
import torch
from tool_models import tool_tokenizer

from trl_ext.agents.steps import StepFailure
from trl_ext.data.batching import pad_batch
from trl_ext.errors import InputError
from trl_ext.rollouts import ROLLOUTS, StepEnvironment, build_rollout


class Countdown:
    """A scripted Gym environment: the secret is the row's ``secret``; a reply naming it wins (+1, terminated); a
    wrong number earns 0.25 and the hint "more" or "less"; no number ends nothing; after ``limit`` steps the game
    truncates itself."""

    def __init__(self, limit: int = 10):
        self.limit, self.steps = limit, []

    def reset(self, secret: int, **row):
        self.secret, self.steps = int(secret), []
        return f"Find {len(str(secret))} digit.", {"row": row}

    def step(self, action: str):
        self.steps.append(action)
        number = re.search(r"\d+", action)
        truncated = len(self.steps) >= self.limit
        if number is None:
            return "Say a number.", 0.0, False, truncated, {}
        if int(number.group()) == self.secret:
            return "Won.", 1.0, True, False, {}
        return ("more" if int(number.group()) < self.secret else "less"), 0.25, False, truncated, {}


class ScriptedSampling:
    """The ``Sampling`` a rollout gets, writing ``turns[k]`` then eos as a rollout's k-th turn (k: the user turns in
    its query, less the first)."""

    def __init__(self, tokenizer, turns: list[str], response_length: int = 400, max_positions: int | None = None):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, []
        self.config = SimpleNamespace(
            response_length=response_length,
            num_generations=1,
            skip_special_tokens=True,
            score_position="last_token",
            max_tool_calling_iterations=None,
        )
        self.device, self.max_positions, self.trainer = torch.device("cpu"), max_positions, None

    def pad(self, queries):
        return pad_batch(queries, self.tokenizer.pad_token_id, side="left")

    def sample(self, query_ids, query_mask, max_new_tokens=None):
        self.calls.append(max_new_tokens)
        tok, out = self.tokenizer, []
        for ids, mask in zip(query_ids, query_mask):
            k = tok.decode(ids[mask.bool()]).count("<|im_start|>user") - 1
            new = tok(self.turns[min(k, len(self.turns) - 1)], add_special_tokens=False)["input_ids"] + [
                tok.eos_token_id
            ]
            out.append(new[:max_new_tokens])
        responses, mask = pad_batch(out, tok.pad_token_id, side="right")
        return responses, mask, None


@pytest.fixture(scope="module")
def tok():
    return tool_tokenizer()


ROWS = {"prompt": [[{"role": "user", "content": "Play."}]], "secret": [7]}


def _play(tok, turns, rollout=None, **sampling):
    rollout = rollout or StepEnvironment(Countdown)
    rollout.check(ScriptedSampling(tok, turns).config, tok)
    batch = rollout.rollout(dict(ROWS), ScriptedSampling(tok, turns, **sampling))
    return batch, rollout.environments[0]


def _tokens(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_observations_come_back_as_user_turns_in_the_templates_rendering(tok):
    batch, env = _play(tok, ["3", "9", "7"])
    messages = batch.completions[0]
    assert [m["role"] for m in messages] == ["assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in messages] == ["3", "more", "9", "less", "7"]
    assert env.steps == ["3", "9", "7"]  # every model turn was the action, as decoded
    # the prompt: the row's user turn with the first observation; the ids: the template's rendering, turn by turn
    assert batch.prompts[0] == [{"role": "user", "content": "Play.\n\nFind 1 digit."}]
    rendered = tok.apply_chat_template(batch.prompts[0] + messages, tokenize=True, return_dict=False)
    ids = [int(i) for i in batch.query_ids[0][batch.query_mask[0].bool()]] + batch.completion_ids[0]
    assert ids + _tokens(tok, "\n") == rendered  # the template closes the last turn with a newline
    model = [int(i) for i, m in zip(batch.responses[0], batch.loss_mask[0]) if m]
    assert model == _tokens(tok, "3<|im_end|>9<|im_end|>7<|im_end|>")  # the model's own tokens alone are trained


def test_each_steps_reward_lands_on_its_turns_last_token_and_the_last_is_the_score(tok):
    batch, _ = _play(tok, ["3", "9", "7"])
    ends = [i for i, t in enumerate(batch.completion_ids[0]) if t == tok.eos_token_id and batch.loss_mask[0][i]]
    assert len(ends) == 3  # one eos a model turn
    rewards = batch.turn_rewards[0]
    assert rewards[ends[0]] == 0.25 and rewards[ends[1]] == 0.25 and rewards[ends[2]] == 0.0
    assert float(rewards.sum()) == 0.5  # nothing anywhere else
    assert batch.columns["environment_reward"] == [1.0]  # the winning turn's reward: the score, on the last token
    assert ends[2] == int(batch.loss_mask[0].nonzero().max())
    metrics = batch.rollout_metrics(batch.counters)
    assert metrics["env/return"] == 1.5 and metrics["env/terminated"] == 1.0 and metrics["env/truncated"] == 0.0
    assert metrics["turns/per_rollout"] == 3.0 and metrics["turns/reward_per_rollout"] == 0.5


def test_final_rewards_give_the_return_as_the_score_alone(tok):
    batch, _ = _play(tok, ["3", "9", "7"], StepEnvironment(Countdown, rewards="final"))
    assert float(batch.turn_rewards.abs().sum()) == 0.0
    assert batch.columns["environment_reward"] == [1.5]


def test_the_turn_cap_truncates_the_episode(tok):
    batch, env = _play(tok, ["3"], StepEnvironment(Countdown, max_turns=2))
    assert env.steps == ["3", "3"] and [m["role"] for m in batch.completions[0]] == ["assistant", "user", "assistant"]
    metrics = batch.rollout_metrics(batch.counters)
    assert metrics["env/truncated"] == 1.0 and metrics["env/terminated"] == 0.0 and metrics["env/return"] == 0.5


def test_the_environments_own_truncation_ends_the_episode(tok):
    batch, env = _play(tok, ["3"], StepEnvironment(lambda: Countdown(limit=3)))
    assert len(env.steps) == 3 and batch.counters["turns"] == 3 and batch.counters["truncated"] == 1


def test_the_token_cap_cuts_a_turn_and_closes_it_with_an_eos_that_is_not_trained(tok):
    batch, env = _play(tok, ["I guess 7 now"], StepEnvironment(Countdown, max_turn_tokens=4))
    first = batch.completion_ids[0]
    assert env.steps[0] == "I gu"  # the action is the turn as cut
    assert first[:5] == _tokens(tok, "I gu") + [tok.eos_token_id]
    assert batch.loss_mask[0][:5].tolist() == [1, 1, 1, 1, 0]  # the closing eos is the template's, not the model's
    rendered = tok.apply_chat_template(batch.prompts[0] + batch.completions[0], tokenize=True, return_dict=False)
    ids = [int(i) for i in batch.query_ids[0][batch.query_mask[0].bool()]] + first
    assert ids == rendered[: len(ids)]


def test_an_observation_past_the_budget_is_dropped_and_the_episode_truncated(tok):
    budget = len(_tokens(tok, "3<|im_end|>")) + 3
    batch, env = _play(tok, ["3"], response_length=budget)
    assert env.steps == ["3"] and len(batch.completion_ids[0]) == budget - 3
    assert batch.counters["dropped"] == 1 and batch.counters["truncated"] == 1


def test_step_environment_is_a_registered_rollout_kind_and_refuses_what_it_cannot_play(tok):
    assert "step_environment" in ROLLOUTS
    with pytest.raises(InputError, match="the step_environment rollout plays an environment: give it one"):
        build_rollout("step_environment")
    with pytest.raises(InputError, match="rewards must be one of turn, final"):
        StepEnvironment(Countdown, rewards="sum")
    with pytest.raises(InputError, match="max_turn_tokens must be a positive integer"):
        StepEnvironment(Countdown, max_turn_tokens=0)
    config = ScriptedSampling(tok, ["3"]).config
    with pytest.raises(InputError, match="max_tool_calling_iterations bounds tool calls"):
        StepEnvironment(Countdown).check(SimpleNamespace(**{**vars(config), "max_tool_calling_iterations": 2}), tok)


def test_a_step_that_is_not_gyms_shape_is_one_error_naming_the_class(tok):
    class OldGym(Countdown):
        def step(self, action):
            return "more", 0.0, False

    with pytest.raises(StepFailure, match=r"OldGym.step returned tuple of 3: expected Gym's \(observation, reward"):
        _play(tok, ["3"], StepEnvironment(OldGym))


def test_the_recipe_is_a_few_lines_on_the_rollout_kind(tok):
    from trl_ext.settings.user_code import import_callable

    rollout = import_callable("recipes/extensions/step_environment.py:guess_the_number", "rollout")()
    assert isinstance(rollout, StepEnvironment) and rollout.max_turns == 3
    batch, _ = _play(tok, ["4", "7"], rollout)
    assert [m["content"] for m in batch.completions[0]] == ["4", "Higher.", "7"]
    assert batch.columns["environment_reward"] == [1.0] and batch.counters["terminated"] == 1
