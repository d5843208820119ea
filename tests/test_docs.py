"""The README and docs/: every Python example runs, every command line parses, the generated pages are current,
every link and repository path exists, and the README stays one screen of commands and a few of examples."""

import argparse
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# A Python block that starts with this line is an illustration (it names your own objects) and is not run.
SKETCH = "# sketch: not run"
# Every Python block that is run: (page, a string only that block holds) -> the test that runs it.
EXAMPLES = {
    ("README.md", "environment_factory=SecretDigit,  # or tools"): "test_readme_first_example_runs",
    ("README.md", 'load_classifier("runs/reward")'): "test_readme_reward_adapter_example_runs",
    ("README.md", "peft_config=LoraConfig("): "test_readme_chat_example_runs",
    ("docs/trl-compatibility.md", "def brevity("): "test_trl_compatibility_example_runs",
    ("docs/rewards.md", "def too_long("): "test_rewards_example_runs",
    ("docs/chat-prompts.md", "def says_twelve("): "test_chat_prompts_reward_example_runs",
    ("docs/algorithms.md", 'OURS = "recipes/extensions/"'): "test_algorithms_example_runs",
    ("docs/multi-turn.md", "environment_factory=SecretDigit"): "test_multi_turn_example_runs",
    ("docs/multi-turn.md", "step_environment.py:guess_the_number"): "test_own_rollout_example_runs",
}


def our_pages() -> list[Path]:
    return [README] + sorted(DOCS.glob("*.md"))


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def example(page: str, marker: str) -> str:
    """The one Python block of ``page`` that holds ``marker``."""
    blocks = [b for b in python_blocks(ROOT / page) if marker in b]
    assert len(blocks) == 1, f"{page}: {len(blocks)} Python blocks hold {marker!r}, expected one"
    return blocks[0]


# ---------------------------------------------------------------------------------------------- the README


def test_readme_is_short_and_its_first_screen_gives_the_demo_and_test_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail into docs/"
    first_screen = "\n".join(lines[:40])
    for command in (
        "bash scripts/setup.sh && OMP_NUM_THREADS=1 .venv/bin/trl-ext demo --out demo_out",
        "bash scripts/test.sh",
    ):
        assert f"```bash\n{command}\n```" in first_screen, f"the README's first 40 lines lack {command!r}"
    assert "scripts/test.sh" in (ROOT / ".ci/run").read_text()  # the README's test command is what CI runs


def test_tutorials_are_named_by_topic_not_as_seeds():
    """ "seed 000" collides with the random ``seed``: the docs say which tutorial by topic (commands.md too: the
    options' help is written so), and only the index's table maps the topics to the numbers the code comments
    cite."""
    for page in our_pages():
        text = page.read_text()
        if page == DOCS / "README.md":
            text = "\n".join(line for line in text.splitlines() if not line.startswith("| seed 00"))
            text = text.replace('"seed 000" to "seed 004"', "")
        assert not re.search(r"seeds? 00\d", text), f"{name(page)} names a tutorial as a seed"


def test_the_index_links_every_page():
    index = (DOCS / "README.md").read_text()
    for page in sorted(p.name for p in DOCS.glob("*.md")):
        if page != "README.md":
            assert f"]({page})" in index, f"docs/README.md does not link {page}"


# ---------------------------------------------------------------------------------------------- examples


def test_every_python_example_is_run_or_marked_a_sketch():
    unclaimed = []
    for page in our_pages():
        for block in python_blocks(page):
            claimed = [m for (p, m) in EXAMPLES if p == name(page) and m in block]
            if not block.startswith(SKETCH) and not claimed:
                unclaimed.append(f"{name(page)}: {block.splitlines()[0]!r}")
    assert not unclaimed, (
        "Python examples that no test runs (add them to EXAMPLES in tests/test_docs.py, or "
        f"start them with {SKETCH!r}): {unclaimed}"
    )
    for page, marker in EXAMPLES:
        example(page, marker)


def run_example(page: str, marker: str) -> subprocess.CompletedProcess:
    """The example of ``page`` that holds ``marker``, run in a fresh interpreter as a user's script would be; it must
    exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", example(page, marker)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_readme_first_example_runs():
    """The README's first example, as written: PPO with a critic on a multi-turn environment, its updates run and
    the critic's health logged."""
    done = run_example("README.md", "environment_factory=SecretDigit,  # or tools")
    updates, variance = re.search(r"(\d+) updates; explained variance (\S+)", done.stdout).groups()
    assert updates == "2" and math.isfinite(float(variance))


def test_readme_reward_adapter_example_runs(trained_artifacts, capsys):
    import torch

    block = example("README.md", 'load_classifier("runs/reward")')
    scope = {}
    exec(block.replace('"runs/reward"', repr(str(trained_artifacts["reward"]))), scope)
    high, low = eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert high > 2.0 > low
    # the adapter it builds for TRL's PPO scores the dataset's expected answer as the reward does (the eos kept)
    row, tokenizer = scope["train_dataset"][0], scope["tokenizer"]
    ids = torch.tensor([row["input_ids"] + tokenizer(row["answer"], add_special_tokens=False)["input_ids"]])
    hidden = scope["reward_model"].reward_backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).hidden_states
    direct = scope["reward"]([row["prompt"]], [row["answer"]])[0]
    assert direct > 2.0 and float(hidden[0][0, -1, 0]) == pytest.approx(direct)


