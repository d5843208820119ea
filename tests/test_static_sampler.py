"""The static-cache sampler draws token for token what the KV-cache loop draws (CPU, eager)."""

from dataclasses import replace

import pytest
import torch

from trl_ext.ppo.rollout.interface import SamplingOptions
from trl_ext.ppo.rollout.loop import sample_responses
from trl_ext.ppo.rollout.static_sampler import StaticDecoder, bucket, pick_tokens
from trl_ext.tasks.doubling.ppo_settings import doubling_ppo_config

VOCAB = 96


def _gpt2(dtype=torch.float32):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, eos_token_id=1, bos_token_id=1, pad_token_id=0
    )
    return GPT2LMHeadModel(cfg).to(dtype).eval()


def _qwen2(dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=1,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def _queries(rows=5, seed=1):
    """Left-padded prompts of 3 to 9 tokens (ids 2.. so no prompt holds pad or eos)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 10, (rows,), generator=g)
    lengths[0] = 9
    ids = torch.randint(2, VOCAB, (rows, 9), generator=g)
    mask = (torch.arange(9) >= 9 - lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def _eos_for(model, ids, mask, **options):
    """An eos that ends some rows early: the commonest token of an eos-free rollout."""
    free = sample_responses(model, ids, mask, SamplingOptions(12, -1, 0, **options), torch.Generator().manual_seed(7))
    return int(free[:, 1:].flatten().mode().values)


def _both(model, ids, mask, sampler=None, **options):
    """The loop's and the static sampler's rollouts from the same seed, and whether both leave the
    generator in the same state (so the draws after a rollout agree too)."""
    options = SamplingOptions(**{"max_new_tokens": 12, "pad_token_id": 0, **options})
    g_loop, g_static = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    loop = sample_responses(model, ids, mask, options, g_loop)
    static = (sampler or StaticDecoder())(model, ids, mask, options, g_static)
    return loop, static, torch.equal(g_loop.get_state(), g_static.get_state())


def _length(completions, **kwargs):
    return [float(len(c)) for c in completions]


SAMPLING = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.3, top_k=20, top_p=0.9),
]


@pytest.mark.parametrize("build", [_gpt2, _qwen2], ids=["gpt2", "qwen2"])
@pytest.mark.parametrize("options", SAMPLING, ids=["greedy", "sampled", "top_k", "top_p", "top_k_top_p"])
def test_static_equals_loop(build, options):
    model = build()
    ids, mask = _queries()
    eos = _eos_for(model, ids, mask, **options)
    loop, static, same_stream = _both(model, ids, mask, eos_token_id=eos, **options)
    ended = (loop == eos).any(1)
    assert ended.any() and not ended.all(), "the case needs rows that end early and rows that do not"
    assert torch.equal(static, loop)
    assert same_stream  # the generator is left where the loop leaves it: later draws agree too


@pytest.mark.parametrize("build", [_gpt2, _qwen2], ids=["gpt2", "qwen2"])
def test_static_equals_loop_on_a_bf16_checkpoint(build, tmp_path):
    from transformers import AutoModelForCausalLM

    build(torch.bfloat16).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert next(model.parameters()).dtype == torch.bfloat16  # loaded as saved, as real checkpoints are
    ids, mask = _queries()
    for options in (dict(temperature=0.0), dict(temperature=1.0, top_k=20, top_p=0.9)):
        eos = _eos_for(model, ids, mask, **options)
        loop, static, _ = _both(model, ids, mask, eos_token_id=eos, **options)
        assert torch.equal(static, loop), options


def test_static_equals_loop_with_lora_adapters():
    from peft import LoraConfig, get_peft_model

    model = _qwen2()
    base, _, _ = _both(model, *_queries(), eos_token_id=-1, temperature=1.0)
    torch.manual_seed(1)  # init_lora_weights=False: B is random too, so the adapters change the output
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)).eval()
    ids, mask = _queries()
    loop, static, _ = _both(model, ids, mask, eos_token_id=-1, temperature=1.0)
    assert torch.equal(static, loop)
    assert not torch.equal(static, base)  # the adapters took part in the decode


def test_one_sampler_reuses_its_cache_across_batch_and_prompt_sizes():
    model = _qwen2()
    sampler = StaticDecoder()
    for rows, seed in ((5, 1), (3, 2), (5, 3)):  # 5 rows -> bucket 6; 3 rows -> bucket 3
        ids, mask = _queries(rows, seed)
        ids, mask = ids[:, 2:], mask[:, 2:]  # 7 columns -> prompt length 16
        loop, static, _ = _both(model, ids, mask, sampler=sampler, eos_token_id=-1, temperature=1.0, top_k=10)
        assert torch.equal(static, loop)
    assert sorted(sampler._caches) == [(6, 16 + 16)]  # 3 rows fit the 6-row cache; 12 new tokens round to 16


def _prompts(rows: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    lengths[0] = width
    ids = torch.randint(2, VOCAB, (rows, width), generator=g)
    mask = (torch.arange(width) >= width - lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def test_the_turns_of_a_tool_loop_reuse_a_few_caches():
    """A multi-turn rollout asks for fewer rows, longer prompts and fewer new tokens turn after turn: each a new
    shape (and on a GPU a new compile) unless a kept cache holds it."""
    model = _qwen2()
    sampler = StaticDecoder()
    turns = [(6, 9, 40), (2, 15, 25), (4, 14, 31), (6, 9, 40), (3, 16, 18), (1, 30, 9), (5, 12, 27), (2, 40, 50)]
    for seed, (rows, width, new) in enumerate(turns):
        ids, mask = _prompts(rows, width, seed)
        loop, static, _ = _both(model, ids, mask, sampler=sampler, eos_token_id=-1, temperature=1.0, max_new_tokens=new)
        assert torch.equal(static, loop), (rows, width, new)
    # all but the last fit the first turn's cache; the last's 40-token prompt and 50 new tokens do not
    assert sorted(sampler._caches) == [(6, 16 + 64), (6, 64 + 64)]  # the new one as wide as the widest so far


def test_check_every_n_tokens_keeps_the_tokens_and_pads_the_tail():
    model = _gpt2()
    ids, mask = _queries(rows=3)
    options = SamplingOptions(max_new_tokens=30, eos_token_id=-1, pad_token_id=0, temperature=1.0)
    free = sample_responses(model, ids, mask, options, torch.Generator().manual_seed(7))
    # An eos that every row emits, the last row at a step that is not a multiple of 8.
    width = {
        t: max(int((row == t).nonzero()[0]) + 1 for row in free)
        for t in set(free[0].tolist())
        if all((row == t).any() for row in free)
    }
    eos = next(t for t in sorted(width, key=width.get) if width[t] % 8)
    options = replace(options, eos_token_id=eos)
    loop = sample_responses(model, ids, mask, options, torch.Generator().manual_seed(7))
    static = StaticDecoder(check_every=8)(model, ids, mask, options, torch.Generator().manual_seed(7))
    assert loop.shape[1] == width[eos] < 30  # every row ended early; the static sampler sees it at a check
    assert static.shape[1] == min(30, -(-loop.shape[1] // 8) * 8)
    assert torch.equal(static[:, : loop.shape[1]], loop)
    assert (static[:, loop.shape[1] :] == 0).all()


def test_the_decode_step_traces_as_one_graph_and_is_not_retraced():
    """What a CUDA graph needs, checked on CPU with the tracing half of torch.compile: no graph break
    (fullgraph=True raises on one), and a second rollout of the same shapes reuses the first graph."""
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(1)
    model = get_peft_model(_qwen2(), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)).eval()
    sampler = StaticDecoder(compile=True, compile_options={"backend": "eager", "fullgraph": True, "dynamic": False})
    for seed in (1, 2):
        ids, mask = _queries(seed=seed)
        loop, static, _ = _both(
            model, ids, mask, sampler=sampler, eos_token_id=-1, temperature=1.0, top_k=20, top_p=0.9
        )
        assert torch.equal(static, loop)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()


def test_a_decode_step_that_fails_to_compile_falls_back_to_eager():
    model = _gpt2()
    ids, mask = _queries()

    def broken_compiler(graph, example_inputs):
        raise RuntimeError("this compiler always fails")

    sampler = StaticDecoder(compile=True, compile_options={"backend": broken_compiler})
    with pytest.warns(UserWarning, match="compiled decode step failed"):
        loop, static, _ = _both(model, ids, mask, sampler=sampler, eos_token_id=-1, temperature=1.0)
    assert torch.equal(static, loop) and sampler.compile is False


def test_pick_tokens_draws_as_multinomial_does():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    for _ in range(20):
        noise = torch.empty_like(logits).exponential_(generator=torch.Generator().manual_seed(_))
        expected = torch.multinomial(torch.softmax(logits, -1), 1, generator=torch.Generator().manual_seed(_)).squeeze(
            -1
        )
        assert torch.equal(pick_tokens(logits, noise, temperature=1.0, top_k=0, top_p=1.0), expected)
    top = pick_tokens(logits, noise, temperature=1.0, top_k=1, top_p=1.0)
    assert torch.equal(top, logits.argmax(-1))
    assert torch.equal(pick_tokens(logits, noise, temperature=1.0, top_k=0, top_p=1e-6), top)


def trained_history(tokenizer, sampler: str, total_episodes: int = 8) -> list[dict]:
    """The stats of a short doubling-task run with ``sampler`` (timings dropped): runs that sample the same train
    to the same numbers."""
    from datasets import Dataset

    from trl_ext.ppo import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy

    prompts = Dataset.from_dict({"input_ids": [tokenizer(f"S数字:{1000 + 7 * i}x2=")["input_ids"] for i in range(8)]})
    trainer = PPOTrainer(
        build_policy(tokenizer, seed=3),
        _length,
        processing_class=tokenizer,
        train_dataset=prompts,
        args=doubling_ppo_config(
            batch_size=4, total_episodes=total_episodes, num_ppo_epochs=1, top_k=8, sampler=sampler
        ),
    )
    assert trainer.sampler_name == sampler
    return [{k: v for k, v in h.items() if not k.startswith("timing/") and k != "eps"} for h in trainer.train()]


def test_the_trainer_samples_with_the_static_sampler_as_with_the_loop(tokenizer):
    from trl_ext.ppo import PPOTrainer
    from trl_ext.tasks.doubling.models import build_policy

    # same rollouts, so the same updates, to the last bit
    assert trained_history(tokenizer, "static") == trained_history(tokenizer, "loop")
    assert (
        PPOTrainer(build_policy(tokenizer), _length, processing_class=tokenizer).sampler_name == "loop"
    )  # 'auto', CPU


def test_static_sampler_on_an_fsdp2_sharded_policy():
    """Two CPU ranks, the policy sharded with FSDP2: the trainer gathers it once per rollout, and the
    static sampler decodes with the gathered parameters (the script of test_sharded.py, sampler 'static')."""
    from launch import run_two_ranks

    ranks = run_two_ranks("fsdp2_two_ranks.py", "static")  # ranks 0 and 1 of 2, their scores equal
    assert all(r["sharded_after"] and r["moved"] and r["updates"] == 2 for r in ranks)
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_bucket_sizes():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 6, 7, 9, 13, 17, 25, 33, 64, 65)] == [
        1,
        2,
        3,
        4,
        6,
        6,
        8,
        12,
        16,
        24,
        32,
        48,
        64,
        96,
    ]
