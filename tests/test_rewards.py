import math
import pickle

import pytest
import torch

from trl_ext.rewards import ClassifierReward, Clipped, RewardError, WeightedSum, call_reward
from trl_ext.tasks.doubling.rewards import CharsetCompliance, ExactMatch, ValueCorrect, doubling_classifier_reward

pytestmark = pytest.mark.trl_api  # exercises TRL's API: run on every TRL line (scripts/test.sh)

PROMPTS = ["S数字:3320x2="] * 5 + ["S大写:3164x2="]
COMPLETIONS = ["6640E", "六六四〇E", "6641E", "x=E", "E", "陆叁贰捌E"]


def test_rule_rewards_exact_values():
    assert ValueCorrect()(PROMPTS, COMPLETIONS) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert CharsetCompliance()(PROMPTS, COMPLETIONS) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert ExactMatch()(PROMPTS, COMPLETIONS) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # columns, when given, win over what the prompt says
    assert ExactMatch()(PROMPTS[:1], ["六六四〇E"], label=[1], question=[3320]) == [1.0]
    assert ExactMatch.__name__ != "" and ExactMatch().__name__ == "doubling_exact"


def test_weighted_sum_leaves_out_none_as_grpo_does():
    def only_digits(prompts, completions, **kw):
        return [1.0 if p.startswith("S数字") else None for p in prompts]

    def never(prompts, completions, **kw):
        return [None] * len(prompts)

    mixed = WeightedSum([only_digits, ValueCorrect()], [2.0, 1.0])
    assert mixed(PROMPTS, COMPLETIONS) == [3.0, 3.0, 2.0, 2.0, 2.0, 1.0]
    with pytest.raises(RewardError, match=r"every reward function \(never\) returned None for row 0"):
        WeightedSum([never])(PROMPTS, COMPLETIONS)
    with pytest.raises(RewardError, match="non-number None at index 0"):
        call_reward(never, PROMPTS, COMPLETIONS)  # None is an error unless the caller allows it


def test_reward_functions_are_called_by_keyword_like_grpo():
    def accuracy(completions, solution, **kwargs):  # trl.rewards style: no `prompts` parameter
        return [float(c == s) for c, s in zip(completions, solution)]

    assert call_reward(accuracy, ["p", "q"], ["a", "b"], solution=["a", "c"]) == [1.0, 0.0]


def test_combinators():
    both = WeightedSum([ValueCorrect(), CharsetCompliance()], [1.0, 2.0])
    assert both(PROMPTS, COMPLETIONS) == [3.0, 1.0, 2.0, 0.0, 0.0, 3.0]
    assert Clipped(both, 0.5, 2.0)(PROMPTS, COMPLETIONS) == [2.0, 1.0, 2.0, 0.5, 0.5, 2.0]


def test_clipped_passes_none_through():
    def only_digits(prompts, completions, **kw):
        return [3.0 if p.startswith("S数字") else None for p in prompts]

    def never(prompts, completions, **kw):
        return [None] * len(prompts)

    def not_a_number(prompts, completions, **kw):
        return [float("nan")] * len(prompts)

    assert Clipped(only_digits, 0.0, 2.0)(PROMPTS, COMPLETIONS) == [2.0] * 5 + [None]
    # inside a sum, the None is left out of its row (GRPO's rule); a row no function scores is still an error
    assert WeightedSum([Clipped(only_digits, 0.0, 2.0), ValueCorrect()])(PROMPTS, COMPLETIONS) == [
        3.0,
        3.0,
        2.0,
        2.0,
        2.0,
        1.0,
    ]
    with pytest.raises(RewardError, match=r"every reward function \(clipped_never\) returned None for row 0"):
        WeightedSum([Clipped(never, 0.0, 1.0)])(PROMPTS, COMPLETIONS)
    with pytest.raises(
        RewardError, match="reward 'not_a_number' returned nan at index 0"
    ):  # the rest checked as before
        Clipped(not_a_number, 0.0, 1.0)(PROMPTS, COMPLETIONS)