@pytest.fixture(scope="module")
def chat_models(tmp_path_factory):
    """A tiny Qwen2 with a chat template and a tiny DeBERTa-v2 reward model: the examples' two paths."""
    from tiny_models import tiny_deberta_reward, tiny_qwen2

    root = tmp_path_factory.mktemp("chat_models")
    return {"policy": tiny_qwen2(root / "qwen2", chat_template=True), "reward": tiny_deberta_reward(root / "deberta")}


def run_chat_example(block: str, chat_models, out: Path) -> dict:
    block = (
        block.replace('"runs/qwen2.5-0.5b-instruct"', repr(str(chat_models["policy"])))
        .replace('"runs/deberta-v3-reward-model"', repr(str(chat_models["reward"])))
        .replace('"runs/ppo_chat"', repr(str(out)))
    )
    scope = {}
    exec(block, scope)
    return scope


@pytest.mark.trl_api  # the README's example on TRL's GRPOTrainer's conventions
def test_readme_chat_example_runs(chat_models, tmp_path):
    scope = run_chat_example(example("README.md", "peft_config=LoraConfig("), chat_models, tmp_path / "out")
    history = scope["history"]
    assert len(history) == 2 and "rewards/says_the_word/mean" in history[-1]
    assert "rewards/deberta/mean" in history[-1] and "objective/scores" in history[-1]
    assert scope["trainer"].ref_policy is None  # LoRA: the reference is the policy with its adapters off
    assert (tmp_path / "out" / "adapter_config.json").exists()
    # what the example says it sets: reward_weights [1.0, 0.1] and a KL weight adapted towards 6 over 32 episodes
    from trl_ext.ppo.core import adaptive_kl_coef

    for h in history:
        weighted = h["rewards/says_the_word/mean"] + 0.1 * h["rewards/deberta/mean"]
        assert h["objective/scores"] == pytest.approx(weighted, abs=1e-6)
    first = history[0]
    expected = adaptive_kl_coef(first["objective/kl_coef"], first["objective/kl"], 6.0, 32, 8)
    assert history[1]["objective/kl_coef"] == pytest.approx(expected, rel=1e-6)
    assert history[1]["objective/kl_coef"] != first["objective/kl_coef"]


@pytest.mark.trl_api
def test_trl_compatibility_example_runs(chat_models, tmp_path):
    """The "With TRL >= 1.13" example, with tiny models of the same architectures in place of the paths."""
    scope = run_chat_example(example("docs/trl-compatibility.md", "def brevity("), chat_models, tmp_path / "out")
    history = scope["history"]
    assert len(history) == 2 and "rewards/says_the_word/mean" in history[-1]
    assert "rewards/deberta/mean" in history[-1] and "rewards/brevity/mean" in history[-1]
    assert (tmp_path / "out" / "adapter_config.json").exists() or (tmp_path / "out" / "config.json").exists()


def test_rewards_example_runs(capsys):
    exec(example("docs/rewards.md", "def too_long("), {})
    local, remote, error = capsys.readouterr().out.strip().splitlines()[-3:]
    assert eval(local) == eval(remote) == [3.0, 3.0, -1.0]  # the values the page's comment gives
    assert "too_long" in error and "3 prompts but 2 completions" in error


def test_chat_prompts_reward_example_runs():
    """The reward function of chat-prompts.md reads both shapes a completion comes in: a message list or a string."""
    scope = {}
    exec(example("docs/chat-prompts.md", "def says_twelve("), scope)
    messages = [[{"role": "assistant", "content": "12"}], [{"role": "assistant", "content": "13"}]]
    assert scope["says_twelve"](prompts=[[], []], completions=messages, answer=["12", "12"]) == [1.0, 0.0]
    assert scope["says_twelve"](prompts=["", ""], completions=["it is 12", "no"], answer=["12", "12"]) == [1.0, 0.0]


def test_algorithms_example_runs():
    """The four "add your own" files (recipes/extensions/), named from one PPOConfig, trained for two updates; in a
    fresh interpreter, as a user's script would run."""
    done = run_example("docs/algorithms.md", 'OURS = "recipes/extensions/"')
    assert done.stdout.strip().splitlines()[-1] == "2 updates; critic: False; corrected: True"


def test_multi_turn_example_runs():
    """The worked tool task: the policy learns to call the environment's tool (calls per rollout rise to about 1)."""
    done = run_example("docs/multi-turn.md", "environment_factory=SecretDigit")
    first, last = (float(x) for x in re.search(r"calls per rollout ([\d.]+) -> ([\d.]+)", done.stdout).groups())
    assert last > first and last >= 0.5


