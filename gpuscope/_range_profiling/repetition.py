"""Find the loop in a stream of kernel launches: the period and offset of a repeating sequence of signatures.

A signature is any hashable value; gpuscope uses ``(symbol, grid, block)``. A *repetition* is a stretch of the
stream made of ``min_repeats`` back-to-back copies of one sequence of at most ``max_period`` signatures. :func:`find`
gives the one confirmed first when the stream is read from the left (the shortest period if several are confirmed
by the same launch). It starts where its periodic stretch starts, which fixes the rotation: after setup launches
that end like the loop body, or a warm-up step that differs only in its first launches, the period starts inside
the body (loop ``A B F`` after a setup ending in ``F`` is found as ``F A B``).

A :class:`Tracker` locks on that first repetition, then prefers the one that covers the most launches: launches
its loop does not have (the matmul of ``scale scale scale matmul reduce``, the optimizer step after four
micro-batches, a kernel that the loop gains after warm-up) recur in every iteration of a longer loop, and once that
loop is confirmed the tracker relocks on it. A launch the followed loop does not have is a *strike*: a longer
repetition whose periodic stretch holds a strike replaces the followed one. A shorter one does not (the three
``fill`` launches inside a training step); too many strikes in a row without a completed iteration drop the lock
(another loop took over) and the search's answer is taken instead. Nested loops: the inner loop is found first,
then the outer one once it has repeated ``min_repeats`` times, if its body has at most ``max_period`` launches.

Algorithm: ``run[p]`` counts the launches ``k``, up to the current one, with ``s[k] == s[k - p]``; the stream is
p-periodic over its last ``run[p] + p`` launches, and ``min_repeats`` copies are confirmed when ``run[p]`` reaches
``(min_repeats - 1) * p`` (two copies, ``run[p] == p``, for a period of :data:`LONG_PERIOD` launches or more
that holds :data:`LONG_KINDS` different signatures or more). At launch ``i`` only the periods ``i - j``, for the
earlier launches ``j`` of the same signature, can extend their run; the other runs are left stale and read as 0.
Searching thus costs, per launch, the number of earlier occurrences of its signature among the last
``max_period`` launches, and holds at most ``max_period`` launches. The tracker searches on while it is locked, as
long as a strike came in the last ``min_repeats * max_period`` launches; after that many launches without one it
stops (O(1) per launch), keeping the launches since the lock (at most ``min_repeats * max_period``) so that the
next strike can search them again.

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

    #: No repetition followed. The launch that confirms one is SEARCHING too, and sets :attr:`Tracker.locked`: it
    #: ends an iteration of it, so the next launch that fits is the BEGIN of iteration 0.
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
    #: One EXTRA or RESTART more than ``max_extras`` without an iteration completing: the repetition is dropped, and
    #: the repetition the search confirms at this launch, if any, is followed from the next launch.
    LOST = "lost"
    #: The launch confirms a longer repetition whose stretch holds launches the followed one did not have: the open
    #: iteration, if any, is abandoned (this launch is in none), and the longer repetition is followed from the next
    #: launch, the BEGIN of its iteration 0 if it fits.
    RELOCK = "relock"

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
_RELOCK = Event(Step.RELOCK)
_BETWEEN = Event(Step.EXTRA, between=True)


def _check(min_repeats, max_period) -> None:
    if not isinstance(min_repeats, int) or min_repeats < 2:
        raise ValueError(f"min_repeats must be an integer >= 2 (copies needed to call it a loop), not {min_repeats!r}")
    if not isinstance(max_period, int) or max_period < 1:
        raise ValueError(f"max_period must be an integer >= 1, not {max_period!r}")


#: A period of at least this many launches, holding at least :data:`LONG_KINDS` different signatures, is confirmed
#: by two back-to-back copies instead of ``min_repeats``: a training script's step is long, its warm-up short, and the
#: first warm-up step unlike the others (the optimizer makes its state), so three copies are often not done before
#: the measured steps begin (the H100's PyTorch step: 69 launches of 36 kernels, 3 warm-up steps; confirmed at launch
#: 310, inside the first measured step, with three copies, at 241 with two). Few kinds are left to three copies: every
#: multiple of a short loop's period is a two-copy repetition, and so are long stretches of aperiodic streams of few
#: kernels (squares of the Thue-Morse sequence).
LONG_PERIOD, LONG_KINDS = 32, 8


class _Search:
    """The runs of every candidate period over the launches pushed so far (indices must be consecutive)."""

    def __init__(self, min_repeats: int, max_period: int):
        self.min_repeats = min_repeats
        self.window = deque(maxlen=max_period)  # only these launches can start a period ending at the next one
        self.seen = {}  # signature -> its indices in the window, oldest first
        self.run = [0] * (max_period + 1)
        self.updated = [-2] * (max_period + 1)  # run[p] holds only if updated at the previous index

    def push(self, index: int, signature) -> list | None:
        """Take launch *index*; the ``(period, run)`` of every repetition confirmed at it, longest first, or None."""
        confirmed = None
        need = self.min_repeats - 1
        runs, updated = self.run, self.updated
        for j in self.seen.get(signature, ()):
            p = index - j
            run = runs[p] + 1 if updated[p] == index - 1 else 1
            runs[p], updated[p] = run, index
            if run >= need * p or (run == p >= LONG_PERIOD and self._kinds(p) >= LONG_KINDS):
                if confirmed is None:
                    confirmed = []
                confirmed.append((p, run))
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
        return confirmed

    def _kinds(self, p: int) -> int:
        """Different signatures among the last *p* launches pushed (the period a two-copy repetition would have)."""
        return len(set(list(self.window)[-p:]))

    def repetition(self, index: int, p: int, run: int) -> Repetition:
        """The repetition of period *p* confirmed at *index* (the launch just pushed) with *run*, its iterations
        ending at *index*: the last p launches are the period, the next launch begins an iteration."""
        offset = index - run - p + 1 + run % p  # the stream is p-periodic from index - run - p + 1 on
        return Repetition(offset, tuple(self.window)[-p:], index, (index + 1 - offset) // p)


def find(signatures: Iterable[Hashable], *, min_repeats: int = 3, max_period: int = 256) -> Repetition | None:
    """The first repetition in a recorded stream of launch signatures, as :class:`Tracker` first locks on it.

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
        confirmed = search.push(index, signature)
        if confirmed:
            return search.repetition(index, *confirmed[-1])
    return None


