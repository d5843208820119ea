"""Write the generated parts of docs/: the command reference and the results' tables.

    python scripts/gen_docs.py            # rewrite docs/commands.md, and the generated blocks of the result pages
    python scripts/gen_docs.py --check    # change nothing; exit 3 naming each page that is not what this writes

docs/commands.md is generated whole, from the commands' option dataclasses: every ``trl-ext`` subcommand
(``trl_ext.commands.cli.commands``), its parts (one option dataclass per concern, as
``trl_ext.commands.parsing.Command`` combines them), each field's flag, type, default and help
(``trl_ext.settings.fields.field(help=...)``) and choices, and the defaults a command sets over a dataclass's own.

The result pages (docs/results.md; docs/critic.md and critic-selection.md for issue 51) are written by hand, except
their generated blocks, each between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``: the table
``benchmarks/results/NAME.md`` that a benchmark wrote beside its JSON, pasted as it is, under the source line it
carries (or, where it carries none, one made here from ``NAME.json``: its command, commit and device).
``<!-- BEGIN generated: NAME tables 1,2 -->`` keeps the text but only the tables named (counted from 1), and links
the file for the rest. Every result file is on a result page: its table in a block, or a link to it in the
hand-written text; results.md's ``other-results`` block lists, one line each, the files that are neither, so no
result is left out. Nothing here knows a benchmark: what a table shows, and what it checks, is the benchmark's.

tests/test_docs.py runs ``--check`` in a fresh interpreter: a new option, a changed help text or a new
benchmark table fails the suite until this script is run again and its output committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
import typing
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
COMMANDS_PAGE = DOCS / "commands.md"
RESULTS_PAGE = DOCS / "results.md"  # the page that holds the other-results block
RESULT_PAGES = (RESULTS_PAGE, DOCS / "critic.md", DOCS / "critic-selection.md")
REGENERATE = "python scripts/gen_docs.py"
STALE = 3  # --check's exit code for pages out of date (a crash exits 1)


# ---------------------------------------------------------------------------------------------- commands.md


def _value(value) -> str:
    """A default as a user writes it on the command line or in YAML."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return re.sub(r"e([-+])0(\d)", r"e\1\2", repr(value))  # 1e-05 as 1e-5
    return str(value)


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _doc(cls) -> str:
    """A dataclass's own docstring (not the signature dataclasses writes when there is none), first paragraph."""
    doc = (cls.__doc__ or "").strip()
    return "" if not doc or doc.startswith(cls.__name__ + "(") else " ".join(doc.split("\n\n")[0].split())


def _source(cls) -> str:
    return cls.__module__.replace(".", "/") + ".py"


def _anchor(text: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^a-z0-9 _-]", "", text.lower()).replace(" ", "-")


def _default_text(cls, f: dataclasses.Field, command) -> str:
    default = (
        f.default
        if f.default is not dataclasses.MISSING
        else f.default_factory()
        if f.default_factory is not dataclasses.MISSING
        else dataclasses.MISSING
    )
    if command is not None and f.name in command.defaults:
        own = command.defaults[f.name]
        return f"**{_value(own)}**" + (
            f" ({cls.__name__}: {_value(default)})" if default is not dataclasses.MISSING and default != own else ""
        )
    return "required" if default is dataclasses.MISSING else _value(default)


def _option_rows(cls, command=None) -> list[str]:
    """A table of a part's options: flag, type, default (the command's where it sets one), help and choices."""
    from trl_ext.commands.parsing import _arg_type
    from trl_ext.settings.fields import cli_fields

    hints = typing.get_type_hints(cls)
    rows = ["| option | type | default | what it does |", "|---|---|---|---|"]
    for f in cli_fields(cls):
        tp = _arg_type(hints[f.name])
        type_text = getattr(tp, "__name__", str(tp)) + (
            " or none" if type(None) in typing.get_args(hints[f.name]) else ""
        )
        help_text, choices = f.metadata.get("help", "").rstrip(), f.metadata.get("choices")
        if choices is not None:
            help_text += (
                ("" if not help_text or help_text.endswith(".") else ".")
                + (" " if help_text else "")
                + "Choices: "
                + ", ".join(f"`{c}`" for c in choices)
                + (", or your own as `module:name`" if isinstance(choices, Mapping) else "")
                + "."
            )
        rows.append(
            f"| `--{f.name.replace('_', '-')}` | {type_text} | {_cell(_default_text(cls, f, command))} | "
            f"{_cell(help_text)} |"
        )
    return rows


