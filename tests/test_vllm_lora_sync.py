"""LoRA adapters sent alone to the colocated vLLM engine (``vllm_lora_sync``, ``trl_ext/ppo/rollout/lora_sync.py``).

The unmarked tests (which adapters are refused, what a version folder holds) need no vLLM. The ``needs_vllm`` ones
run in ``.venv-vllm``: an adapter-synced engine and a merged-synced engine sample the same tokens with the same
log-probs (float32, <= 1e-5) before and after an update that moved the adapter; the same through a real server
started with ``--enable-lora`` (``LocalServer(max_lora_rank=8)``, 20-35 s to start); one step off-policy on both; the
bytes and seconds of each sync are printed (``-s``) and the adapter's bytes are a small share of the merged model's.
"""

import copy
import math
import warnings

import pytest
import torch
from test_vllm_sampler import PROMPTS, TEMPERATURE, TOLERANCE, _gap, _gpt2, _lora, _options, _prompts, _tokenizer

from trl_ext.errors import InputError
from trl_ext.ppo.config import PPOConfig
from trl_ext.ppo.rollout.lora_sync import AdapterVersions, adapter_refusal, resolve_lora_sync

needs_vllm = pytest.mark.needs_vllm


def _qwen2(tok):
    """A Qwen2 of two heads of 32 (vLLM's CPU attention runs them; its Qwen2 takes LoRA)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.05,  # logits of a few units: fp32 noise stays near 1e-6
    )
    return Qwen2ForCausalLM(cfg).eval()


def _qwen2_lora(model, **kw):
    from peft import LoraConfig, get_peft_model

    kw.setdefault("target_modules", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", **kw))
    _move_adapter(peft_model, seed=1)
    return peft_model.eval()


def _move_adapter(peft_model, seed: int) -> None:
    """An update's worth of change to every LoRA weight (lora_B starts at zero: the adapter would do nothing)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.05)


# ---------------------------------------------------------------------- without vLLM


def test_what_vllm_cannot_serve_is_refused_or_routed_in_one_line():
    tok = _tokenizer()
    plain = _qwen2_lora(_qwen2(tok))
    assert adapter_refusal(plain) is None
    assert resolve_lora_sync("auto", plain, None) == "adapter"
    assert resolve_lora_sync("merged", plain, None) == "merged"
    assert resolve_lora_sync("auto", _qwen2(tok), "anything") == "merged"  # no adapter: nothing to choose

    saved = _qwen2_lora(_qwen2(tok), modules_to_save=["lm_head"])
    reason = adapter_refusal(saved)
    assert reason is not None and "modules_to_save ['lm_head']" in reason
    with pytest.raises(InputError, match=r"vllm_lora_sync='adapter'.*modules_to_save"):
        resolve_lora_sync("adapter", saved, reason)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_lora_sync("auto", saved, reason) == "merged"
    assert len(caught) == 1 and "merged model is sent" in str(caught[0].message)

    assert "rank 8 above the engine's max_lora_rank 4" in adapter_refusal(plain, max_lora_rank=4)
    assert "DoRA" in adapter_refusal(_qwen2_lora(_qwen2(tok), use_dora=True))
    assert "embedding" in adapter_refusal(_qwen2_lora(_qwen2(tok), target_modules=["embed_tokens"]))


def test_an_adapter_version_is_what_peft_saves_and_loads(tmp_path):
    from peft import PeftModel

    tok = _tokenizer()
    peft_model = _qwen2_lora(_qwen2(tok))
    versions = AdapterVersions(str(tmp_path))
    folders = [versions.save(peft_model) for _ in range(3)]
    assert [f.name for f in folders] == ["v1", "v2", "v3"] and not folders[0].exists()  # two kept at most
    assert versions.last_bytes == sum(f.stat().st_size for f in folders[-1].iterdir())
    loaded = PeftModel.from_pretrained(_qwen2(tok), str(folders[-1]))
    ids = torch.tensor([[3, 4, 5, 6]])
    assert torch.allclose(loaded(ids).logits, peft_model(ids).logits, atol=1e-6)
    merged_bytes = sum(t.numel() * t.element_size() for t in peft_model.merge_and_unload().state_dict().values())
    assert versions.last_bytes < 0.25 * merged_bytes  # a tiny model: the adapter is a fair share of it


# ---------------------------------------------------------------------- on vLLM's CPU build


