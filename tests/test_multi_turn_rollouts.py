"""Multi-turn rollouts with tools and environments, token in and token out, on a tiny tool-calling chat model:
the ids the loop builds are the chat template's rendering of the whole conversation; faults are results the model
reads, counted; the loop is bounded; environments reset per rollout; reward functions see what TRL's see."""

import pytest
import torch
from tool_models import ScriptedSampler, call_text, tiny_tool_model, tool_tokenizer

from trl_ext.agents import ToolResult
from trl_ext.agents.templates import ChatTemplateError, prepare_tokenizer, tool_suffix_ids
from trl_ext.agents.tools import Toolbox
from trl_ext.agents.turns import run_turns
from trl_ext.errors import InputError

PROMPT = [{"role": "user", "content": "What is 3 times 4?"}]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def broken(x: str) -> str:
    """A tool that always fails.

    Args:
        x: Anything.
    """
    raise RuntimeError("the service is down")


@pytest.fixture(scope="module")
def tok():
    tokenizer = tool_tokenizer()
    prepare_tokenizer(tokenizer)
    return tokenizer


def _scripted_sample(tok, turns):
    sampler = ScriptedSampler(tok, turns)

    def sample(queries, max_new_tokens):
        from trl_ext.data.batching import pad_batch
        from trl_ext.data.sequences import completion_token_ids
        from trl_ext.ppo.rollout.interface import SamplingOptions, trimmed

        ids, mask = pad_batch(queries, tok.pad_token_id, side="left")
        options = SamplingOptions(max_new_tokens, tok.eos_token_id, tok.pad_token_id)
        responses, rmask, _ = trimmed(sampler.sample(None, ids, mask, options), tok.eos_token_id, tok.pad_token_id)
        return completion_token_ids(responses, rmask), None

    return sample


def _prompt_ids(tok, tools, prompt=PROMPT):
    return tok.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_final_ids_are_the_templates_rendering_of_the_whole_conversation(tok):
    turns = [call_text("multiply", {"a": 3, "b": 4}), "It is 12."]
    prompt_ids = _prompt_ids(tok, [multiply])
    [t], counts = run_turns(_scripted_sample(tok, turns), tok, [prompt_ids], [Toolbox([multiply])], budget=400)
    assert [m["role"] for m in t.messages] == ["assistant", "tool", "assistant"]
    assert t.messages[0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert t.messages[1] == {"role": "tool", "name": "multiply", "content": "12"}
    rendered = tok.apply_chat_template(PROMPT + t.messages, tools=[multiply], tokenize=True, return_dict=False)
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    assert t.prompt_ids + t.ids + newline == rendered  # the template closes the last turn with a newline
    # the model's tokens are exactly its two turns, each up to and including eos
    model = [i for i, m in zip(t.ids, t.loss_mask) if m]
    expected = tok("".join(turn + "<|im_end|>" for turn in turns), add_special_tokens=False)["input_ids"]
    assert model == expected
    assert (counts.calls, counts.failures, t.model_turns, t.tool_rounds) == (1, 0, 2, 1)


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tokenizer = tool_tokenizer()
    # drops the tool calls of earlier assistant turns once a tool result follows: no pure suffix
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{%- for tool_call in message.tool_calls %}",
        "{%- for tool_call in (message.tool_calls if loop.last else []) %}",
    )
    with pytest.raises(ChatTemplateError, match="pure suffix"):
        tool_suffix_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}])


def test_a_template_without_tools_needs_a_tool_template_chosen_explicitly():
    tokenizer = tool_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="with_tool_template"):
        prepare_tokenizer(tokenizer)
    from trl_ext.agents import with_tool_template

    prepare_tokenizer(with_tool_template(tokenizer, "qwen2_5"))
    assert tokenizer.response_template is not None


def test_faults_are_results_the_model_reads_and_are_counted(tok):
    turns = [call_text("broken", {"x": "a"}) + call_text("nowhere", {}), "Sorry."]
    [t], counts = run_turns(
        _scripted_sample(tok, turns), tok, [_prompt_ids(tok, [broken])], [Toolbox([broken])], budget=500
    )
    assert t.messages[1]["content"] == "{'error': 'the service is down'}"
    assert t.messages[2]["content"] == "{'error': 'Tool nowhere not found.'}"
    assert (counts.calls, counts.failures, counts.unknown) == (2, 2, 1)
    assert t.messages[-1]["content"] == "Sorry."


def test_a_malformed_call_is_counted_and_ends_the_rollout(tok):
    turns = ['<tool_call>\n{"name": "multiply", "argu\n</tool_call>', "never sampled"]
    [t], counts = run_turns(
        _scripted_sample(tok, turns), tok, [_prompt_ids(tok, [multiply])], [Toolbox([multiply])], budget=400
    )
    assert counts.malformed == 1 and counts.calls == 0 and t.model_turns == 1
    assert "tool_calls" not in t.messages[0]


