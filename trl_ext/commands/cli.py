"""``trl-ext`` command line: one subcommand per pipeline stage.

Every subcommand takes its options as flags or from ``--config FILE.yaml``; bad input ends
with a one-line ``trl-ext: error: ...`` and exit code 2 (set ``TRL_EXT_DEBUG=1`` for the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _commands() -> dict:
    from trl_ext.commands import demo, ppo, rlhf, stages

    return {
        "pretrain": (stages.PretrainConfig, stages.run_pretrain, "pretrain the tiny GPT-2 policy on no-prefix data"),
        "train-reward": (stages.RewardConfig, stages.run_train_reward, "train the BERT charset classifier"),
        "eval": (stages.EvalConfig, stages.run_eval, "evaluate a policy on held-out prefix prompts"),
        "ppo": (ppo.PPOCommandConfig, ppo.run_ppo, "PPO with the scratch or trl backend"),
        "demo": (demo.DemoConfig, demo.run_demo, "the whole pipeline end to end, both backends"),
        "compare": (demo.CompareConfig, demo.run_compare, "both backends side by side over seeds"),
        "rlhf": (rlhf.RLHFConfig, rlhf.run_rlhf, "real-LLM PPO with LoRA and a scalar reward model"),
    }


def _summary_line(name: str, result: dict) -> str:
    if name == "pretrain":
        return (f"pretrain: value_acc={result['value_acc']:.3f} charset spread="
                f"{json.dumps(result['charset_spread'])} loss {result['first_loss']:.3f}->{result['final_loss']:.4f} "
                f"in {result['seconds']}s")
    if name == "train-reward":
        return f"train-reward: held-out accuracy={result['heldout_accuracy']:.4f} in {result['seconds']}s"
    if name == "eval":
        parts = [f"{mode}: exact={result[mode]['exact']:.3f} value={result[mode]['value_acc']:.3f} "
                 f"charset={result[mode]['charset_acc']:.3f}" for mode in ("greedy", "sampled") if mode in result]
        return "eval: " + "; ".join(parts)
    return result.get("summary", f"{name}: done")


def main(argv: list[str] | None = None) -> int:
    from trl_ext.commands.parsing import add_dataclass_arguments, build_config, given_flags

    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    parser = argparse.ArgumentParser(prog="trl-ext", description="PPO on TRL and from scratch: the doubling task.",
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (cls, _, help_text) in commands.items():
        # allow_abbrev=False: `--step 2` must not silently mean `--steps` (and lose to a YAML value).
        add_dataclass_arguments(sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False), cls)
    namespace = parser.parse_args(argv)
    cls, run, _ = commands[namespace.command]
    from trl_ext.ppo.trainer import PPOError

    try:
        cfg = build_config(cls, namespace, given_flags(argv))
        result = run(cfg)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError, PPOError) as err:
        if os.environ.get("TRL_EXT_DEBUG"):
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"trl-ext: error: {message}", file=sys.stderr)
        return 2
    if namespace.command == "eval":
        print(json.dumps(result, ensure_ascii=False, indent=2))
    print(_summary_line(namespace.command, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