def test_rewards_pickle_round_trip(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier

    model, tok = load_classifier(trained_artifacts["reward"])
    for fn in [
        ValueCorrect(),
        WeightedSum([ExactMatch(), CharsetCompliance()]),
        doubling_classifier_reward(model, tok),
    ]:
        again = pickle.loads(pickle.dumps(fn))
        assert again.__name__ == fn.__name__
        assert again(PROMPTS, COMPLETIONS) == pytest.approx(fn(PROMPTS, COMPLETIONS))


def test_classifier_reward_rewards_the_requested_set(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier

    model, tok = load_classifier(trained_artifacts["reward"])
    reward = doubling_classifier_reward(model, tok)
    scores = reward(PROMPTS, COMPLETIONS)  # the requested set's probability
    assert scores[0] > 0.9 and scores[5] > 0.9  # right set
    assert scores[1] < 0.1  # lower-case answer to a digits prompt
    by_column = doubling_classifier_reward(model, tok, label_column="label")(PROMPTS, COMPLETIONS, label=[0] * 5 + [2])
    assert by_column == pytest.approx(scores, abs=1e-6)
    logits = doubling_classifier_reward(model, tok, label_score="logit")(PROMPTS, COMPLETIONS)  # seed 000's
    assert logits[0] > logits[1] + 1.0 and logits[5] > 1.0  # a wrong set's logit has no fixed sign
    with pytest.raises(RewardError, match="label_score must be one of logit, probability, got 'odds'"):
        doubling_classifier_reward(model, tok, label_score="odds")


def _reward_through_trl(reward_fn, tokenizer, dataset, completions, skip_special_tokens=False):
    from trl.experimental.utils import get_reward

    from trl_ext.data.batching import pad_batch
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    queries, _ = pad_batch(dataset["input_ids"], tokenizer.pad_token_id, side="left")
    responses, _ = pad_batch(
        [tokenizer(c, add_special_tokens=False)["input_ids"] for c in completions], tokenizer.pad_token_id, side="right"
    )
    module = as_ppo_reward_model(reward_fn, tokenizer, dataset, skip_special_tokens)
    from trl.trainer.utils import disable_dropout_in_model

    disable_dropout_in_model(module)
    module = module.to("cpu")
    _, score, _ = get_reward(module, torch.cat([queries, responses], 1), tokenizer.pad_token_id, queries.shape[1])
    return score.tolist()


@pytest.mark.needs_trl_ppo
def test_same_reward_through_trl_get_reward(trained_artifacts, tokenizer):
    from trl_ext.tasks.doubling.artifacts import load_classifier
    from trl_ext.tasks.doubling.task import Sample, prompt_dataset

    model, tok = load_classifier(trained_artifacts["reward"])
    samples = [Sample(3320, 0, True)] * 5 + [Sample(3164, 2, True), Sample(10, 1, True)]
    dataset = prompt_dataset(tokenizer, samples)  # prompts of two lengths: left padding differs per row
    completions = COMPLETIONS + ["二〇E"]
    for reward in (doubling_classifier_reward(model, tok), doubling_classifier_reward(model, tok, "label")):
        direct = reward(dataset["prompt"], completions, label=dataset["label"])
        via_trl = _reward_through_trl(reward, tokenizer, dataset, completions)
        assert via_trl == pytest.approx(direct, abs=1e-5)


@pytest.mark.parametrize("skip_special_tokens, seen", [(True, "6640"), (False, "6640E")])
def test_ppo_adapter_decodes_completions_as_the_scratch_trainer_is_told(tokenizer, skip_special_tokens, seen):
    """The eos E reaches the reward function only where skip_special_tokens is False, as in our trainer."""
    from trl_ext.tasks.doubling.task import Sample, prompt_dataset
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    received = []

    def record(prompts, completions, **_):
        received.extend(completions)
        return [0.0] * len(completions)

    dataset = prompt_dataset(tokenizer, [Sample(3320, 0, True)])
    module = as_ppo_reward_model(record, tokenizer, dataset, skip_special_tokens)
    ids = torch.tensor([dataset["input_ids"][0] + tokenizer("6640E", add_special_tokens=False)["input_ids"]])
    module.reward_backbone(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert received == [seen]


def test_ppo_adapter_rejects_unknown_prompt(tokenizer):
    from trl_ext.tasks.doubling.task import Sample, prompt_dataset
    from trl_ext.trl_compat.reward_model import as_ppo_reward_model

    module = as_ppo_reward_model(ExactMatch(), tokenizer, prompt_dataset(tokenizer, [Sample(3320, 0, True)]))
    ids = torch.tensor([tokenizer("S小写:1111x2=2222E", add_special_tokens=False)["input_ids"]])
    with pytest.raises(RewardError, match="does not start with any prompt"):
        module.reward_backbone(input_ids=ids, attention_mask=torch.ones_like(ids))


def _tiny_classifier(kind, num_labels, vocab_size):
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        DebertaV2Config,
        DebertaV2ForSequenceClassification,
    )

    torch.manual_seed(0)
    if kind == "bert":
        cfg = BertConfig(
            vocab_size=vocab_size,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            num_labels=num_labels,
        )
        return BertForSequenceClassification(cfg)
    cfg = DebertaV2Config(
        vocab_size=vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        num_labels=num_labels,
        type_vocab_size=0,
        max_position_embeddings=64,
    )
    return DebertaV2ForSequenceClassification(cfg)


@pytest.mark.parametrize("kind", ["bert", "deberta"])
def test_pair_mode_with_tiny_random_classifiers(kind):
    from tiny_models import word_tokenizer

    tok = word_tokenizer()
    model = _tiny_classifier(kind, 1, len(tok))
    reward = ClassifierReward(model, tok, pair=True, batch_size=2)
    prompts, completions = ["what is up", "hello", "abc"], ["the sky", "hi there friend", "d"]
    scores = reward(prompts, completions)
    assert len(scores) == 3 and all(math.isfinite(s) for s in scores)
    # batched scoring equals one-at-a-time scoring (padding does not leak into the score)
    singles = [reward([p], [c])[0] for p, c in zip(prompts, completions)]
    assert scores == pytest.approx(singles, abs=1e-5)
    model.eval()
    enc = tok(prompts[1], completions[1], return_tensors="pt")
    if kind == "deberta":
        enc.pop("token_type_ids", None)
    with torch.no_grad():
        assert scores[1] == pytest.approx(model(**enc).logits[0, 0].item(), abs=1e-5)


def test_grpo_step_with_classifier_reward(trained_artifacts, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.tasks.doubling.artifacts import load_classifier, load_policy
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok = load_policy(trained_artifacts["policy"])
    clf, clf_tok = load_classifier(trained_artifacts["reward"])
    reward = doubling_classifier_reward(clf, clf_tok)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    data = ppo_prompt_dataset(tok, 16, seed=0).select_columns(["prompt", "label"])
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(math.isfinite(h["reward"]) for h in logged)
    assert any(not torch.equal(before[n], p) for n, p in policy.named_parameters())


@pytest.mark.parametrize(
    "returned, message",
    [
        ([1.0], r"returned 1 values for 2 completions"),
        ([1.0, float("nan")], r"'bad' returned nan at index 1"),
        ([float("inf"), 1.0], r"returned inf at index 0"),
        (["a", 1.0], r"non-number 'a' at index 0"),
        ("x", r"returned a str"),
    ],
)
def test_bad_reward_outputs_are_named(returned, message):
    def bad(prompts, completions, **kw):
        return returned

    with pytest.raises(RewardError, match=message):
        call_reward(bad, ["a", "b"], ["c", "d"])


def test_bad_reward_inputs(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier

    model, tok = load_classifier(trained_artifacts["reward"])
    with pytest.raises(RewardError, match="column 'label'"):
        ClassifierReward(model, tok, label_column="label")(["S数字:3320x2="], ["6640E"])
    with pytest.raises(RewardError, match="1 prompts but 2 completions"):
        ValueCorrect()(["S数字:3320x2="], ["6640E", "1E"])
    with pytest.raises(RewardError, match="needs label_column or label_fn"):
        ClassifierReward(model, tok)
    with pytest.raises(
        RewardError, match=r"label 7 \(int\) at index 0 is not a class of this 4-label classifier \(an int in 0..3\)"
    ):
        ClassifierReward(model, tok, label_column="label")(["S数字:3320x2="], ["6640E"], label=[7])
    # numpy's integers are classes (a label column read through numpy gives them); a bool is not: True is no class
    import numpy as np

    by_int = ClassifierReward(model, tok, label_column="label")(["S数字:3320x2="], ["6640E"], label=[1])
    by_numpy = ClassifierReward(model, tok, label_column="label")(["S数字:3320x2="], ["6640E"], label=[np.int64(1)])
    assert by_numpy == by_int
    with pytest.raises(RewardError, match=r"label True \(bool\) at index 0 is not a class"):
        ClassifierReward(model, tok, label_fn=lambda prompt: True)(["S数字:3320x2="], ["6640E"])
    with pytest.raises(RewardError, match=r"WeightedSum's weights must be numbers, got \['1', 2\]"):
        WeightedSum([ValueCorrect(), CharsetCompliance()], ["1", 2])


def test_a_reward_function_declares_that_it_may_not_apply():
    """``allow_none = True`` lets a RewardFunction return None ("does not apply"); otherwise None is an error."""
    from trl_ext.rewards import RewardFunction

    class DigitsOnly(RewardFunction):
        allow_none = True

        def score(self, prompts, completions, **columns):
            return [1.0 if p.startswith("S数字") else None for p in prompts]

    class Strict(DigitsOnly):
        allow_none = False

    assert DigitsOnly()(PROMPTS, COMPLETIONS) == [1.0] * 5 + [None]
    with pytest.raises(RewardError, match="non-number None at index 5"):
        Strict()(PROMPTS, COMPLETIONS)
    assert WeightedSum([DigitsOnly(), ValueCorrect()])(PROMPTS, COMPLETIONS) == [2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