def test_the_loop_is_bounded_by_iterations_and_by_the_budget(tok):
    always = [call_text("multiply", {"a": 1, "b": 2})]
    sample = _scripted_sample(tok, always)
    [t], counts = run_turns(
        sample, tok, [_prompt_ids(tok, [multiply])], [Toolbox([multiply])], budget=2000, max_iterations=3
    )
    assert (t.tool_rounds, t.model_turns, counts.calls) == (3, 4, 3)
    turn = len(tok(always[0] + "<|im_end|>", add_special_tokens=False)["input_ids"])
    suffix = len(tool_suffix_ids(tok, [{"role": "tool", "name": "multiply", "content": "2"}]))
    budget = 2 * turn + suffix + suffix // 2  # room for two turns and one result, not for the second result
    [t], counts = run_turns(sample, tok, [_prompt_ids(tok, [multiply])], [Toolbox([multiply])], budget=budget)
    assert counts.overlong == 1 and counts.calls == 2  # the result that would overflow is dropped, and said
    assert len(t.ids) == 2 * turn + suffix and t.model_turns == 2
    assert t.messages[-1]["role"] == "assistant" and t.loss_mask[-1] == 1


def test_a_turn_cut_by_the_budget_ends_the_rollout(tok):
    turns = ["x" * 50]
    [t], _ = run_turns(
        _scripted_sample(tok, turns), tok, [_prompt_ids(tok, [multiply])], [Toolbox([multiply])], budget=20
    )
    assert len(t.ids) == 20 and t.model_turns == 1 and sum(t.loss_mask) == 20


def test_a_tool_result_reward_lands_on_its_turns_last_token(tok):
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return ToolResult("found", reward=0.5)

    turns = [call_text("lookup", {"key": "k"}), "Done."]
    [t], _ = run_turns(_scripted_sample(tok, turns), tok, [_prompt_ids(tok, [lookup])], [Toolbox([lookup])], budget=400)
    first_turn = len(tok(turns[0] + "<|im_end|>", add_special_tokens=False)["input_ids"])
    assert t.turn_rewards == [(first_turn - 1, 0.5)]
    assert t.ids[first_turn - 1] == tok.eos_token_id and t.messages[1]["content"] == "found"
    # a result too long for the budget is dropped, but the tool ran: its turn keeps the reward
    [t], counts = run_turns(
        _scripted_sample(tok, turns), tok, [_prompt_ids(tok, [lookup])], [Toolbox([lookup])], budget=first_turn + 2
    )
    assert counts.overlong == 1 and t.turn_rewards == [(first_turn - 1, 0.5)] and len(t.ids) == first_turn


def test_tool_suffix_ids_are_what_the_template_adds_after_eos(tok):
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "multiply", "content": "12"}])
    assert (
        tok.decode(suffix) == "\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# ---------------------------------------------------------------------------------------------- through the trainer


class Counter:
    """A scripted environment: ``increment`` adds to a counter (a reward for the turn), ``get_reward`` reads it."""

    def __init__(self):
        self.value = 0
        self.resets = []

    def reset(self, **row):
        self.resets.append(row["start"])
        self.value = row["start"]
        return f" Start at {row['start']}."

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.value += step
        return ToolResult(f"now {self.value}", reward=0.1 * step)

    def get_reward(self) -> float:
        return float(self.value)


def _dataset(n=4):
    from datasets import Dataset

    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": f"Count {i}."}] for i in range(n)], "start": list(range(n))}
    )


def _trainer(path, **options):
    from trl_ext.ppo import PPOConfig, PPOTrainer

    extra = {
        k: options.pop(k) for k in ("tools", "environment_factory", "rollout_func", "reward_funcs") if k in options
    }
    config = PPOConfig(
        **{
            **dict(
                batch_size=4,
                num_generations=2,
                total_episodes=4,
                response_length=300,
                learning_rate=1e-3,
                num_ppo_epochs=1,
                sampler="loop",
                kl_coef=0.05,
            ),
            **options,
        }
    )
    # the tokenizer in memory: loaded back, a Qwen2 checkpoint's tokenizer gets a byte-level decoder
    return PPOTrainer(str(path), args=config, train_dataset=_dataset(), processing_class=tool_tokenizer(), **extra)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_tool_model(tmp_path_factory.mktemp("tool-model"))


