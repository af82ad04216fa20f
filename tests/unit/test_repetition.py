"""Finding the repeated loop body in a stream of kernel launches (gpuscope._range_profiling.repetition: pure logic, no GPU)."""

import doctest
import random

import pytest

import gpuscope._range_profiling.repetition
from gpuscope._range_profiling.repetition import Event, Repetition, Step, Tracker, find


def launch(name: str, grid=(1024, 1, 1), block=(256, 1, 1)) -> tuple:
    return (f"_Z{len(name)}{name}PfS_S_i", grid, block)


A, B, C = launch("stream_add"), launch("stream_scale", (2048, 1, 1)), launch("stream_triad")
D, E = launch("gemm_tile", (32, 32, 1), (16, 16, 1)), launch("softmax_rows", (512, 1, 1), (128, 1, 1))
FILL, COPY, FILL_BIG = launch("fill"), launch("copy_h2d"), launch("fill", (4096, 1, 1))
FINAL, CHECKPOINT, REDUCE = launch("finalize"), launch("checkpoint", (1, 1, 1)), launch("reduce_sum", (1, 1, 1))
ABC = [A, B, C]


def kernels(n: int) -> list:
    return [launch(f"k{i}") for i in range(n)]


def thue_morse(n: int) -> list:
    """Overlap-free, hence cube-free: no stretch is three copies of anything."""
    return [B if i.bit_count() % 2 else A for i in range(n)]


def with_checkpoints(steps: int) -> list:
    out = []
    for step in range(steps):
        out += ABC + ([CHECKPOINT] if step % 10 == 9 else [])
    return [*out, REDUCE]


def nested(blocks: int) -> list:
    return (ABC * 5 + [D, E] * 5) * blocks


STREAMS = {
    "plain": (ABC * 30, {}),
    "setup": ([FILL, COPY, FILL_BIG] + ABC * 30, {}),
    "setup_ends_like_body": ([FILL, FINAL] + [A, B, FINAL] * 30 + [REDUCE], {}),
    "warmup_grid": ([launch("stream_add", (8, 1, 1))] + [B, C] + ABC * 30, {}),
    "warmup_extra_kernel": ([A, launch("autotune")] + [B, C] + ABC * 30, {}),
    "checkpoints": (with_checkpoints(30), {}),
    "extra_inside": (ABC * 10 + [A, CHECKPOINT, B, C] + ABC * 10, {}),
    "break": (ABC * 10 + [A, B] + ABC * 10, {}),
    "two_loops": (ABC * 20 + [D, E] * 20, {}),
    "nested": (nested(4), {}),
    "nested_outer": (nested(8), {"min_repeats": 6}),
    "distinct": (kernels(500), {}),
    "thue_morse": (thue_morse(2048), {"max_period": 64}),
    "random5": (random.Random(7).choices(kernels(5), k=400), {}),
    "grids_alternate": ([A, launch("stream_add", (512, 1, 1))] * 20, {}),
    "period_1": ([D] * 100, {}),
    "body_at_max_period": (kernels(256) * 3, {}),
    "body_over_max_period": (kernels(257) * 3, {}),
}
CODES = {Step.SEARCHING: "s", Step.BEGIN: "B", Step.INSIDE: "i", Step.RESTART: "R", Step.LOST: "L", Step.RELOCK: "O"}


def reference(stream, min_repeats=3, max_period=256):
    """The definition, checked directly: the first launch ending min_repeats copies of a period (two of a period of
    LONG_PERIOD launches or more holding LONG_KINDS different signatures or more), shortest period."""
    from gpuscope._range_profiling.repetition import LONG_KINDS, LONG_PERIOD

    for i in range(len(stream)):
        for p in range(1, max_period + 1):
            if i - 2 * p + 1 < 0:
                break
            long = p >= LONG_PERIOD and len(set(stream[i - p + 1 : i + 1])) >= LONG_KINDS
            copies = 2 if long else min_repeats
            start = i - copies * p + 1
            if start < 0:
                continue
            if all(stream[k] == stream[k - p] for k in range(start + p, i + 1)):
                return Repetition(start, tuple(stream[start : start + p]), i, copies)
    return None