def test_own_rollout_example_runs():
    """The worked rollout of one's own (recipes/extensions/step_environment.py): observations come back as user
    turns (environment tokens in the completions), and the reward it declares reaches scoring."""
    done = run_example("docs/multi-turn.md", "step_environment.py:guess_the_number")
    rows = re.findall(
        r"turns per rollout ([\d.]+), environment tokens per rollout ([\d.]+), return ([\d.]+)", done.stdout
    )
    assert len(rows) == 2
    assert all(float(turns) > 1.0 and float(tokens) > 0.0 for turns, tokens, _ in rows)


# ---------------------------------------------------------------------------------------------- commands


def command_lines(page: Path) -> list[str]:
    """Every ``trl-ext ...`` command of the page's bash blocks, continuation lines joined, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if "trl-ext " in line and not line.startswith("#"):
                lines.append(line[line.index("trl-ext ") + len("trl-ext ") :])
    return lines


def test_every_command_line_in_the_docs_parses():
    """Each documented ``trl-ext`` command is read as the CLI reads it (flags, values, options built and
    checked): a renamed or removed option fails here. Nothing runs."""
    from trl_ext.commands.cli import commands
    from trl_ext.commands.parsing import add_command_arguments, build_options

    table = commands()
    parser = argparse.ArgumentParser(prog="trl-ext", allow_abbrev=False, exit_on_error=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for command_name, command in table.items():
        add_command_arguments(sub.add_parser(command_name, allow_abbrev=False, exit_on_error=False), command)
    seen, failed = 0, []
    for page in our_pages():
        for line in command_lines(page):
            seen += 1
            try:
                namespace = parser.parse_args(shlex.split(line))
                build_options(table[namespace.command], namespace)
            except (SystemExit, Exception) as err:  # argparse exits on some errors even with exit_on_error=False
                failed.append(f"{name(page)}: trl-ext {line}: {type(err).__name__}: {err}")
    assert seen >= 20, f"found only {seen} command lines: is command_lines still reading the pages?"
    assert not failed, "\n".join(failed)


def test_generated_pages_are_current():
    """docs/commands.md (from the option dataclasses) and the result pages' tables (from benchmarks/results) are
    what scripts/gen_docs.py writes now; in a fresh interpreter, so that no test's registration shows."""
    done = subprocess.run(
        [sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 1, f"scripts/gen_docs.py failed:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, (
        f"{done.stdout[-4000:]}\nthe generated docs are out of date: run "
        "`python scripts/gen_docs.py` and commit docs/commands.md, docs/results.md and docs/critic.md"
    )


def test_a_table_on_either_result_page_counts_as_shown_and_other_results_lives_on_results_md():
    """gen_docs's result pages share one account: a file whose table critic.md shows, or whose JSON its text links,
    is not listed again in results.md's other-results block; that block belongs on results.md alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    shown, linked = sorted(p.stem for p in gen_docs.RESULTS.glob("*.json"))[:2]
    others = "<!-- BEGIN generated: other-results -->\n<!-- END generated: other-results -->"
    critic = gen_docs.DOCS / "critic.md"
    pages = gen_docs.result_pages(
        {
            gen_docs.RESULTS_PAGE: others,
            critic: f"<!-- BEGIN generated: {shown} -->\n<!-- END generated: {shown} -->\n"
            f"see [it](../benchmarks/results/{linked}.json)",
        }
    )
    listed = pages[gen_docs.RESULTS_PAGE]
    assert f"{shown}.json" not in listed and f"{linked}.json" not in listed and ".json" in listed
    assert gen_docs.table(shown) in pages[critic]
    with pytest.raises(SystemExit, match="other-results"):
        gen_docs.result_pages({gen_docs.RESULTS_PAGE: others, critic: others})


# ---------------------------------------------------------------------------------------------- links and paths


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), re.M):
        out.add(re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_links_paths_and_named_code_exist():
    """Every relative link resolves (and its #anchor is a heading there), every repository path in backticks
    exists, and every [`name`](file.py) link names something defined in that file."""
    broken = []
    for page in our_pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links and paths in prose and tables
        for label, target in re.findall(r"\[([^\]]*)\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists():
                broken.append(f"{name(page)}: link {target!r} points nowhere")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{name(page)}: link {target!r}: no heading with that anchor")
            elif path.suffix == ".py" and re.fullmatch(r"`\w+`", label):
                symbol = label.strip("`")
                if not re.search(rf"^\s*(def|class) {symbol}\b|^{symbol}\s*[:=]", path.read_text(), re.M):
                    broken.append(f"{name(page)}: {path.relative_to(ROOT)} defines no {symbol!r}")
        for path in re.findall(r"`((?:trl_ext|tests|benchmarks|recipes|scripts|docs)/[^`\s]*)`", text):
            if not (ROOT / path).exists() and not re.search(r"[<*]", path):
                broken.append(f"{name(page)}: {path} does not exist")
    assert not broken, "\n".join(broken)
