"""Bad input to the library's trainer and reward adapters: one error naming the problem when the trainer is built,
not a traceback from deep inside the first update."""

import copy

import pytest
from datasets import Dataset
from tiny_models import tiny_deberta_reward, tiny_qwen2

from trl_ext.errors import InputError
from trl_ext.ppo import PPOConfig, PPOTrainer
from trl_ext.rewards import ClassifierReward
from trl_ext.rewards.base import RewardError

ARGS = dict(batch_size=2, total_episodes=2, response_length=3, num_ppo_epochs=1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer-inputs")
    return {"policy": tiny_qwen2(root / "policy"), "reward": tiny_deberta_reward(root / "reward")}


def _prompts() -> Dataset:
    return Dataset.from_dict({"prompt": ["hello there", "what is up"]})


def zero(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.trl_api  # TRL's own configs
def test_trls_own_config_as_args_is_named(folders):
    import trl

    on_cpu = dict(output_dir="unused", use_cpu=True, bf16=False)
    for trl_config in (trl.GRPOConfig(**on_cpu), trl.RLOOConfig(**on_cpu)):
        name = type(trl_config).__name__
        with pytest.raises(InputError, match=f"args must be a trl_ext.ppo.PPOConfig, got trl's {name}: build"):
            PPOTrainer(str(folders["policy"]), zero, args=trl_config)
    with pytest.raises(InputError, match="args must be a trl_ext.ppo.PPOConfig, got builtins's dict"):
        PPOTrainer(str(folders["policy"]), zero, args={"batch_size": 2})


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_group_estimator_with_one_completion_a_prompt_is_refused(folders, estimator):
    """Every advantage would be 0 (each group one completion): the run would train nothing, silently."""
    args = PPOConfig(advantage_estimator=estimator, **ARGS)
    with pytest.raises(InputError, match=f"{estimator!r} compares the completions of one prompt.*got 1"):
        PPOTrainer(str(folders["policy"]), zero, args=args)
    PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(advantage_estimator=estimator, num_generations=2, **ARGS))
    PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(advantage_estimator="reinforce_pp", **ARGS))  # batch-wide


def test_a_reward_function_without_kwargs_is_refused_when_the_trainer_is_built(folders):
    def positional(completions):
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"'positional' takes \(completions\).*def positional\(completions, \*\*kw"):
        PPOTrainer(str(folders["policy"]), positional, args=PPOConfig(**ARGS))
    with pytest.raises(RewardError, match=r"'<lambda>' takes \(prompts, completions\)"):
        PPOTrainer(str(folders["policy"]), [zero, lambda prompts, completions: []], args=PPOConfig(**ARGS))


def test_a_reward_model_object_scores_as_its_folder_does(folders):
    """TRL's GRPO takes a sequence classifier object in reward_funcs: so does trl-ext, with the tokenizer saved
    beside it; one built from a config alone has none to read, and says so."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folders["reward"])
    trainer = PPOTrainer(str(folders["policy"]), model, args=PPOConfig(**ARGS), train_dataset=_prompts())
    (reward,) = trainer.reward_funcs
    assert isinstance(reward, ClassifierReward) and reward.model is model and reward.__name__ == "reward"
    by_folder = ClassifierReward.from_pretrained(folders["reward"])
    prompts, completions = ["hello there", "what is up"], ["a b", "c"]
    assert reward(prompts, completions) == pytest.approx(by_folder(prompts, completions), abs=1e-6)
    config = copy.deepcopy(model.config)
    config.name_or_path = ""  # built from a config, never saved
    unsaved = type(model)(config)
    with pytest.raises(InputError, match="DebertaV2ForSequenceClassification object with no folder to read its tok"):
        PPOTrainer(str(folders["policy"]), unsaved, args=PPOConfig(**ARGS))


def test_a_classifier_given_a_tokenizer_without_pad_pads_with_eos(folders):
    """The rule a reward model loaded from a path gets (pad = eos), for one built by hand."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["reward"])
    tokenizer.eos_token, tokenizer.pad_token = tokenizer.pad_token, None
    model = AutoModelForSequenceClassification.from_pretrained(folders["reward"])
    model.config.pad_token_id = None
    reward = ClassifierReward(model, tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token and model.config.pad_token_id == tokenizer.eos_token_id
    assert len(reward(["hello there", "a"], ["b c d", "e"])) == 2  # padded: a batch of two lengths
    tokenizer.eos_token, tokenizer.pad_token = None, None
    with pytest.raises(RewardError, match="given to ClassifierReward has no pad token and no eos token to pad with"):
        ClassifierReward(model, tokenizer)


@pytest.mark.parametrize(
    "given, hint",
    [
        ([{"prompt": "hello there"}], r"not list: Dataset.from_list\(rows\)"),
        ({"prompt": ["hello there"]}, r"not dict: Dataset.from_dict\(columns\)"),
        ("DatasetDict", r"not DatasetDict: one of its splits, e.g. dataset\['train'\]"),
        ("IterableDataset", "not IterableDataset: load it without streaming=True"),
    ],
)
def test_a_train_dataset_that_is_not_a_dataset_says_how_to_make_one(folders, given, hint):
    from datasets import DatasetDict

    if given == "DatasetDict":
        given = DatasetDict({"train": _prompts()})
    elif given == "IterableDataset":
        given = _prompts().to_iterable_dataset()
    with pytest.raises(InputError, match="train_dataset must be a datasets.Dataset, " + hint):
        PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS), train_dataset=given)