def run(stream, **kwargs):
    tracker = Tracker(**kwargs)
    return tracker, [tracker.feed(s) for s in stream]


def codes(events) -> str:
    """One letter per event; EXTRA is x between iterations, X inside one."""
    return "".join(("x" if e.between else "X") if e.kind is Step.EXTRA else CODES[e.kind] for e in events)


def test_plain_loop():
    tracker, events = run(ABC * 30)
    assert tracker.repetition == Repetition(offset=0, period=(A, B, C), found_at=8, repeats=3)
    assert codes(events) == "s" * 9 + "Bii" * 27
    assert events[9] == Event(Step.BEGIN, iteration=0, position=0, last=False)
    assert events[10] == Event(Step.INSIDE, iteration=0, position=1, last=False)
    assert events[11] == Event(Step.INSIDE, iteration=0, position=2, last=True)
    assert events[89] == Event(Step.INSIDE, iteration=26, position=2, last=True)
    counts = (tracker.extras_between, tracker.extras_inside, tracker.restarts, tracker.losses)
    assert counts == (0, 0, 0, 0)


def test_lock_is_reported_on_the_confirming_launch():
    tracker = Tracker()
    for s in ABC * 2 + [A, B]:
        assert tracker.feed(s) == Event(Step.SEARCHING)
    assert not tracker.locked and tracker.searching_launches == 8
    assert tracker.feed(C) == Event(Step.SEARCHING)
    assert tracker.locked and tracker.searching_launches == 0


def test_setup_launches_before_the_loop():
    tracker, events = run(STREAMS["setup"][0])
    assert tracker.repetition == Repetition(3, (A, B, C), 11, 3)
    assert codes(events) == "s" * 12 + "Bii" * 27


def test_setup_ending_like_the_body_rotates_the_period():
    # fill, F, then (A B F) x 30: the stream is periodic from the setup's F, so the period is F A B. Every labelled
    # launch still holds the period's signature; the loop's last F begins an iteration that the reduction spoils.
    stream = STREAMS["setup_ends_like_body"][0]
    tracker, events = run(stream)
    assert tracker.repetition == Repetition(1, (FINAL, A, B), 9, 3)
    assert codes(events) == "s" * 10 + "Bii" * 27 + "B" + "X"
    assert events[-1] == Event(Step.EXTRA, iteration=27, position=1)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # The period starts after the last launch that differs from one period later.
        ("warmup_grid", Repetition(1, (B, C, A), 9, 3)),
        ("warmup_extra_kernel", Repetition(2, (B, C, A), 10, 3)),
    ],
)
def test_warmup_step_that_differs(name, expected):
    tracker, events = run(STREAMS[name][0])
    assert tracker.repetition == expected
    rest = len(events) - expected.found_at - 1
    assert codes(events) == "s" * (expected.found_at + 1) + ("Bii" * 30)[:rest]
    assert events[-1] == Event(Step.INSIDE, iteration=27, position=1)  # the loop's last B C: an iteration left open


def irregular_checkpoints(steps: int) -> list:
    """A checkpoint after steps 4, 10, 17, 25, ...: gaps that grow, so no longer loop holds them."""
    out, due, gap = [], 4, 6
    for step in range(steps):
        out += ABC
        if step == due:
            out.append(CHECKPOINT)
            due, gap = due + gap, gap + 1
    return out


def test_checkpoints_between_iterations_are_extras_not_losses():
    # Ten checkpoints, more than max_extras (8): each completed iteration forgives the strikes before it.
    stream = irregular_checkpoints(100)
    tracker, events = run(stream)
    assert codes(events) == "s" * 9 + "".join("x" if s == CHECKPOINT else "B" if s == A else "i" for s in stream[9:])
    assert (tracker.extras_between, tracker.extras_inside, tracker.losses, tracker.relocks) == (10, 0, 0, 0)
    assert tracker.repetition == Repetition(0, (A, B, C), 8, 3)