def test_an_environment_trains_with_per_turn_rewards(model_path):
    seen = {}

    def answered(prompts, completions, environments, start, **_):
        seen.update(prompts=prompts, completions=completions, environments=environments, start=start)
        return [1.0 if c[-1]["content"] == "done" else 0.0 for c in completions]

    trainer = _trainer(model_path, environment_factory=Counter, reward_funcs=[answered])
    trainer.sampler = ScriptedSampler(trainer.tokenizer, [call_text("increment", {"step": 2}), "done"])
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    captured, update = {}, trainer._update

    def spy(exp, forward=None):
        captured["exp"] = exp
        return update(exp, forward)

    trainer._update = spy
    history = trainer.train()
    stats = history[0]
    # the turn's reward reaches GAE on the calling turn's last token (its eos), the score on the last model token
    exp = captured["exp"]
    placed = exp.outcome.rewards - exp.outcome.non_score_rewards
    first_eos = (exp.responses == trainer.tokenizer.eos_token_id).int().argmax(-1)
    assert torch.allclose(placed.gather(-1, first_eos[:, None]).squeeze(-1), torch.full((4,), 0.2))
    assert ((placed != 0).sum(-1) == 2).all()
    assert stats["tools/call_frequency"] == 1.0 and stats["tools/failure_frequency"] == 0.0
    assert stats["turns/per_rollout"] == 2.0 and stats["turns/reward_per_rollout"] == pytest.approx(0.2)
    assert stats["tokens/environment_per_rollout"] > 0 and stats["tokens/model_per_rollout"] > 0
    assert stats["rewards/Counter/mean"] == pytest.approx(sum([2, 2, 3, 3]) / 4)  # get_reward after the call
    assert stats["rewards/answered/mean"] == 1.0
    # reward functions get TRL's conversation: the prompt with reset's text, assistant tool calls, tool messages
    assert seen["prompts"][0][-1]["content"] == "Count 0. Start at 0."
    roles = [m["role"] for m in seen["completions"][0]]
    assert roles == ["assistant", "tool", "assistant"] and seen["completions"][0][0]["tool_calls"]
    assert seen["start"] == [0, 0, 1, 1] and len(seen["environments"]) == 4
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if isinstance(v, float))
    assert max((p - q).abs().max().item() for p, q in zip(trainer.policy.parameters(), before)) > 0


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_pp"])
@pytest.mark.parametrize("sampler", ["loop", "generate", "static"])  # static: eager on a CPU
def test_every_estimator_and_sampler_runs_multi_turn(model_path, estimator, sampler):
    _trains_two_turns(model_path, estimator, sampler)


@pytest.mark.needs_vllm
def test_multi_turn_runs_on_vllm(tmp_path):
    # vLLM's engine samples the model's second turn, after the tool's tokens: its own copy of the weights, synced
    _trains_two_turns(tiny_tool_model(tmp_path / "tool-model-vllm", hidden_size=64, heads=2), "gae", "vllm")


def _trains_two_turns(model_path, estimator, sampler):
    def length(completions, **_):
        return [float(len(c[-1]["content"])) for c in completions]

    trainer = _trainer(
        model_path,
        environment_factory=Counter,
        reward_funcs=[length],
        advantage_estimator=estimator,
        sampler=sampler,
        response_length=200,
        max_tool_calling_iterations=2,
    )
    assert type(trainer.sampler).__name__.lower().startswith(sampler)
    # the first turn calls the tool (a tiny random model writes no parseable call); the next is the engine's own
    scripted = ScriptedSampler(trainer.tokenizer, [call_text("increment", {"step": 1})], engine=trainer.sampler)
    trainer.sampler = scripted
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    stats = trainer.train()[0]
    assert len(scripted.engine_queries) == 1 and scripted.engine_queries[0][0] == 4  # every rollout, turn two
    assert stats["tools/call_frequency"] == 1.0 and stats["turns/per_rollout"] >= 2.0
    assert stats["val/response_length"] == pytest.approx(stats["tokens/model_per_rollout"])
    assert stats["tokens/model_per_rollout"] + stats["tokens/environment_per_rollout"] <= 200
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if isinstance(v, float))
    assert max((p - q).abs().max().item() for p, q in zip(trainer.policy.parameters(), before)) > 0


def test_an_environment_whose_reset_fails_names_the_row(model_path):
    class Broken(Counter):
        def reset(self, **row):
            if row["start"] == 1:
                raise KeyError("no such level")

    trainer = _trainer(model_path, environment_factory=Broken, reward_funcs=[lambda completions, **_: [0.0] * 4])
    with pytest.raises(InputError, match=r"Broken.reset failed on batch row 2 .*'start': 1.*no such level"):
        trainer.train()


def test_bad_arguments_are_one_clear_error(model_path):
    with pytest.raises(InputError, match="no reset"):
        _trainer(model_path, environment_factory=lambda: object(), reward_funcs=[lambda **_: []])
    with pytest.raises(InputError, match="two tools are named"):
        _trainer(model_path, tools=[multiply, multiply], reward_funcs=[lambda **_: []])
    with pytest.raises(InputError, match="score_position"):
        _trainer(model_path, tools=[multiply], reward_funcs=[lambda **_: []], score_position="after_last_token")
