"""Find the loop in a stream of kernel launches: the period and offset of a repeating sequence of signatures.

A signature is any hashable value; gpuscope uses ``(symbol, grid, block)``. A *repetition* is a stretch of the
stream made of ``min_repeats`` back-to-back copies of one sequence of at most ``max_period`` signatures. The one
found is the one confirmed first when the stream is read from the left (the shortest period if several are
confirmed by the same launch). It starts where its periodic stretch starts, which fixes the rotation: after setup
launches that end like the loop body, or a warm-up step that differs only in its first launches, the period starts
inside the body (loop ``A B F`` after a setup ending in ``F`` is found as ``F A B``). Nested loops: the inner loop
is found first when it repeats ``min_repeats`` times; the outer one only when no inner loop does.

Algorithm: ``run[p]`` counts the launches ``k``, up to the current one, with ``s[k] == s[k - p]``; the stream is
p-periodic over its last ``run[p] + p`` launches, and ``min_repeats`` copies are confirmed when ``run[p]`` reaches
``(min_repeats - 1) * p``. At launch ``i`` only the periods ``i - j``, for the earlier launches ``j`` of the same
signature, can extend their run; the other runs are left stale and read as 0. Searching thus costs, per launch, the
number of earlier occurrences of its signature among the last ``max_period`` launches (1 or 2 in a loop whose
kernels differ), and holds at most ``max_period`` launches. A :class:`Tracker` that has locked on a repetition
costs O(1) per launch and holds at most ``min_repeats * max_period`` launches (for the search after a loss).

The tracker never guesses: it gives a launch a position only if its signature is the period's signature at that
position.

Examples
--------
>>> steps = [("fill", (64,), (256,))] + [("gemm", (8, 8), (16, 16)), ("relu", (64,), (256,))] * 4
>>> find(steps)
Repetition(offset=1, period=(('gemm', (8, 8), (16, 16)), ('relu', (64,), (256,))), found_at=6, repeats=3)
>>> tracker = Tracker()
>>> [str(tracker.feed(s).kind) for s in steps]
['searching', 'searching', 'searching', 'searching', 'searching', 'searching', 'searching', 'begin', 'inside']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from enum import Enum

__all__ = ["Event", "Repetition", "Step", "Tracker", "find"]


@dataclass(frozen=True)
class Repetition:
    """A repeating sequence of launch signatures, as first confirmed.

    Attributes
    ----------
    offset : int
        Index of the first launch of the first repeated iteration.
    period : tuple
        The signatures of one iteration, starting at ``offset``.
    found_at : int
        Index of the launch that confirmed the repetition: the last launch of an iteration.
    repeats : int
        Iterations wholly between ``offset`` and ``found_at`` (both included).
    """

    offset: int
    period: tuple
    found_at: int
    repeats: int


class Step(str, Enum):
    """What a launch is to a :class:`Tracker`."""

    #: In no reported iteration: no repetition known, or the launch ends an iteration begun before the lock. The
    #: launch that confirms a repetition is SEARCHING too, and sets :attr:`Tracker.locked`.
    SEARCHING = "searching"
    #: Position 0 of a new iteration; the first BEGIN after a lock is the first iteration begun after it.
    BEGIN = "begin"
    #: The expected launch at a position > 0 of the open iteration.
    INSIDE = "inside"
    #: Position 0's signature while the open iteration expected another launch: that iteration ended incomplete
    #: (a ``break``) and a new one begins here.
    RESTART = "restart"
    #: Fits no expected position. Inside an open iteration the same position stays expected, so one extra launch
    #: does not shift the sequence.
    EXTRA = "extra"
    #: One EXTRA or RESTART more than ``max_extras`` without an iteration completing: the repetition is dropped and
    #: the launches since the last completed iteration, this one included, are searched again, so the tracker may
    #: have locked on another loop already (an iteration of it under way is not reported: SEARCHING up to its end).
    LOST = "lost"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Event:
    """What :meth:`Tracker.feed` says of one launch.

    Attributes
    ----------
    kind : Step
    iteration : int
        Number of the iteration, from 0 at the first BEGIN after the lock; -1 when the launch belongs to none.
    position : int
        Position in the period; -1 when the launch has none. For an EXTRA inside an iteration: the position still
        expected, from which the iteration is spoiled.
    last : bool
        The launch is the last of its iteration (BEGIN with a period of 1, or INSIDE).
    between : bool
        For EXTRA: no reported iteration is open, so the launch may simply be left out.
    """

    kind: Step
    iteration: int = -1
    position: int = -1
    last: bool = False
    between: bool = False


_SEARCHING = Event(Step.SEARCHING)
_LOST = Event(Step.LOST)


def _check(min_repeats, max_period) -> None:
    if not isinstance(min_repeats, int) or min_repeats < 2:
        raise ValueError(f"min_repeats must be an integer >= 2 (copies needed to call it a loop), not {min_repeats!r}")
    if not isinstance(max_period, int) or max_period < 1:
        raise ValueError(f"max_period must be an integer >= 1, not {max_period!r}")


class _Search:
    """The runs of every candidate period over the launches pushed so far (indices must be consecutive)."""

    def __init__(self, min_repeats: int, max_period: int):
        self.min_repeats = min_repeats
        self.window = deque(maxlen=max_period)  # only these launches can start a period ending at the next one
        self.seen = {}  # signature -> its indices in the window, oldest first
        self.run = [0] * (max_period + 1)
        self.updated = [-2] * (max_period + 1)  # run[p] holds only if updated at the previous index

    def push(self, index: int, signature) -> Repetition | None:
        found = run_found = 0
        need = self.min_repeats - 1
        for j in self.seen.get(signature, ()):
            p = index - j
            run = self.run[p] + 1 if self.updated[p] == index - 1 else 1
            self.run[p], self.updated[p] = run, index
            if run >= need * p and (not found or p < found):
                found, run_found = p, run
        if len(self.window) == self.window.maxlen:  # the oldest launch leaves: forget it (bounded memory)
            oldest = self.window[0]
            self.seen[oldest].popleft()
            if not self.seen[oldest]:
                del self.seen[oldest]
        occurrences = self.seen.get(signature)  # after the eviction, which may have dropped this signature
        if occurrences is None:
            self.seen[signature] = occurrences = deque()
        occurrences.append(index)
        self.window.append(signature)
        if not found:
            return None
        # The stream is p-periodic from index - run - p + 1 on, so the last p launches are the period in order.
        period = tuple(self.window)[-found:]
        return Repetition(index - run_found - found + 1, period, index, run_found // found + 1)


def find(signatures: Iterable[Hashable], *, min_repeats: int = 3, max_period: int = 256) -> Repetition | None:
    """The first repetition in a recorded stream of launch signatures, as :class:`Tracker` finds it online.

    Parameters
    ----------
    signatures : iterable of hashable
        Launch signatures in launch order; read only up to the launch that confirms a repetition.
    min_repeats : int
        Back-to-back copies of the period needed to confirm it.
    max_period : int
        Longest period looked for, in launches.

    Returns
    -------
    Repetition or None
        None when no stretch of the stream is ``min_repeats`` copies of a period of at most ``max_period``.

    Raises
    ------
    ValueError
        ``min_repeats`` below 2 or ``max_period`` below 1.
    """
    _check(min_repeats, max_period)
    search = _Search(min_repeats, max_period)
    for index, signature in enumerate(signatures):
        found = search.push(index, signature)
        if found is not None:
            return found
    return None


class Tracker:
    """Finds the repetition in a stream of launches fed one at a time, then labels each launch with its place in it.

    Parameters
    ----------
    min_repeats, max_period : int
        As for :func:`find`; the first lock is on ``find``'s repetition.
    max_extras : int or None
        Launches that break the period (EXTRA, RESTART) tolerated without an iteration completing; one more is a
        loss. None: ``max(len(period), 8)``, so that a few checkpoint launches or a broken iteration are not a
        loss, while another loop taking over is noticed after about one period.

    Raises
    ------
    ValueError
        A parameter out of range.
    """

    def __init__(self, min_repeats: int = 3, max_period: int = 256, max_extras: int | None = None):
        _check(min_repeats, max_period)
        if max_extras is not None and (not isinstance(max_extras, int) or max_extras < 0):
            raise ValueError(f"max_extras must be None or an integer >= 0, not {max_extras!r}")
        self.min_repeats, self.max_period, self.max_extras = min_repeats, max_period, max_extras
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next launch fed is launch 0 of a new stream."""
        self._index = 0
        self._search = _Search(self.min_repeats, self.max_period)
        self._repetition = None
        # Launches since the last completed iteration: what is searched again after a loss.
        self._history = deque(maxlen=self.min_repeats * self.max_period)
        self._replay = deque()
        self._position = self._strikes = self._limit = self._searching = 0
        self._iteration, self._open = -1, False
        self._extras_between = self._extras_inside = self._restarts = self._losses = 0

    def feed(self, signature: Hashable) -> Event:
        """Take the next launch and say what it is (:class:`Step` lists the kinds).

        O(1) once locked; while searching, O(earlier launches of the same signature among the last ``max_period``).
        A loss searches the launches since the last completed iteration again, at most ``min_repeats * max_period``.

        Parameters
        ----------
        signature : hashable
            The launch's signature, e.g. ``(symbol, grid, block)``.

        Returns
        -------
        Event
        """
        event = self._step(self._index, signature, report=True)
        self._index += 1
        while self._replay:
            self._step(*self._replay.popleft(), report=False)
        return event

    def _step(self, index: int, signature, report: bool) -> Event:
        if self._search is None:
            return self._follow(index, signature, report)
        self._searching += report
        found = self._search.push(index, signature)
        if found is not None:  # confirmed at the last launch of an iteration: position 0 comes next
            self._repetition, self._search = found, None
            self._history.clear()
            self._position = self._strikes = self._searching = 0
            self._iteration, self._open = -1, False
            self._limit = max(len(found.period), 8) if self.max_extras is None else self.max_extras
        return _SEARCHING

    def _follow(self, index: int, signature, report: bool) -> Event:
        period = self._repetition.period
        self._history.append((index, signature))
        position = self._position
        if signature == period[position]:
            kind = Step.BEGIN if position == 0 else Step.INSIDE
        elif signature == period[0]:
            kind, position = Step.RESTART, 0
        else:
            kind = Step.EXTRA
        if kind is Step.EXTRA or kind is Step.RESTART:
            self._strikes += 1
            if self._strikes > self._limit:
                return self._lose(report)
        if kind is Step.EXTRA:
            if not self._open:
                self._extras_between += report
                return Event(Step.EXTRA, between=True)
            self._extras_inside += report
            return Event(Step.EXTRA, self._iteration, position)
        if position == 0:
            if kind is Step.RESTART and not self._open:
                kind = Step.BEGIN  # nothing reported to abandon
            # Replayed launches are not reported, so the caller opens no iteration for them.
            if report:
                self._restarts += kind is Step.RESTART
                self._iteration += 1
                self._open = True
        last = position == len(period) - 1
        self._position = 0 if last else position + 1
        event = Event(kind, self._iteration, position, last) if self._open else _SEARCHING
        if last:
            self._open, self._strikes = False, 0
            self._history.clear()
        return event

    def _lose(self, report: bool) -> Event:
        self._losses += report
        # Searched again before the next launch; a loss among them puts its own history back in front.
        self._replay.extendleft(reversed(self._history))
        self._history.clear()
        self._repetition, self._open, self._searching = None, False, 0
        self._search = _Search(self.min_repeats, self.max_period)
        return _LOST

    @property
    def repetition(self) -> Repetition | None:
        """The repetition followed, None while searching."""
        return self._repetition

    @property
    def locked(self) -> bool:
        """Whether a repetition is followed."""
        return self._repetition is not None

    @property
    def searching_launches(self) -> int:
        """Launches fed while searching since the last lock or loss."""
        return self._searching

    @property
    def extras_between(self) -> int:
        """EXTRA launches reported while no iteration was open."""
        return self._extras_between

    @property
    def extras_inside(self) -> int:
        """EXTRA launches reported inside an open iteration."""
        return self._extras_inside

    @property
    def restarts(self) -> int:
        """RESTART launches reported."""
        return self._restarts

    @property
    def losses(self) -> int:
        """LOST launches reported."""
        return self._losses

    @property
    def held(self) -> int:
        """Launches remembered: at most ``max_period`` while searching, ``min_repeats * max_period`` once locked."""
        return len(self._history) + (len(self._search.window) if self._search is not None else 0)