def test_a_checkpoint_every_ten_steps_is_an_outer_loop():
    # Checkpoints after steps 9, 19 and 29: (A B C) x 10 + checkpoint repeats three times, so the tracker relocks on
    # it at the third checkpoint, and the launch after it (the reduction) is the only one left out.
    tracker, events = run(with_checkpoints(30))
    assert codes(events) == "s" * 9 + "".join("Bii" + ("x" if step % 10 == 9 else "") for step in range(3, 29)) \
        + "BiiO" + "x"
    assert tracker.repetition == Repetition(0, tuple(ABC * 10 + [CHECKPOINT]), 92, 3)
    assert (tracker.extras_between, tracker.losses, tracker.relocks) == (3, 0, 1)


def test_extra_inside_an_iteration_keeps_the_expected_position():
    tracker, events = run(STREAMS["extra_inside"][0])
    assert codes(events) == "s" * 9 + "Bii" * 7 + "BXii" + "Bii" * 10
    assert events[31] == Event(Step.EXTRA, iteration=7, position=1)  # spoiled from position 1 on
    assert events[32] == Event(Step.INSIDE, iteration=7, position=1)
    assert events[33] == Event(Step.INSIDE, iteration=7, position=2, last=True)
    assert events[34] == Event(Step.BEGIN, iteration=8, position=0)
    assert (tracker.extras_between, tracker.extras_inside, tracker.losses) == (0, 1, 0)


def test_break_in_one_iteration_restarts():
    tracker, events = run(STREAMS["break"][0])
    assert codes(events) == "s" * 9 + "Bii" * 7 + "Bi" + "Rii" + "Bii" * 9
    assert events[32] == Event(Step.RESTART, iteration=8, position=0)
    assert events[35] == Event(Step.BEGIN, iteration=9, position=0)
    assert (tracker.restarts, tracker.losses) == (1, 0)


def test_two_loops_one_after_another():
    stream = STREAMS["two_loops"][0]
    tracker, events = run(stream)
    # 9 launches of the second loop (more than max(3, 8)) lose the first; the search, which went on, has confirmed the
    # second (shorter: no relock before), and the tracker follows it from the next launch, which begins an iteration:
    # the period is the last two launches, (E, D).
    assert codes(events) == "s" * 9 + "Bii" * 17 + "x" * 8 + "L" + "Bi" * 15 + "B"
    assert tracker.repetition == Repetition(61, (E, D), 68, 4)
    found = find(stream[60:])
    assert (found.offset + 60, found.period, found.found_at + 60) == (60, (D, E), 65)
    assert events[69] == Event(Step.BEGIN, iteration=0, position=0)
    assert (tracker.extras_between, tracker.losses, tracker.relocks) == (8, 1, 0)


def test_a_loop_sharing_its_first_kernel_is_lost_through_restarts():
    # (A D) after (A B C): every A restarts, every D is an extra; together they count toward the loss.
    tracker, events = run(ABC * 10 + [A, D] * 20)
    assert codes(events) == "s" * 9 + "Bii" * 7 + "BX" + "RX" * 3 + "RL" + "Bi" * 15
    assert tracker.repetition == Repetition(30, (A, D), 39, 5)
    assert (tracker.restarts, tracker.extras_inside, tracker.losses) == (4, 4, 1)


def test_max_extras():
    tracker, events = run(ABC * 10 + [D, E] * 10, max_extras=2)
    assert codes(events) == "s" * 9 + "Bii" * 7 + "xxL" + "sss" + "Bi" * 7
    assert tracker.repetition == Repetition(30, (D, E), 35, 3)
    tracker, events = run(with_checkpoints(15), max_extras=0)
    # Lost at the checkpoint, found again on steps 10-12, lost again at the reduction.
    assert codes(events[27:]) == "BiiL" + "s" * 9 + "Bii" * 2 + "L"
    assert (tracker.losses, tracker.locked) == (2, False)


def test_nested_loops_inner_loops_in_turn_then_the_outer_loop():
    # Outer loop (ABC x 5, DE x 5) x 4. With min_repeats=3 each inner loop is found in turn: ABC x 5 gives two
    # reported iterations; DE x 5, locked at the loss of ABC, begins one that the next ABC spoils. Once the outer body
    # has repeated three times (launch 74), the next strike relocks on it (launch 75, so the period begins with B),
    # and every later launch is in its iterations.
    tracker, events = run(nested(4))
    inner = "xxxxxxxxL" + "B" + "X" * 8 + "L" + "BiiBii"
    assert codes(events) == "s" * 9 + "BiiBii" + inner * 2 + "xxxxxxxxL" + "B" + "O" + "B" + "i" * 23
    assert tracker.repetition == Repetition(1, tuple(nested(1)[1:] + nested(1)[:1]), 75, 3)
    assert (tracker.losses, tracker.relocks) == (5, 1)


