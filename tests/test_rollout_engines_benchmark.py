"""benchmarks/rollout_engines.py without vLLM (issue 40): its ``loop-merged`` baseline samples from its own copy of the
policy with the LoRA adapters merged, made and synced as vLLM's engine is (like for like), and the rows of a shape
take turns one update at a time over at least 5 timed updates (two CPU engines on a tiny chat model, end to end).
The vLLM row itself runs only in .venv-vllm (the needs_vllm tests and the benchmark)."""

import importlib
import json

import pytest
import torch
from tiny_models import tiny_qwen2


@pytest.fixture()
def bench():
    import benchmarks.rollout_engines

    return importlib.reload(benchmarks.rollout_engines)


def _lora_policy(folder):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    policy = get_peft_model(
        AutoModelForCausalLM.from_pretrained(folder),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
    return policy.eval()


def test_the_merged_loop_samples_the_merged_weights_and_syncs_after_each_step(bench, tmp_path):
    from transformers import AutoTokenizer

    from trl_ext.ppo.rollout.interface import SamplingOptions
    from trl_ext.ppo.rollout.loop import sample_responses

    folder = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5", initializer_range=0.5)
    tokenizer, policy = AutoTokenizer.from_pretrained(folder), _lora_policy(folder)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    ids = torch.tensor([bench.prompts(tokenizer, 1)[0][-12:]] * 3)
    mask = torch.ones_like(ids)
    options = SamplingOptions(
        max_new_tokens=6, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, temperature=0.7
    )
    engine = bench.MergedLoop()

    def both(seed):
        ours = engine.sample(policy, ids, mask, options, torch.Generator().manual_seed(seed)).ids
        through_lora = sample_responses(policy, ids, mask, options, torch.Generator().manual_seed(seed))
        return ours, through_lora

    ours, through_lora = both(0)
    assert torch.equal(ours, through_lora)  # float32: merged or not, the same tokens
    with torch.no_grad():
        logits = policy(input_ids=ids).logits
        assert (engine.copy(input_ids=ids).logits - logits).abs().max() < 1e-4  # the adapters are in the copy
        with policy.disable_adapter():
            assert (policy(input_ids=ids).logits - logits).abs().max() > 1e-2  # and they matter here
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())  # the trained module untouched
    assert not {p.data_ptr() for p in engine.copy.parameters()} & {p.data_ptr() for p in policy.parameters()}

    with torch.no_grad():  # an optimizer step: the copy is stale until the trainer says the policy changed
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
        assert (engine.copy(input_ids=ids).logits - policy(input_ids=ids).logits).abs().max() > 1e-2
    assert engine.stats["syncs"] == 1
    engine.policy_changed()
    ours, through_lora = both(1)
    assert torch.equal(ours, through_lora) and engine.stats["syncs"] == 2
    both(2)
    assert engine.stats["syncs"] == 2  # no step since: no sync


def test_rows_of_a_shape_take_turns_one_update_at_a_time(bench, tmp_path):
    folder = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")
    out = tmp_path / "engines.json"
    assert (
        bench.main(
            [
                "--model",
                str(folder),
                "--engines",
                "loop-merged,loop",
                "--shapes",
                "2x4",
                "--warmup",
                "1",
                "--updates",
                "5",
                "--row-timeout",
                "300",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["failed"] == [] and [r["engine"] for r in result["rows"]] == ["loop-merged", "loop"]
    order = result["interleaved"]["order"]["2x4"]
    assert order == [["loop-merged", "loop"], ["loop", "loop-merged"]] * 3  # 6 rounds, the order rotated each
    for row in result["rows"]:
        assert row["lockstep"] and len(row["timed_updates"]) == row["updates"] == 5
        assert row["update_wall_seconds"] > 0 and row["non_rollout_seconds"] > 0
    merged = result["rows"][0]
    assert merged["syncs"]["syncs"] == 6  # before every rollout: the policy changed after each update
    assert "syncs" not in result["rows"][1]
    assert result["speedups"] == []  # vLLM's over the others: no vLLM row here


def test_unknown_engines_are_refused(bench, tmp_path, capsys):
    folder = tiny_qwen2(tmp_path / "chat", chat_template="qwen2.5")
    with pytest.raises(SystemExit):
        bench.main(["--model", str(folder), "--engines", "loop,warp"])
    assert "unknown engines ['warp']" in capsys.readouterr().err


def test_vllm_speedups_are_over_every_other_engine_with_the_non_rollout_check(bench):
    def row(engine, rollout, update, non_rollout):
        return {
            "engine": engine,
            "prompts": 16,
            "response_tokens": 48,
            "rollout_seconds": rollout,
            "update_seconds": update,
            "non_rollout_seconds": non_rollout,
        }

    found = bench.speedups(
        [row("vllm", 2.0, 10.0, 8.0), row("loop-merged", 8.0, 16.0, 8.0), row("loop", 10.0, 20.0, 10.0)]
    )
    assert found == [
        {"shape": "16x48", "vllm_over": "loop-merged", "rollout": 4.0, "update": 1.6, "non_rollout": 1.0},
        {"shape": "16x48", "vllm_over": "loop", "rollout": 5.0, "update": 2.0, "non_rollout": 1.25},
    ]
    assert bench.DEFAULT_ENGINES == ("vllm", "loop-merged", "loop")