def commands_page() -> str:
    sys.path.insert(0, str(ROOT))
    from trl_ext.commands.cli import commands

    table = commands()
    users: dict[type, list[str]] = {}
    for name, command in table.items():
        for cls in command.parts.values():
            users.setdefault(cls, []).append(name)
    shared = [cls for cls, names in users.items() if len(names) > 1]
    lines = [
        "# Commands and options",
        "",
        f"<!-- Generated by `{REGENERATE}` from the option dataclasses' field help: do not edit by hand. -->",
        "",
        "Generated from the code: every `trl-ext` subcommand, the option dataclasses it combines (one per concern, "
        "as TRL's `TrlParser` combines its own), and each option's type, default and help as its field declares "
        f"them. `{REGENERATE}` rewrites this page; `tests/test_docs.py` fails while it is out of date.",
        "",
        "How options are read (`trl_ext/commands/parsing.py`): every option is a flag (`--learning-rate 1e-3`) and a "
        "key of the same name in a YAML file given with `--config FILE.yaml` (`learning_rate: 1e-3`); flags "
        "override the file, the file overrides the defaults. Flags are never abbreviated (`--step` is an error, not "
        "`--steps`). A boolean flag alone means true (`--fresh`), or takes a value (`--separate-critic false`). "
        "A **bold** default is the command's own, set over the dataclass's (shown after it). An unknown YAML key, a "
        "value of the wrong type, a missing required option or a bad value: one `trl-ext: error: ...` line, exit "
        "code 2 ([errors.md](errors.md)).",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| [`trl-ext {name}`](#{_anchor('trl-ext ' + name)}) | {_cell(c.help)} |" for name, c in table.items()),
    ]
    for name, command in table.items():
        lines += [
            "",
            f"## trl-ext {name}",
            "",
            _cell(command.help[:1].upper() + command.help[1:]) + ".",
            "",
            f"`trl-ext {name} --config FILE.yaml` reads any of the options below from a YAML file.",
        ]
        for part, cls in command.parts.items():
            described = f" {_doc(cls)}" if _doc(cls) else ""
            if cls not in shared:
                lines += [
                    "",
                    f"**{part}**: `{cls.__name__}` (`{_source(cls)}`).{described}",
                    "",
                    *_option_rows(cls, command),
                ]
                continue
            lines += [
                "",
                f"**{part}**: [`{cls.__name__}`](#{_anchor(cls.__name__)}) (`{_source(cls)}`), shared with "
                + ", ".join(f"`{n}`" for n in users[cls] if n != name)
                + "."
                + described,
            ]
            changed = [f for f in dataclasses.fields(cls) if f.name in command.defaults]
            if changed:
                lines.append(
                    "This command's defaults: "
                    + ", ".join(f"`--{f.name.replace('_', '-')} {_value(command.defaults[f.name])}`" for f in changed)
                    + "."
                )
    if shared:
        lines += [
            "",
            "## Options shared by several commands",
            "",
            "The defaults here are the dataclass's; a command that sets its own says so in its section.",
        ]
        for cls in shared:
            described = f" {_doc(cls)}" if _doc(cls) else ""
            lines += [
                "",
                f"### {cls.__name__}",
                "",
                f"`{_source(cls)}`; used by " + ", ".join(f"`trl-ext {n}`" for n in users[cls]) + "." + described,
                "",
                *_option_rows(cls),
            ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- results.md

BLOCK = re.compile(
    r"(?P<begin><!-- BEGIN generated: (?P<name>[\w.-]+)(?: tables (?P<tables>\d+(?:,\d+)*))? -->\n)"
    r"(?P<body>.*?)(?P<end><!-- END generated: (?P=name) -->)",
    re.S,
)
SOURCE = "*Source:"


def _link(name: str) -> str:
    return f"[`benchmarks/results/{name}`](../benchmarks/results/{name})"


def _source_line(name: str) -> str:
    """What a table that carries no source line is pasted under: its JSON, the command(s), commit and device."""
    data = json.loads((RESULTS / f"{name}.json").read_text())
    commands = [data["command"]] if data.get("command") else data.get("commands") or []
    made = ", made by " + "; ".join(f"`{c}`" for c in commands) if commands else ""
    commit = f" at commit {data['commit']}" if data.get("commit") else ""
    device = data.get("device") or (data.get("machine") or {}).get("device")
    return f"{SOURCE} {_link(name + '.json')}{made}{commit}" + (f", on {device}" if device else "") + ".*"


def table(name: str, tables: str | None = None) -> str:
    """``benchmarks/results/NAME.md`` as the page shows it: under its source line; with ``tables``, only those."""
    text = (RESULTS / f"{name}.md").read_text().strip()
    if not any(line.startswith(SOURCE) for line in text.splitlines()) and (RESULTS / f"{name}.json").exists():
        text = _source_line(name) + "\n\n" + text
    if tables is None:
        return text
    keep, kept, count = {int(i) for i in tables.split(",")}, [], 0
    for chunk in re.split(r"\n[ \t]*\n", text):
        if any(line.startswith("|") for line in chunk.splitlines()):
            count += 1
            if count not in keep:
                continue
        kept.append(chunk)
    every = f"Every row: {_link(name + '.md')}."
    if kept and kept[0].startswith(SOURCE):
        return "\n\n".join([kept[0] + " " + every] + kept[1:])
    return "\n\n".join(kept + [every])


def _without_blocks(text: str) -> str:
    return BLOCK.sub("", text)


def other_results(written: str, shown: set[str]) -> str:
    """One line for each result file that no block shows and no page's own text (``written``) links."""
    left = [
        p
        for p in sorted(RESULTS.glob("*.json"))
        if p.stem not in shown and f"benchmarks/results/{p.name}" not in written
    ]
    lines = []
    for path in left:
        benchmark = json.loads(path.read_text()).get("benchmark", "?")
        own = f", its table {_link(path.stem + '.md')}" if (RESULTS / f"{path.stem}.md").exists() else ""
        lines.append(f"- {_link(path.name)} (benchmark `{benchmark}`{own})")
    return "\n".join(lines) or "Every file in `benchmarks/results/` is shown or linked above."


def result_pages(texts: Mapping[Path, str]) -> dict[Path, str]:
    """Each result page with every generated block holding the table of its name; ``other-results`` (on
    results.md alone) the files no page shows or links."""
    blocks = {page: list(BLOCK.finditer(text)) for page, text in texts.items()}
    names = {
        page: [m.group("name") for m in found if m.group("name") != "other-results"] for page, found in blocks.items()
    }
    for page, found in blocks.items():
        missing = [n for n in names[page] if not (RESULTS / f"{n}.md").exists()]
        others = sum(m.group("name") == "other-results" for m in found)
        if missing or others != (page == RESULTS_PAGE):
            raise SystemExit(
                f"{page.relative_to(ROOT)}: no table benchmarks/results/NAME.md for the block(s) {missing}, or "
                f"{others} 'other-results' blocks (one on {RESULTS_PAGE.name}, none elsewhere)"
            )
    shown = {n.split(".")[0] for page_names in names.values() for n in page_names}
    written = "\n".join(_without_blocks(text) for text in texts.values())

    def body(m: re.Match) -> str:
        name = m.group("name")
        return other_results(written, shown) if name == "other-results" else table(name, m.group("tables"))

    return {
        page: BLOCK.sub(lambda m: m.group("begin") + body(m).rstrip() + "\n" + m.group("end"), text)
        for page, text in texts.items()
    }


# ---------------------------------------------------------------------------------------------- main


def pages() -> dict[Path, str]:
    texts = {page: page.read_text() for page in RESULT_PAGES}
    return {COMMANDS_PAGE: commands_page(), **result_pages(texts)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"write nothing; exit {STALE} if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in pages().items():
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if args.check:
            stale.append(path)
            diff = difflib.unified_diff(
                current.splitlines(),
                text.splitlines(),
                f"{path.relative_to(ROOT)} (committed)",
                f"{path.relative_to(ROOT)} (generated now)",
                lineterm="",
                n=1,
            )
            print("\n".join(list(diff)[:60]))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(
            f"out of date: {', '.join(str(p.relative_to(ROOT)) for p in stale)}; regenerate with `{REGENERATE}` "
            "and commit the result"
        )
        return STALE
    return 0


if __name__ == "__main__":
    sys.exit(main())