def test_nested_loops_outer_period_when_inner_loops_repeat_too_few_times():
    tracker, events = run(nested(8), min_repeats=6)
    assert tracker.repetition == Repetition(0, tuple(nested(1)), 149, 6)
    assert codes(events) == "s" * 150 + ("B" + "i" * 24) * 2


@pytest.mark.parametrize("name", ["distinct", "thue_morse"])
def test_no_repetition_never_locks(name):
    stream, kwargs = STREAMS[name]
    tracker, events = run(stream, **kwargs)
    assert codes(events) == "s" * len(stream)
    assert tracker.repetition is None and tracker.searching_launches == len(stream)
    assert find(stream, **kwargs) is None


def test_thue_morse_has_squares():
    # Cube-free, not square-free: two copies are found, which shows the bound on copies is what stops the search.
    assert find(thue_morse(64), min_repeats=2) == Repetition(1, (B,), 2, 2)  # A B B


def test_same_kernel_alternating_grids_has_period_two():
    stream = STREAMS["grids_alternate"][0]
    assert find(stream) == Repetition(0, tuple(stream[:2]), 5, 3)


def test_period_one():
    tracker, events = run([D] * 100)
    assert tracker.repetition == Repetition(0, (D,), 2, 3)
    assert events[3:] == [Event(Step.BEGIN, iteration=k, position=0, last=True) for k in range(97)]


def test_max_period_bound():
    body = kernels(256)
    assert find(body * 3) == Repetition(0, tuple(body), 511, 2)  # a long period of many kernels: two copies
    assert find(kernels(257) * 3) is None
    assert find(kernels(257) * 3, max_period=257).found_at == 513
    tracker, _ = run(kernels(257) * 3)
    assert not tracker.locked


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_find_agrees_with_tracker_and_definition(name):
    stream, kwargs = STREAMS[name]
    expected = reference(stream, **kwargs)
    assert find(stream, **kwargs) == expected
    tracker = Tracker(**kwargs)
    for index, signature in enumerate(stream):
        tracker.feed(signature)
        if tracker.locked:
            break
    assert tracker.repetition == expected
    if expected is not None:
        assert index == expected.found_at


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_no_mislabel(name):
    stream, kwargs = STREAMS[name]
    tracker = Tracker(**kwargs)
    for signature in stream:
        event = tracker.feed(signature)
        if event.kind in (Step.BEGIN, Step.INSIDE, Step.RESTART):
            assert tracker.repetition.period[event.position] == signature
            assert event.last == (event.position == len(tracker.repetition.period) - 1)


def perturbed_loops(rng: random.Random, length: int) -> list:
    """Random noise and loops of random bodies, some iterations with an extra launch or cut short."""
    pool, out = kernels(6), []
    while len(out) < length:
        if rng.random() < 0.3:
            out += rng.choices(pool, k=rng.randint(1, 6))
            continue
        body = rng.choices(pool, k=rng.randint(1, 7))
        for _ in range(rng.randint(1, 12)):
            step = list(body)
            if rng.random() < 0.2:
                step.insert(rng.randrange(len(step) + 1), rng.choice(pool))
            if rng.random() < 0.1:
                step = step[: rng.randrange(len(step))]
            out += step
    return out


def test_random_streams_agree_with_the_definition():
    rng = random.Random(1)
    for _ in range(300):
        stream = perturbed_loops(rng, 120)
        kwargs = {"min_repeats": rng.choice([2, 3, 4]), "max_period": rng.choice([3, 8, 30])}
        assert find(stream, **kwargs) == reference(stream, **kwargs)


