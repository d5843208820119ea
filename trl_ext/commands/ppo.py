"""``trl-ext ppo``: PPO on the doubling task with either backend, the same inputs and outputs.

Writes to ``--out``: the tuned policy (``save_pretrained``) with its value head, ``metrics.jsonl``
(one line per update), ``eval.json`` (greedy and sampled on held-out prompts) and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trl_ext.commands.outputs import prepare_out_dir, trainer_config
from trl_ext.options import field
from trl_ext.ppo.config import PPOConfig, num_updates

BACKENDS = ("scratch", "trl", "grpo", "rloo")  # the last two: TRL's critic-free baselines, for comparison


@dataclass
class RunOptions(PPOConfig):
    """PPO options plus how a doubling run is watched and where it may write (``ppo``, ``demo``, ``compare``)."""

    probe_every: int = field(10, help="updates between held-out greedy probes (0: never)")
    probe_n: int = field(200, help="held-out prompts per probe")
    eval_n: int = field(1000, help="held-out prompts for the final evaluation")
    overwrite: bool = field(False, help="write into an output directory that already holds other files")
    skip_special_tokens: bool = field(False, help="decode completions without special tokens; the doubling "
                                      "classifier was trained on answers ending in the eos E, so it is kept")

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.eval_n <= 1000 or not 0 < self.probe_n <= 1000:
            raise ValueError("eval_n and probe_n must be in 1..1000")


@dataclass
class PPOCommandConfig(RunOptions):
    backend: str = field("scratch", help="'scratch' (trl-ext's PPO), 'trl' (TRL's PPOTrainer), or TRL's critic-free "
                         "'grpo'/'rloo' for comparison", choices=BACKENDS)
    policy: str | None = field(None, help="directory of the pretrained policy")
    reward: str | None = field(None, help="directory of the reward classifier")
    out: str | None = field(None, help="output directory")
    stop_at_target: bool = field(False, help="stop once the probe's greedy exact-match reaches 0.99")

    def __post_init__(self):
        super().__post_init__()
        for name in ("policy", "reward", "out"):
            if not getattr(self, name):
                raise ValueError(f"missing required option --{name}")


def load_inputs(cfg: PPOCommandConfig):
    """Policy, tokenizer and reward function, checked before any training starts."""
    from trl_ext.doubling.artifacts import load_classifier, load_policy
    from trl_ext.doubling.rewards import doubling_classifier_reward

    policy, tokenizer = load_policy(cfg.policy)
    classifier, classifier_tokenizer = load_classifier(cfg.reward)
    return policy, tokenizer, doubling_classifier_reward(classifier, classifier_tokenizer)


def train_backend(cfg: PPOCommandConfig, policy, tokenizer, reward_fn, out: Path, recorder, accelerator=None):
    """Run one backend to the end of its budget (or the target); returns the trained policy module."""
    from trl_ext.doubling.task import ppo_prompt_dataset

    dataset = ppo_prompt_dataset(tokenizer, cfg.total_episodes, cfg.seed)
    if cfg.backend == "scratch":
        from trl_ext.ppo.trainer import PPOTrainer

        trainer = PPOTrainer(policy, reward_fn, args=trainer_config(cfg), train_dataset=dataset,
                             processing_class=tokenizer, accelerator=accelerator)
        recorder.begin()
        trainer.train(lambda update, stats: recorder.record(update, stats, trainer.policy))
        recorder.end()
        trainer.save(out)
        return trainer.policy, trainer.accelerator
    if cfg.backend in ("grpo", "rloo"):
        from trl_ext.baselines import group_prompt_count, train_group_baseline

        prompts = ppo_prompt_dataset(tokenizer, group_prompt_count(cfg), cfg.seed)
        train_group_baseline(cfg.backend, trainer_config(cfg), policy, tokenizer, reward_fn,
                             prompts.select_columns(["prompt", "label", "question"]), out, recorder)
        policy.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        from accelerate import PartialState

        return policy, PartialState()
    from transformers import TrainerCallback

    from trl_ext.trl_compat.backend import build_trl_trainer, save_trl_policy

    class _Stop(Exception):
        pass

    class _Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and "objective/scores" in logs and recorder.record(state.global_step, logs, policy):
                raise _Stop  # TRL's PPO loop ignores control.should_training_stop

    trainer = build_trl_trainer(trainer_config(cfg), policy, tokenizer, reward_fn, dataset, out,
                                callbacks=[_Record()])
    recorder.begin()
    try:
        trainer.train()
    except _Stop:
        pass
    recorder.end()
    save_trl_policy(trainer, tokenizer, out)
    return policy, trainer.accelerator


def _rank_checksums(model, accelerator) -> list[float]:
    """One parameter checksum per process: equal numbers mean the ranks' weights are in sync."""
    import torch

    local = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())],
                         device=accelerator.device, dtype=torch.float64)
    return accelerator.gather(local).tolist() if accelerator.num_processes > 1 else local.tolist()


