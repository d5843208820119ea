"""Issue 51's verdicts on benchmark rows (benchmarks/critic_ablation_plan.md): one rule, whichever task ran.

A row's ground is its task and seed; two rows compare on the grounds both ran, and seconds only within one
invocation (``invocation_ratios``). Rows in, lines of a ``| target | measured | met |`` table out.
"""

from __future__ import annotations

from statistics import fmean

from benchmarks.harness import ground, ground_order, invocation_ratios

SELECTION_MARGIN = 0.02  # amendment 1: a technique wins at its baseline's mean + this, ahead on more than half
COST_LIMIT = 1.25  # issue 51: PPO's seconds an update at most 1.25x trl-ext GRPO's in the same invocation
KEEP_UP_MARGIN = 0.05  # public-tasks plan amendment 2c: the critic's adapter learns the shared head's within this


def ok(met: bool) -> str:
    return "yes" if met else "no"


def at_least(share: tuple[int, int], grounds: int) -> int:
    """How many of ``grounds`` a share (2 of every 3, say) asks for, rounded up."""
    part, whole = share
    return -(-part * grounds // whole)


def shared_grounds(rows: list[dict], names: tuple[str, ...]) -> list[tuple]:
    """The grounds every one of ``names`` ran, in order."""
    ran = [{ground(r) for r in rows if r["trainer"] == name} for name in names]
    return sorted(set.intersection(*ran), key=ground_order)


def grounds_label(grounds: list[tuple]) -> tuple[str, str]:
    """(where, unit): ``seeds 6,7`` where one task ran, else each ``task:seed``."""
    if len({task for task, _ in grounds}) <= 1:
        return "seeds " + ",".join(str(seed) for _, seed in grounds), "seeds"
    return ", ".join(f"{task}:{seed}" for task, seed in grounds), "task-seed pairs"


def _scores(rows: list[dict]) -> dict:
    return {(r["trainer"], ground(r)): r["after"] for r in rows}


def _paired(rows: list[dict], name: str, baseline: str) -> tuple[list[tuple], float, float, int] | None:
    """Two rows on the grounds both ran: the grounds, ``name``'s mean, ``baseline``'s, how often ``name`` is ahead."""
    grounds = shared_grounds(rows, (name, baseline))
    if not grounds:
        return None
    after = _scores(rows)
    ours, theirs = (round(fmean(after[(n, g)] for g in grounds), 6) for n in (name, baseline))
    return grounds, ours, theirs, sum(after[(name, g)] > after[(baseline, g)] for g in grounds)


def _pair_cell(ours: float, theirs: float, ahead: int, grounds: list[tuple]) -> str:
    return f"{ours:.3f} vs {theirs:.3f} ({ours - theirs:+.3f}), ahead on {ahead} of {len(grounds)}"


def selection_line(rows: list[dict], name: str, baseline: str) -> str | None:
    """Amendment 1's rule: ``name`` wins over ``baseline`` at its mean + SELECTION_MARGIN and ahead on more than
    half the grounds both ran (a larger mean one seed carries is no win)."""
    paired = _paired(rows, name, baseline)
    if paired is None:
        return None
    grounds, ours, theirs, ahead = paired
    wins = ours >= theirs + SELECTION_MARGIN and 2 * ahead > len(grounds)
    return (
        f"| {name} wins over {baseline}: mean >= {baseline}'s + {SELECTION_MARGIN}, ahead on more than half the "
        f"seeds | {_pair_cell(ours, theirs, ahead, grounds)} | {ok(wins)} |"
    )


def keeps_up_line(rows: list[dict], name: str, baseline: str) -> str | None:
    """Issue 51's target for a critic of its own: ``name`` learns at least what ``baseline`` learns, its mean no
    more than KEEP_UP_MARGIN below on the grounds both ran."""
    paired = _paired(rows, name, baseline)
    if paired is None:
        return None
    grounds, ours, theirs, ahead = paired
    return (
        f"| {name} learns at least {baseline}'s: mean >= {baseline}'s - {KEEP_UP_MARGIN}, {grounds_label(grounds)[0]} "
        f"| {_pair_cell(ours, theirs, ahead, grounds)} | {ok(ours >= round(theirs - KEEP_UP_MARGIN, 6))} |"
    )


BETTER = "better"  # judgement_lines' rival: whichever group row has the higher mean


def judgement_lines(
    rows: list[dict],
    ppo: str,
    groups: list[str],
    share: tuple[int, int],
    rival: str | None,
    cost_against: str | None,
) -> list[str]:
    """Issue 51 on fresh ground for one PPO row: its mean at least the better group row's (the higher mean on the
    grounds every row ran; on a tie, the one PPO is ahead of least often), strictly ahead of ``rival`` (BETTER: that
    row; None, or a row that did not run: no count) on ``share`` of those grounds, and its seconds an update at most
    COST_LIMIT x ``cost_against``'s in each invocation. Means compare at 6 decimals: a tie is no float's accident."""
    lines = []
    grounds = shared_grounds(rows, (ppo, *groups)) if groups else []
    if grounds:
        after = _scores(rows)
        mean = {n: round(fmean(after[(n, g)] for g in grounds), 6) for n in (ppo, *groups)}

        def ahead_of(n: str) -> int:
            return sum(after[(ppo, g)] > after[(n, g)] for g in grounds)

        best = max(groups, key=lambda n: (mean[n], -ahead_of(n)))
        where, unit = grounds_label(grounds)
        lines.append(
            f"| {ppo} >= {best} (the better GRPO row) on the mean, {where} | {mean[ppo]:.3f} vs {mean[best]:.3f} | "
            f"{ok(mean[ppo] >= mean[best])} |"
        )
        rival = best if rival == BETTER else rival
        if rival in groups:
            ahead, need = ahead_of(rival), at_least(share, len(grounds))
            count = f"on at least {need} of {len(grounds)} {unit}"
            lines.append(f"| {ppo} ahead of {rival} {count} | {ahead} | {ok(ahead >= need)} |")
    for i in invocation_ratios(rows, ppo, cost_against) if cost_against else []:
        lines.append(
            f"| {ppo} s/update <= {COST_LIMIT}x {cost_against}'s, invocation {i['invocation']} | {i['ratio']:.2f}x | "
            f"{ok(i['ratio'] <= COST_LIMIT)} |"
        )
    return lines