def test_events_follow_the_protocol():
    # What a caller relies on: BEGIN and EXTRA-between only with no iteration open; RESTART, INSIDE and EXTRA-inside
    # only in the open one, at the next position; last or LOST closes it; iterations numbered in turn from each lock.
    rng = random.Random(2)
    for _ in range(300):
        tracker = Tracker(rng.choice([2, 3]), rng.choice([8, 30]), rng.choice([None, 0, 2]))
        open_iteration, expected, previous = None, 0, -1
        for signature in perturbed_loops(rng, 200):
            event = tracker.feed(signature)
            kind = event.kind
            if kind is Step.BEGIN:
                assert open_iteration is None and event.position == 0 and event.iteration in (previous + 1, 0)
            elif kind is Step.RESTART:
                assert open_iteration is not None and (event.iteration, event.position) == (open_iteration + 1, 0)
            elif kind is Step.INSIDE:
                assert (event.iteration, event.position) == (open_iteration, expected)
            elif kind is Step.EXTRA:
                assert event.between == (open_iteration is None)
                assert event.between or (event.iteration, event.position) == (open_iteration, expected)
            else:  # LOST and RELOCK close the open iteration; SEARCHING comes with none open
                assert kind in (Step.LOST, Step.RELOCK) or open_iteration is None
                open_iteration = None
            if kind in (Step.BEGIN, Step.RESTART, Step.INSIDE):
                assert tracker.repetition.period[event.position] == signature
                open_iteration = None if event.last else event.iteration
                expected, previous = event.position + 1, event.iteration


def test_memory_stays_bounded_over_a_long_random_stream():
    rng = random.Random(3)
    pool = kernels(200)
    tracker = Tracker()
    bound = (tracker.min_repeats + 1) * tracker.max_period  # launches since the lock, and the search's window
    launches = locks = 0
    for _ in range(70):  # random stretches and loops of random bodies: both states, losses and searches again
        stream = rng.choices(pool, k=1000) + rng.choices(pool, k=rng.randint(1, 40)) * 25
        for signature in stream:
            was_locked = tracker.locked
            tracker.feed(signature)
            launches += 1
            locks += tracker.locked and not was_locked
            assert tracker.held <= bound
    assert (launches, locks, tracker.losses) == (101_250, 71, 70)
    distinct = Tracker(max_period=64)
    for signature in kernels(100_000):
        distinct.feed(signature)
    assert distinct.held == 64
    assert len(distinct._search.seen) == 64  # signatures out of the window are forgotten, not kept as empty lists


def test_reset_starts_a_new_stream():
    tracker, first = run(STREAMS["two_loops"][0])
    tracker.reset()
    assert not tracker.locked and tracker.losses == 0 and tracker.held == 0
    assert [tracker.feed(s) for s in STREAMS["two_loops"][0]] == first


def test_step_is_a_string():
    assert Step("begin") is Step.BEGIN and Step.BEGIN == "begin" and str(Step.LOST) == "lost"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_repeats": 1}, "min_repeats must be an integer >= 2"),
        ({"max_period": 0}, "max_period must be an integer >= 1"),
        ({"max_extras": -1}, "max_extras must be None or an integer >= 0"),
    ],
)
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Tracker(**kwargs)
    if "max_extras" not in kwargs:
        with pytest.raises(ValueError, match=message):
            find([], **kwargs)


def test_docstring_example():
    assert doctest.testmod(gpuscope._range_profiling.repetition).attempted == 4
    assert doctest.testmod(gpuscope._range_profiling.repetition).failed == 0


def test_a_launch_stream_recorded_on_the_h100():
    """The launches of gpuscope's demo, recorded in kernel mode on an H100 (15 launches: 5 steps of 3 kernels)."""
    from pathlib import Path

    import gpuscope as gs

    ds = gs.open_dataset(Path(gs.__file__).parent / "data" / "demo_launches.nc")
    stream = [(str(k), (int(gx), int(gy), int(gz)), (int(bx), int(by), int(bz))) for k, gx, gy, gz, bx, by, bz in zip(
        ds.kernel.values, ds.grid_x.values, ds.grid_y.values, ds.grid_z.values, ds.block_x.values, ds.block_y.values,
        ds.block_z.values)]
    assert len(stream) == 15
    rep = find(stream)
    assert (rep.offset, len(rep.period), rep.found_at) == (0, 3, 8)
    assert [s[0] for s in rep.period] == ["stream", "fma", "divergent"]
    tracker = Tracker()
    kinds = [str(tracker.feed(s).kind) for s in [("fill", (64, 1, 1), (256, 1, 1))] + stream]
    assert kinds[:10] == ["searching"] * 10 and kinds[10:] == ["begin", "inside", "inside"] * 2