def run_ppo(cfg: PPOCommandConfig, print_fn=print) -> dict:
    from accelerate import PartialState

    from trl_ext.doubling.evaluate import evaluate_policy
    from trl_ext.commands.run_log import RunRecorder

    import torch

    # cpu=True when there is no GPU: under a multi-process launch that makes the ranks join over gloo
    # instead of each silently running alone.
    if cfg.backend == "trl":
        from trl_ext.trl_compat import require_trl_ppo

        require_trl_ppo()
    state = PartialState(cpu=not torch.cuda.is_available())
    if cfg.stop_at_target and state.num_processes > 1:
        raise ValueError("stop_at_target probes on the main process only: use it with one process")
    policy, tokenizer, reward_fn = load_inputs(cfg)
    if state.is_main_process:
        prepare_out_dir(cfg.out, cfg.overwrite)
    state.wait_for_everyone()
    out = Path(cfg.out)
    main = state.is_main_process
    recorder = RunRecorder(tokenizer, backend=cfg.backend, probe_every=cfg.probe_every if main else 0,
                           probe_n=cfg.probe_n, stop_at_target=cfg.stop_at_target,
                           log_path=out / "metrics.jsonl" if main else None,
                           print_fn=print_fn if main else (lambda *_: None), seed=cfg.seed,
                           total_updates=num_updates(cfg, state.num_processes))
    try:
        trained, accelerator = train_backend(cfg, policy, tokenizer, reward_fn, out, recorder)
    finally:
        recorder.close()
    train_seconds = recorder.train_seconds
    save_seconds = time.perf_counter() - recorder.stopped if recorder.stopped is not None else None
    checksums = _rank_checksums(trained, accelerator)
    summary = {"backend": cfg.backend, "config": asdict(cfg)}
    if accelerator.is_main_process:
        report = evaluate_policy(trained, tokenizer, n=cfg.eval_n, seed=cfg.seed, sample=True)
        (out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        last = recorder.history[-1] if recorder.history else {}
        summary.update(
            updates=len(recorder.history), episodes=last.get("episode"), train_seconds=round(train_seconds, 2),
            setup_seconds=round(recorder.setup_seconds, 2),
            save_seconds=round(save_seconds, 2) if save_seconds is not None else None,
            episodes_per_second=round(last.get("episode", 0) / train_seconds, 2) if train_seconds else None,
            reached_0_99=recorder.reached, final_kl=last.get("objective/kl"),
            greedy=_headline(report["greedy"]), sampled=_headline(report["sampled"]),
            world_size=accelerator.num_processes, rank_checksums=checksums,
        )
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        summary["summary"] = (f"ppo[{cfg.backend}]: greedy exact={report['greedy']['exact']:.3f} sampled "
                              f"exact={report['sampled']['exact']:.3f} after {summary['episodes']} episodes in "
                              f"{summary['train_seconds']}s ({summary['episodes_per_second']} episodes/s)")
    return summary


def _headline(metrics: dict) -> dict:
    return {k: metrics[k] for k in ("exact", "value_acc", "charset_acc", "finished")}
