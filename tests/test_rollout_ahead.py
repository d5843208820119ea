"""One step off-policy (``max_staleness=1``) on an engine with weights of its own, without vLLM: a copy of the
policy that samples with the loop and reports its log-probs, synced only when the trainer prepares it."""

import copy

import pytest
import torch

from trl_ext.errors import InputError
from trl_ext.ppo.core import logprobs_from_logits
from trl_ext.ppo.rollout.interface import Completions, Sampler
from trl_ext.ppo.rollout.loop import sample_responses
from trl_ext.ppo.trainer import PPOTrainer
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config


class CopyEngine(Sampler):
    """The policy's weights copied in at ``prepare``; ``generate`` samples from the copy (the vLLM engines' contract:
    the trained module is never read there)."""

    returns_logprobs = True
    holds_weights = True

    def __init__(self):
        self.copy, self.synced_versions, self.version = None, [], 0

    def policy_changed(self):
        self.version += 1

    def prepare(self, model, device, generator=None):
        if self.copy is None:
            self.copy = copy.deepcopy(model).eval()
        self.copy.load_state_dict(model.state_dict())
        self.synced_versions.append(self.version)

    def sample(self, model, query_ids, query_mask, options, generator=None):
        self.prepare(model, query_ids.device, generator)
        return self.generate(query_ids, query_mask, options, generator)

    @torch.no_grad()
    def generate(self, query_ids, query_mask, options, generator=None):
        ids = sample_responses(self.copy, query_ids, query_mask, options, generator)
        full = torch.cat([query_ids, ids], 1)
        mask = torch.cat([query_mask, torch.ones_like(ids)], 1)
        logits = self.copy(input_ids=full, attention_mask=mask).logits[:, query_ids.shape[1] - 1 : -1]
        return Completions(ids, logprobs_from_logits(logits.float(), ids, options.temperature))


@pytest.fixture()
def pieces(trained_artifacts):
    from trl_ext.tasks.doubling.artifacts import load_classifier, load_policy
    from trl_ext.tasks.doubling.rewards import doubling_classifier_reward
    from trl_ext.tasks.doubling.task import ppo_prompt_dataset

    policy, tok = load_policy(trained_artifacts["policy"])
    clf, clf_tok = load_classifier(trained_artifacts["reward"])
    return policy, tok, doubling_classifier_reward(clf, clf_tok), ppo_prompt_dataset(tok, 48, seed=0)


def _run(pieces, staleness: int, **options):
    policy, tok, reward, data = pieces
    cfg = doubling_ppo_config(
        skip_special_tokens=False,
        batch_size=16,
        total_episodes=48,
        num_ppo_epochs=1,
        learning_rate=3e-3,
        max_staleness=staleness,
        vllm_importance_sampling_correction=True,
        **options,
    )
    trainer = PPOTrainer(copy.deepcopy(policy), reward, args=cfg, train_dataset=data, processing_class=tok)
    trainer.sampler = engine = CopyEngine()  # looked up at each rollout, by the background one too
    return trainer, engine, trainer.train()


def _numbers(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if isinstance(v, float) and not k.startswith(("timing/", "eps"))}


@pytest.mark.filterwarnings("ignore:vllm_importance_sampling_correction needs")  # the trainer's own engine, replaced
def test_one_step_off_samples_from_the_weights_one_update_old(pieces, monkeypatch):
    """Update 1 is the on-policy one (its batch comes from the first weights either way), to 1e-6; from update 2
    on, the batch was sampled before the last update's step: the engine's log-probs are the old weights' (the gap
    the correction weighs is far above the float noise of update 1), and the engine was synced once an update,
    one version behind the trainer."""
    monkeypatch.setattr("trl_ext.ppo.rollout_ahead.check_staleness", lambda *a: None)
    monkeypatch.setattr("trl_ext.ppo.trainer.check_staleness", lambda *a: None)
    _, on_engine, on_policy = _run(pieces, 0)
    trainer, engine, off_policy = _run(pieces, 1)
    first_on, first_off = _numbers(on_policy[0]), _numbers(off_policy[0])
    assert first_on.keys() == first_off.keys()
    for key in first_on:
        assert abs(first_on[key] - first_off[key]) <= 1e-6 * max(1.0, abs(first_on[key])), key
    assert [h["sampling/staleness"] for h in off_policy] == [0, 1, 1]
    assert [h["sampling/staleness"] for h in on_policy] == [0, 0, 0]
    gaps_on = [h["sampling/sampling_logp_difference/max"] for h in on_policy]
    gaps_off = [h["sampling/sampling_logp_difference/max"] for h in off_policy]
    assert max(gaps_on) <= 1e-5 and gaps_off[0] <= 1e-5, (gaps_on, gaps_off)
    assert min(gaps_off[1:]) > 1e-3, gaps_off  # lr 3e-3 moves the log-probs by far more than float noise
    # versions count optimizer steps. On-policy, each rollout syncs the weights of the update before it; one step
    # off, batch 2 is started from the first weights (synced twice: rollout 1, then before batch 2 starts), batch 3
    # from those after update 1, and batch 3's rollout ran during update 2
    steps = on_engine.synced_versions[1]
    assert steps > 0 and on_engine.synced_versions == [0, steps, 2 * steps]
    assert engine.synced_versions == [0, 0, steps]
    assert not trainer.ahead.pending  # no rollout left in flight after the last update


def test_one_step_off_needs_an_engine_with_weights_of_its_own(pieces):
    policy, tok, reward, data = pieces
    cfg = doubling_ppo_config(max_staleness=1, sampler="loop", batch_size=16, total_episodes=16)
    with pytest.raises(InputError, match="max_staleness 1 needs an engine with weights of its own"):
        PPOTrainer(policy, reward, args=cfg, train_dataset=data, processing_class=tok)
    with pytest.raises(InputError, match="max_staleness must be 0"):
        doubling_ppo_config(max_staleness=2)


def test_one_step_off_refuses_environments():
    """The next batch would reset the environments this batch's rewards still read: refused in one line (tools,
    which hold no state between batches, are not)."""
    from trl_ext.ppo.rollout_ahead import check_staleness

    with pytest.raises(InputError, match="max_staleness 1 does not take an environment_factory"):
        check_staleness(1, CopyEngine(), None, environment_factory=object)
    check_staleness(1, CopyEngine(), None)  # an engine with weights of its own, no environments: fine
    check_staleness(0, Sampler(), None, environment_factory=object)  # on-policy: anything goes