# -- the loop the script really runs (issue 36 item 3, issue 33 item 1) ---------------------------------------------
SCALE, MATMUL, REDUCE_ROWS = launch("scale"), launch("matmul", (16, 16, 1), (16, 16, 1)), launch("reduce_rows")
FWD, BWD, ADAM = launch("forward", (128, 1, 1)), launch("backward", (256, 1, 1)), launch("adam_step", (40, 1, 1))
FILL_BUF, RELU, SOFTMAX, LOG = launch("fill_buf"), launch("relu"), launch("softmax_rows"), launch("log_values")


def labelled(events) -> int:
    """Launches given a place in an iteration."""
    return sum(e.kind in (Step.BEGIN, Step.INSIDE, Step.RESTART) for e in events)


def is_rotation(period, body) -> bool:
    return len(period) == len(body) and any(tuple(body[k:] + body[:k]) == tuple(period) for k in range(len(body)))


@pytest.mark.parametrize(("setup", "body", "steps"), [
    ([], [SCALE] * 3 + [MATMUL, REDUCE_ROWS], 1000),  # locked on (scale,): matmul and reduce never profiled
    ([], [FWD, BWD] * 4 + [ADAM], 200),  # gradient accumulation: adam never profiled
    ([FILL_BUF] * 3, [FILL_BUF, D, RELU, D, SOFTMAX], 200),  # setup fills, then a loop that starts with one
    ([A, B, C] * 5, [A, B, C, LOG], 200),  # the loop gains a kernel after warm-up: log never profiled
])
def test_the_outer_loop_takes_over_from_an_inner_one(setup, body, steps):
    stream = setup + body * steps
    tracker, events = run(stream)
    assert is_rotation(tracker.repetition.period, body)
    relocked = next(i for i, e in enumerate(events) if e.kind is Step.RELOCK)
    assert relocked < len(setup) + 4 * len(body)  # three copies of the body, and at most one launch more
    assert labelled(events[relocked + 1:]) == len(stream) - relocked - 1  # every later launch in an iteration
    assert {s for s, e in zip(stream, events) if e.kind in (Step.BEGIN, Step.INSIDE)} == set(body)
    assert (tracker.relocks, tracker.losses) == (1, 0)


def pytorch_like_stream(steps: int = 23) -> tuple[list, list]:
    """A transformer training script as the driver sees it: weight initialisation whose fills of equal tensors make
    a period-1 repetition at launch 11 (as in issue 33), then a 76-launch step (3 warm-up steps, 20 measured). The
    step has short repetitions of its own: three grad fills of one shape at its start (the initialisation's fill),
    three equal elementwise launches in the backward pass, and pairs that repeat only twice."""
    fill = launch("vectorized_elementwise_kernel_fill", (512, 1, 1), (128, 1, 1))
    init = [launch(f"init_normal_{i}", (64 + i, 1, 1)) for i in range(9)] + [fill] * 3
    init += [launch(f"init_uniform_{i}", (32 + i, 1, 1)) for i in range(14)]
    forward = [launch("embedding"), launch("layer_norm")] + [launch("gemm_qkv", (48, 8, 1)), launch("bias_add")] * 2
    forward += [launch(f"attention_{i}", (96, 1, 1)) for i in range(12)] + [launch("softmax_fwd"), launch("dropout")]
    forward += [launch(f"mlp_fwd_{i}") for i in range(13)] + [launch("cross_entropy_fwd")]
    backward = [launch("cross_entropy_bwd")] + [launch("elementwise_add", (1024, 1, 1))] * 3
    backward += [launch(f"mlp_bwd_{i}") for i in range(17)] + [launch(f"attention_bwd_{i}") for i in range(14)]
    step = [fill] * 3 + forward + backward + [launch("multi_tensor_apply_adamw", (320, 1, 1))] * 2
    step += [launch("norm_reduce", (1, 1, 1))] * 2
    assert len(step) == 76
    return init + step * steps, step


