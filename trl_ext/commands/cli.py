"""``trl-ext`` command line: one subcommand per module of ``trl_ext.commands``, each a ``Command``.

Every subcommand takes its options as flags or from ``--config FILE.yaml``. A ``TrlExtError`` (bad
input, a backend that cannot run here, a failed training run) or an ``OSError`` ends with one
``trl-ext: error: ...`` line and exit code 2 (``TRL_EXT_DEBUG=1`` shows its traceback); any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from trl_ext.errors import TrlExtError


def commands() -> dict:
    from trl_ext.commands import demo, ppo, rlhf, serve_reward, stages

    return {
        "pretrain": stages.PRETRAIN,
        "train-reward": stages.TRAIN_REWARD,
        "train-reward-model": stages.TRAIN_REWARD_MODEL,
        "eval": stages.EVAL,
        "ppo": ppo.COMMAND,
        "demo": demo.DEMO,
        "compare": demo.COMPARE,
        "rlhf": rlhf.COMMAND,
        "serve-reward": serve_reward.COMMAND,
    }


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line, as every other error of the command line, pointing at ``--help`` instead of
    printing the whole usage block first (a subcommand's parser is of its parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def render(result) -> str:
    """The one place a command's result becomes text: its data as JSON when asked, then its headline."""
    lines = [json.dumps(result.data, ensure_ascii=False, indent=2)] if result.print_data else []
    return "\n".join(lines + [result.headline])


def main(argv: list[str] | None = None) -> int:
    from trl_ext.commands.parsing import add_command_arguments, build_options
    from trl_ext.commands.quiet import quiet

    argv = list(sys.argv[1:] if argv is None else argv)
    quiet()
    table = commands()
    parser = OneLineParser(
        prog="trl-ext", description="PPO on TRL and from scratch: the doubling task.", allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in table.items():
        # allow_abbrev=False: `--step 2` must not silently mean `--steps` (and lose to a YAML value).
        add_command_arguments(
            sub.add_parser(name, help=command.help, description=command.help, allow_abbrev=False), command
        )
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's parser, whose --help lists its options
        sub.choices[namespace.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    command = table[namespace.command]
    try:
        result = command.run(build_options(command, namespace))
    except Exception as err:
        if os.environ.get("TRL_EXT_DEBUG") or not isinstance(err, (TrlExtError, OSError)):
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"trl-ext: error: {message}", file=sys.stderr)
        return 2
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