class Tracker:
    """Finds the repetition in a stream of launches fed one at a time, then labels each launch with its place in it.

    Parameters
    ----------
    min_repeats, max_period : int
        As for :func:`find`; the first lock is on ``find``'s repetition, a relock on a longer one (module docstring).
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
        # Launches since the lock: searched again at a strike after the search stopped.
        self._history = deque(maxlen=self.min_repeats * self.max_period)
        self._position = self._strikes = self._limit = self._searching = self._locked_at = 0
        self._last_strike = -1  # index of the last EXTRA or RESTART since the lock
        self._iteration, self._open = -1, False
        self._extras_between = self._extras_inside = self._restarts = self._losses = self._relocks = 0

    def feed(self, signature: Hashable) -> Event:
        """Take the next launch and say what it is (:class:`Step` lists the kinds).

        While searching, and while locked with a strike among the last ``min_repeats * max_period`` launches:
        O(earlier launches of the same signature among the last ``max_period``). Otherwise O(1); the first strike
        after that searches the launches since the lock again (at most ``min_repeats * max_period``).

        Parameters
        ----------
        signature : hashable
            The launch's signature, e.g. ``(symbol, grid, block)``.

        Returns
        -------
        Event
        """
        index = self._index
        self._index += 1
        if self._repetition is None:
            self._searching += 1
            confirmed = self._search.push(index, signature)
            if confirmed:
                self._lock(index, confirmed[-1])
            return _SEARCHING
        self._history.append(signature)
        event = self._follow(index, signature)
        if self._search is not None:
            confirmed = self._search.push(index, signature)
            if index - max(self._last_strike, self._locked_at) >= self._history.maxlen:
                self._search = None  # every launch followed for that long: stop searching until the next strike
        elif self._last_strike == index:
            confirmed = self._search_again(index)
        else:
            return self._count(event)
        if event.kind is Step.LOST:
            self._losses += 1
            self._repetition, self._open = None, False
            self._history.clear()
            if confirmed:
                self._lock(index, confirmed[-1])
            return event
        longer = self._longer(index, confirmed) if confirmed else None
        if longer is None:
            return self._count(event)
        self._relocks += 1
        self._lock(index, longer)
        return _RELOCK

    def _count(self, event: Event) -> Event:
        kind = event.kind
        if kind is Step.EXTRA:
            if event.between:
                self._extras_between += 1
            else:
                self._extras_inside += 1
        elif kind is Step.RESTART:
            self._restarts += 1
        return event

    def _search_again(self, index: int):
        """A new search over the launches since the lock (the last one is *index*); what it confirms at *index*."""
        search = self._search = _Search(self.min_repeats, self.max_period)
        first = index - len(self._history) + 1
        confirmed = None
        for k, signature in enumerate(self._history):
            confirmed = search.push(first + k, signature)
        return confirmed

    def _longer(self, index: int, confirmed: list):
        """The longest repetition confirmed at *index* that is longer than the followed one and whose periodic
        stretch holds a strike one period or more from its start: a launch the followed one did not have, which
        recurs in the longer one (a strike where the stretch starts may only have set the followed one right)."""
        followed = len(self._repetition.period)
        for p, run in confirmed:  # longest first
            if p <= followed:
                return None
            if index - run + 1 <= self._last_strike:
                return p, run
        return None

    def _lock(self, index: int, confirmed: tuple) -> None:
        p, run = confirmed
        self._repetition = self._search.repetition(index, p, run)
        self._history.clear()
        self._position = self._strikes = self._searching = 0
        self._last_strike, self._locked_at = -1, index
        self._iteration, self._open = -1, False
        self._limit = max(p, 8) if self.max_extras is None else self.max_extras

    def _follow(self, index: int, signature) -> Event:
        period = self._repetition.period
        position = self._position
        if signature == period[position]:
            kind = Step.BEGIN if position == 0 else Step.INSIDE
        elif signature == period[0]:
            kind, position = Step.RESTART, 0
        else:
            kind = Step.EXTRA
        if kind is Step.EXTRA or kind is Step.RESTART:
            self._strikes += 1
            self._last_strike = index
            if self._strikes > self._limit:
                return _LOST
        if kind is Step.EXTRA:
            return Event(Step.EXTRA, self._iteration, position) if self._open else _BETWEEN
        if position == 0:
            if kind is Step.RESTART and not self._open:
                kind = Step.BEGIN  # nothing reported to abandon
            self._iteration += 1
            self._open = True
        last = position == len(period) - 1
        self._position = 0 if last else position + 1
        event = Event(kind, self._iteration, position, last)
        if last:
            self._open, self._strikes = False, 0
        return event

    @property
    def repetition(self) -> Repetition | None:
        """The repetition followed, None while searching."""
        return self._repetition

    @property
    def locked(self) -> bool:
        """Whether a repetition is followed."""
        return self._repetition is not None

    @property
    def launches(self) -> int:
        """Launches fed since the last :meth:`reset`: the index the next launch will have."""
        return self._index

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
    def relocks(self) -> int:
        """RELOCK launches reported."""
        return self._relocks

    @property
    def held(self) -> int:
        """Launches remembered: at most ``max_period`` searched and ``min_repeats * max_period`` since the lock."""
        return len(self._history) + (len(self._search.window) if self._search is not None else 0)