def test_a_pytorch_like_script_is_followed_by_its_training_step():
    stream, step = pytorch_like_stream()
    init = len(stream) - 23 * 76
    assert find(stream) == Repetition(9, (stream[9],), 11, 3)  # the first repetition: three fills in the init
    tracker, events = run(stream)
    assert is_rotation(tracker.repetition.period, step)
    measured = events[init + 3 * 76:]  # after the three warm-up steps
    assert labelled(measured) == len(measured)  # every launch of the 20 measured steps is in an iteration
    assert tracker.repetition.found_at < init + 3 * 76 + 76  # locked on the step by the end of the fourth step
    assert tracker.relocks + tracker.losses <= 8


def test_a_short_repetition_among_extras_does_not_take_over():
    # A 76-launch step is followed; one step launches three equal extra kernels (the optimizer's first step making its
    # state): a shorter repetition confirmed among launches the step does not have. The step stays followed.
    plain, step = pytorch_like_stream(10)
    extra = launch("zeros_like_state", (77, 1, 1))
    stream = plain[: -5 * 76] + [extra] * 3 + plain[-5 * 76:]
    tracker, events = run(stream)
    without, _ = run(plain)
    assert is_rotation(tracker.repetition.period, step) and tracker.repetition == without.repetition
    assert (tracker.losses, tracker.relocks) == (without.losses, without.relocks)  # neither lost nor relocked there
    assert [codes([e]) for s, e in zip(stream, events) if s == extra] == ["x"] * 3


def test_a_loop_the_tracker_follows_entirely_stops_the_search():
    # Period 1 is the dearest to search (every launch is an earlier one's copy): once the lock has followed every
    # launch for min_repeats * max_period launches, the search stops; a strike makes it search those launches again.
    tracker = Tracker()
    for _ in range(3 * 256 + 10):
        tracker.feed(D)
    assert tracker._search is None and tracker.held == 3 * 256
    for _ in range(300):
        tracker.feed(D)
    assert tracker._search is None and tracker.held == 3 * 256
    tracker.feed(E)  # a strike: the launches since the lock are searched again
    assert tracker._search is not None and tracker.held == 3 * 256 + 256
    stream = ([D] * 40 + [E]) * 4  # the strike recurs: D x 40 + E is the loop now
    events = [tracker.feed(s) for s in stream]
    assert tracker.repetition.period == tuple([D] * 40 + [E]) and tracker.relocks == 1
    assert codes(events[-41:]) == "B" + "i" * 40


# -- long periods: two copies (a training step with a short warm-up) -------------------------------------------------
def test_a_long_period_of_many_kernels_is_confirmed_on_two_copies():
    body = kernels(40)  # 40 launches of 40 kernels
    setup = [launch("init", (7, 1, 1))] * 2
    rep = find(setup + body * 5)
    assert rep == Repetition(2, tuple(body), 2 + 2 * 40 - 1, 2)
    tracker, events = run(setup + body * 5)
    assert codes(events) == "s" * 82 + ("B" + "i" * 39) * 3


def test_a_long_period_of_few_kernels_still_needs_three_copies():
    # 36 launches of 2 kernels, with no three copies of anything inside: two copies of such a stretch happen in
    # aperiodic streams of few kernels (test_no_repetition_never_locks), so it takes three
    body = thue_morse(36)
    assert len(set(body)) == 2 and find(body * 2) is None
    assert find(body * 3) == Repetition(0, tuple(body), 3 * 36 - 1, 3)


def test_a_setup_block_repeated_twice_is_followed_until_the_loop_takes_over():
    # two identical initialisation blocks of many kernels (two layers made alike), then the training step: the
    # tracker locks on the block, loses it when the step begins, and follows the step from its second copy on
    block = [launch(f"init_{i}", (8 + i, 1, 1)) for i in range(40)]
    step = [launch(f"step_{i}", (64 + i, 1, 1)) for i in range(50)]
    stream = block * 2 + step * 10
    tracker, events = run(stream)
    assert tracker.repetition.period == tuple(step) and tracker.repetition.found_at == 80 + 2 * 50 - 1
    assert tracker.losses == 1
    after = events[tracker.repetition.found_at + 1:]
    assert labelled(after) == len(after) == 8 * 50  # every later step in an iteration