def _engine(sync: str):
    from trl_ext.ppo.rollout.vllm_sampler import VLLMSampler

    return VLLMSampler(PPOConfig(sampler="vllm", temperature=TEMPERATURE, vllm_lora_sync=sync))


@pytest.fixture(scope="module")
def engines():
    return {"adapter": _engine("adapter"), "merged": _engine("merged")}


@needs_vllm
def test_adapter_sync_samples_as_the_merged_sync_before_and_after_an_update(engines):
    tok = _tokenizer()
    peft_model = _qwen2_lora(_qwen2(tok))
    query_ids, query_mask = _prompts(tok, PROMPTS * 2)
    options = _options(tok)

    def both(seed):
        outs = {}
        for name, engine in engines.items():
            engine.policy_changed()
            outs[name] = engine.sample(peft_model, query_ids, query_mask, options, torch.Generator().manual_seed(seed))
        adapter, merged = outs["adapter"], outs["merged"]
        assert torch.equal(adapter.ids, merged.ids)
        assert (adapter.logprobs - merged.logprobs).abs().max().item() <= TOLERANCE
        assert _gap(peft_model, query_ids, query_mask, adapter, tok) <= TOLERANCE
        return adapter

    both(0)
    assert engines["adapter"].lora_sync == "adapter" and engines["merged"].lora_sync == "merged"
    base_bytes = engines["adapter"].stats["last_sync_bytes"]  # the first sync: the base and the adapter
    before = copy.deepcopy(peft_model)
    _move_adapter(peft_model, seed=2)  # the update
    out = both(1)
    assert _gap(before, query_ids, query_mask, out, tok) > 100 * TOLERANCE  # the new adapter version is in use
    adapter, merged = (engines[k].stats for k in ("adapter", "merged"))
    print(
        f"\ntiny Qwen2: adapter sync {adapter['last_sync_bytes']:,} B in {adapter['last_sync_seconds']:.4f} s "
        f"(first sync, base included: {base_bytes:,} B); merged sync {merged['last_sync_bytes']:,} B in "
        f"{merged['last_sync_seconds']:.4f} s"
    )
    assert 0 < adapter["last_sync_bytes"] < 0.25 * merged["last_sync_bytes"]
    assert engines["adapter"].llm.llm_engine.list_loras() == {engines["adapter"]._adapters.version}
    default = _engine(PPOConfig.vllm_lora_sync)
    default.sample(peft_model, query_ids, query_mask, options)
    assert default.lora_sync == "merged"  # on CPU vLLM's LoRA kernels cost rollouts more than the sync saves
    auto = _engine("auto")
    auto.sample(peft_model, query_ids, query_mask, options)
    assert auto.lora_sync == "adapter"  # where vLLM's LoRA serves the adapter


@needs_vllm
def test_an_architecture_without_vllm_lora_is_refused_before_the_engine_starts():
    tok = _tokenizer()
    engine = _engine("adapter")
    query_ids, query_mask = _prompts(tok, PROMPTS)
    with pytest.raises(InputError, match="vLLM's GPT2LMHeadModel takes no LoRA adapters"):
        engine.sample(_lora(_gpt2(tok)), query_ids, query_mask, _options(tok))
    assert engine.llm is None


@needs_vllm
def test_one_step_off_policy_with_adapter_sync(engines):
    """max_staleness 1 in the trainer with a LoRA policy on the adapter-synced engine: the first batch on-policy,
    the later ones one adapter version old, losses finite."""
    from datasets import Dataset
    from peft import LoraConfig

    from trl_ext.ppo.trainer import PPOTrainer

    tok = _tokenizer()
    data = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in PROMPTS * 6]})
    cfg = PPOConfig(
        sampler="vllm",
        vllm_lora_sync="adapter",
        max_staleness=1,
        learning_rate=3e-2,
        batch_size=8,
        total_episodes=24,
        response_length=8,
        temperature=TEMPERATURE,
        num_ppo_epochs=1,
        seed=0,
    )
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = PPOTrainer(
        _qwen2(tok),
        _length_reward,
        args=cfg,
        train_dataset=data,
        processing_class=tok,
        peft_config=lora,
    )
    trainer.sampler = engines["adapter"]  # this module's engine: one start
    history = trainer.train()
    gaps = [h["sampling/sampling_logp_difference/max"] for h in history]
    assert [h["sampling/staleness"] for h in history] == [0, 1, 1]
    assert gaps[0] <= TOLERANCE and min(gaps[1:]) > 100 * TOLERANCE, gaps
    assert all(math.isfinite(h["loss/policy_avg"]) for h in history)
    assert engines["adapter"].lora_sync == "adapter" and engines["adapter"].stats["syncs"] >= 3