def test_a_prompt_and_response_past_the_models_positions_are_refused_before_any_forward_pass(folders):
    """The tiny Qwen2 has 512 positions: a 500-token prompt with 20 tokens to answer is named when the trainer is
    built, and in a batch given to train_step; 492 tokens fit exactly."""
    from trl_ext.data.prompt_dataset import DatasetError

    args = PPOConfig(**{**ARGS, "response_length": 20})
    long = Dataset.from_dict({"prompt": ["a" * 500, "b"]})
    with pytest.raises(DatasetError, match="train_dataset: a prompt of 500 tokens and response_length 20 need 520 pos"):
        PPOTrainer(str(folders["policy"]), zero, args=args, train_dataset=long)
    trainer = PPOTrainer(
        str(folders["policy"]), zero, args=args, train_dataset=Dataset.from_dict({"prompt": ["a" * 492]})
    )
    ids = trainer.tokenizer("a" * 501)["input_ids"]
    with pytest.raises(DatasetError, match="a batch's prompts: a prompt of 501 tokens .* the model has 512"):
        trainer.train_step({"input_ids": [ids, ids[:3]]})


def test_config_values_of_another_type_are_named():
    """What a dict read from YAML holds: PyYAML reads 1e-5 as text."""
    with pytest.raises(InputError, match=r"learning_rate is '1e-5' \(str\), not float: YAML reads .* write 1.0e-5"):
        PPOConfig(learning_rate="1e-5")
    with pytest.raises(InputError, match=r"batch_size is 8.0 \(float\), not int"):
        PPOConfig(batch_size=8.0)
    with pytest.raises(InputError, match=r"gradient_checkpointing is 'yes' \(str\), not bool"):
        PPOConfig(gradient_checkpointing="yes")
    PPOConfig(learning_rate=1, kl_coef=0, total_episodes=16)  # an int is a float's value


def test_a_reference_given_as_a_folder_loads_and_one_of_another_vocabulary_is_refused(folders, tmp_path):
    """TRL 1.12's PPOTrainer takes ``ref_model``; a folder loads as the policy's path does. A reference whose output
    vocabulary is not the policy's would score other tokens (or fail on the shapes): named at once."""
    from trl_ext.models.digest import weights_digest

    trainer = PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS), ref_model=str(folders["policy"]))
    assert weights_digest(trainer.ref_policy.state_dict().values()) == weights_digest(
        trainer.policy.state_dict().values()
    )
    assert not any(p.requires_grad for p in trainer.ref_policy.parameters())
    wider = tiny_qwen2(tmp_path / "wider", vocab_size=256)
    with pytest.raises(InputError, match="ref_model's output vocabulary has 256 rows and the policy's"):
        PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS), ref_model=str(wider))
    with pytest.raises(InputError, match="ref_model must be a causal LM .* got int"):
        PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS), ref_model=3)


def test_arguments_of_another_shape_are_named(folders):
    """A dict for peft_config, one tool not in a list, text to generate(), a tracker that is not installed
    (accelerate would drop it, saying so only at debug level)."""
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    from trl_ext.ppo.config_checks import trackers

    with pytest.raises(InputError, match=r"peft_config must be a peft config .* got dict: peft.LoraConfig\(\*\*peft"):
        PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS), peft_config={"r": 8})

    def lookup(name: str) -> str:
        """Look a name up.

        Args:
            name: the name.
        """
        return name

    with pytest.raises(InputError, match=r"tools must be a list of functions, got function: tools=\[<function"):
        PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS), tools=lookup)
    trainer = PPOTrainer(str(folders["policy"]), zero, args=PPOConfig(**ARGS))
    with pytest.raises(InputError, match=r"row 0: \['h', 'e', .* is text: .*tokenizer\(text\)\['input_ids'\]"):
        trainer.generate(["hello there"])
    assert len(trainer.generate([trainer.tokenizer("hello there")["input_ids"]])) == 1
    available = {t.value for t in get_available_trackers()}
    missing = next(t.value for t in LoggerType if t.value != "all" and t.value not in available)
    with pytest.raises(InputError, match=f"report_to names {missing}, not installed here: pip install {missing}"):
        trackers(missing)
