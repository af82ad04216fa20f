"""What auto mode left unprofiled while it followed the launch stream, per kernel and why (pure bookkeeping).

Auto mode without annotations decides launch by launch what to profile (:mod:`gpuscope._range_profiling.modes`):
while it searches for the loop, each (kernel, grid, block) is replayed once and its later launches run unprofiled;
once it follows a loop, launches outside its iterations run unprofiled, and a pass group whose iterations are cut
short or differ loses launches. :class:`Coverage` counts those launches by symbol and reason in the launch callback
(a dict increment), and at the session's end says, from the rows, how many launches were profiled, which kernels
never were, and whether that deserves a warning.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["Coverage", "REASONS", "from_the_loop_text"]

#: Why a launch ran unprofiled -> what the warning says of it.
REASONS = {
    "searching": "ran while the loop was searched for (a kernel, grid and block already replayed once, or no loop "
                 "followed after one was lost)",
    "between_iterations": "were outside the iterations of the loop followed (setup, a launch the loop does not have, "
                          "the launch that showed a longer loop)",
    "loop_changed": "were in a pass group given up when a longer loop took over or the loop was lost",
    "unmatched": "were in iterations that launched other kernels than the rest of their pass group",
    "incomplete_group": "were in the last pass group, which had fewer iterations than the metric set has passes",
}

_WARN_SHARE = 0.1  # unprofiled share of the launches seen above which the session warns, kernels all profiled


class Coverage:
    """Unprofiled launches of one auto-mode session, by reason and symbol."""

    def __init__(self):
        self.counts: dict[str, Counter] = {reason: Counter() for reason in REASONS}

    def add(self, reason: str, symbol: str, n: int = 1) -> None:
        self.counts[reason][symbol] += n

    def add_passes(self, reason: str, passes, start: int = 0) -> None:
        """Count the launches of each pass from position *start* on (the filters' choices aside: they are theirs)."""
        counts = self.counts[reason]
        for launches in passes:
            for launch in launches[start:]:
                if launch.wanted:
                    counts[launch.symbol] += 1

    def summary(self, rows, name_of, seen: int | None = None, no_loop: bool = False,
                wanted=None, loop: tuple[int, int] | None = None) -> tuple[dict, str | None]:
        """The Dataset attrs and, when it is worth saying, a warning's text: some kernel was never profiled, more
        than a tenth of the launches were not, or (*no_loop*) no loop was found.

        Parameters
        ----------
        rows : list of dict
            The session's rows; a launch row (``launch`` >= 0) stands for ``iterations`` profiled launches of its
            ``symbol``.
        name_of : callable
            symbol -> the kernel's name in the session's rows.
        seen : int, optional
            Launches the session saw, when it saw them all (the tracker followed the whole session).
        no_loop : bool
            No loop was found in *seen* launches: kernel replay profiled one launch per kernel, grid and block.
        wanted : callable, optional
            symbol -> whether the name filters keep its launches; those they leave out are not counted here.
        loop : (int, int), optional
            The launch IDs of the first launch of the loop first found and of the launch that confirmed it
            (``Repetition.offset`` and ``found_at``): what came before is setup, and the loop's iterations during
            the search (a script's warm-up steps, typically) are told apart from it.
        """
        profiled_by_symbol = Counter()
        for row in rows:
            if row.get("launch", -1) >= 0:
                profiled_by_symbol[row["symbol"]] += int(row["iterations"])
        symbols = {s for counts in self.counts.values() for s in counts}
        kept = symbols if wanted is None else {s for s in symbols if wanted(s)}
        by_reason, by_symbol = {}, Counter()
        for reason, counts in self.counts.items():
            counts = {s: n for s, n in counts.items() if s in kept}
            if counts:
                by_reason[reason] = sum(counts.values())
                by_symbol.update(counts)
        unprofiled = sum(by_symbol.values())
        by_kernel = {name_of(s): n for s, n in by_symbol.most_common()}
        never = [name_of(s) for s, _ in by_symbol.most_common() if not profiled_by_symbol[s]]
        profiled = sum(profiled_by_symbol.values())
        attrs = {"launches_profiled": profiled, "launches_unprofiled": unprofiled,
                 "launches_unprofiled_by_reason": by_reason, "launches_unprofiled_by_kernel": by_kernel,
                 "kernels_never_profiled": never}
        if seen is not None:
            attrs["launches_seen"] = seen
        if loop is not None and seen is not None:
            attrs.update(_from_the_loop(rows, seen, *loop))
        total = seen if seen is not None else profiled + unprofiled
        if not no_loop and not never and unprofiled <= _WARN_SHARE * total:
            return attrs, None
        text = (f"No repeated sequence of launches was found in {seen} launches: kernel replay profiled the first "
                "launch of each kernel, grid and block. " if no_loop else "")
        if unprofiled:
            text += _account(profiled, total, by_reason, by_kernel, never) + " "
            if "launches_from_the_loop" in attrs:
                text += from_the_loop_text(attrs) + " "
        return attrs, text + ("If the code loops, mark the loop body with gpuscope.range('step') (or call "
                              "prof.step() at each iteration) for iteration mode, which profiles every iteration and "
                              "saves and restores nothing; mode='kernel' replays every launch.")


def _listed(names: list, most: int = 6) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _account(profiled: int, total: int, by_reason: dict, by_kernel: dict, never: list) -> str:
    share = f" ({100 * profiled / total:.0f}%)" if total else ""
    why = "; ".join(f"{n} {REASONS[reason]}" for reason, n in by_reason.items())
    kernels = _listed([f"{name} ({n})" for name, n in by_kernel.items()])
    text = (f"Auto mode profiled {profiled} of the {total} launches it saw{share}. Not profiled: {why}. By kernel: "
            f"{kernels} (ds.attrs['launches_unprofiled_by_kernel']).")
    return text + (f" Never profiled: {_listed(never)}." if never else "")


def _from_the_loop(rows, seen: int, first: int, found_at: int) -> dict:
    """The launches from the loop's first iteration on, and how many of them were profiled: the search replayed one
    launch per kernel, grid and block of the iterations it watched, and left the others of them unprofiled."""
    profiled = searched = 0
    for row in rows:
        launch = row.get("launch", -1)
        if launch >= first:
            profiled += int(row["iterations"])
            # a kernel-replay row is one launch; an iteration row (a shorter loop followed before this one took
            # over) stands for its passes' launches, from its first on
            searched += int(row["iterations"]) if first <= launch <= found_at else 0
    return {"loop_first_launch": int(first), "launches_from_the_loop": int(seen - first),
            "launches_profiled_from_the_loop": int(profiled),
            "launches_searching_in_the_loop": max(int(found_at + 1 - first - searched), 0)}


def from_the_loop_text(attrs) -> str:
    """``From the loop's first iteration (launch 37) on: 1,172 of 1,587 launches profiled (74%); 207 of the others
    were its iterations while it was searched for.`` from a session's attrs, or ``""`` without them."""
    total = int(attrs.get("launches_from_the_loop", 0) or 0)
    if total <= 0:
        return ""
    profiled, searching = int(attrs["launches_profiled_from_the_loop"]), int(attrs["launches_searching_in_the_loop"])
    text = (f"From the loop's first iteration (launch {int(attrs['loop_first_launch'])}) on: {profiled:,} of "
            f"{total:,} launches profiled ({100 * profiled / total:.0f}%)")
    if searching:
        text += f"; {searching:,} of the others were its iterations while it was searched for (warm-up steps, often)"
    return text + "."