# ---------------------------------------------------------------------- on a vLLM server (--enable-lora)


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    from trl_ext.ppo.rollout.local_server import LocalServer

    tok = _tokenizer()
    root = tmp_path_factory.mktemp("vllm-lora-server")
    _qwen2(tok).save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    server = LocalServer(
        root / "policy", root / "server.log", dtype="float32", max_model_len=128, start_timeout=300, max_lora_rank=8
    )
    yield root / "policy", server
    server.stop()


def _server_run(model_dir, url, sync: str, r: int = 8, **options):
    """Three PPO updates of a LoRA policy, every rollout on the server; each update's gap and the sync stats."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_ext.ppo.trainer import PPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = PPOConfig(
        sampler="vllm",
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_lora_sync=sync,
        dtype="float32",
        learning_rate=3e-2,
        batch_size=8,
        total_episodes=24,
        response_length=8,
        temperature=TEMPERATURE,
        num_ppo_epochs=1,
        seed=0,
        **options,
    )
    data = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in PROMPTS * 6]})
    lora = LoraConfig(r=r, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = PPOTrainer(
        str(model_dir), _length_reward, args=cfg, train_dataset=data, processing_class=tok, peft_config=lora
    )
    sizes = []
    history = trainer.train(lambda update, stats: sizes.append(trainer.sampler.stats["last_sync_bytes"]))
    gaps = [h["sampling/sampling_logp_difference/max"] for h in history]
    lora_b = max(p.abs().max().item() for n, p in trainer.policy.named_parameters() if "lora_B" in n)
    assert lora_b > 1e-2  # the adapter moved away from its zero start: a stale one would show in the gaps
    return trainer.sampler, gaps, sizes


def _length_reward(completions, **kwargs):
    return [len(c) / 8 for c in completions]


@needs_vllm
def test_adapter_sync_on_a_server_matches_the_merged_sync(lora_server):
    """Through a real server started with --enable-lora: every update's sampled log-probs equal the trainer's
    (<= 1e-5) with the adapter sent alone, as with the merged model sent; the adapter's bytes are a small share;
    one step off-policy runs on adapters too."""
    model_dir, server = lora_server
    adapter, adapter_gaps, adapter_bytes = _server_run(model_dir, server.url, "adapter")
    served = {m["id"] for m in adapter.client.get("/v1/models")["data"]}
    assert "policy-v3" in served and "policy-v2" not in served  # the last version loaded, the one before unloaded
    adapter_seconds = adapter.stats["last_sync_seconds"]
    merged, merged_gaps, merged_bytes = _server_run(model_dir, server.url, "merged")
    assert adapter.lora_sync == "adapter" and merged.lora_sync == "merged"
    assert max(adapter_gaps) <= TOLERANCE and max(merged_gaps) <= TOLERANCE, (adapter_gaps, merged_gaps)
    print(
        f"\nserver, tiny Qwen2: adapter syncs {adapter_bytes} B (the first with the base), "
        f"the last in {adapter_seconds:.4f} s; merged syncs {merged_bytes} B, the last in "
        f"{merged.stats['last_sync_seconds']:.4f} s"
    )
    assert 0 < adapter_bytes[-1] < 0.25 * merged_bytes[-1]
    _, off_gaps, _ = _server_run(model_dir, server.url, "adapter", max_staleness=1)
    assert off_gaps[0] <= TOLERANCE and min(off_gaps[1:]) > 100 * TOLERANCE, off_gaps
    auto, _, _ = _server_run(model_dir, server.url, "auto")
    assert auto.lora_sync == "adapter"  # a server started with --enable-lora serves it


@needs_vllm
def test_a_rank_above_the_servers_max_lora_rank_is_refused(lora_server):
    model_dir, server = lora_server
    with pytest.raises(InputError, match="rank 16 above the engine's max_lora_rank 8"):
        _server_run(model_dir, server.url, "adapter", r=16)
    routed, gaps, _ = _server_run(model_dir, server.url, "auto", r=16)  # auto warns where it would send adapters
    assert routed.lora_sync == "merged" and max(gaps) <= TOLERANCE
