"""The launch-stream tracker of auto mode (gpuscope._range_profiling.repetition) on the CPU: time per launch fed.

Run from the repository root (no GPU)::

    python3 benchmarks/bench_repetition.py --repeat 3

Streams of (symbol, grid, block) as auto mode feeds them: a 3-kernel loop followed throughout, a period-1 loop (the
dearest to search: every launch is a copy of the last 256), the 3-kernel loop with a checkpoint at irregular steps
(a strike now and then keeps the search going), an inner loop that a longer one takes over, and a PyTorch-like
script (weight initialisation, then a 76-launch step). Prints the best of ``--repeat`` runs, in microseconds per
launch, with the tracker's relocks and losses.
"""

from __future__ import annotations

import argparse
import time

from gpuscope._range_profiling.repetition import Tracker


def launch(name: str, grid: int = 1024) -> tuple:
    return (f"_Z{len(name)}{name}Pf", (grid, 1, 1), (256, 1, 1))


def irregular_checkpoints(steps: int) -> list:
    out, due, gap = [], 4, 6
    body = [launch("add"), launch("scale"), launch("triad")]
    for step in range(steps):
        out += body
        if step == due:
            out.append(launch("checkpoint", 1))
            due, gap = due + gap, gap + 1
    return out


def pytorch_like(steps: int) -> list:
    fill = launch("fill", 512)
    init = [launch(f"init_{i}", 64 + i) for i in range(9)] + [fill] * 3 + [launch(f"init2_{i}") for i in range(14)]
    step = [fill] * 3 + [launch(f"fwd_{i}") for i in range(34)] + [launch("add", 4096)] * 3
    step += [launch(f"bwd_{i}") for i in range(32)] + [launch("adamw", 320)] * 2 + [launch("norm", 1)] * 2
    return init + step * steps


STREAMS = {
    "3-kernel loop, followed throughout": [launch("add"), launch("scale"), launch("triad")] * 20_000,
    "period 1, followed throughout": [launch("axpy")] * 60_000,
    "3-kernel loop, irregular checkpoints": irregular_checkpoints(20_000),
    "scale x3 + matmul + reduce (relocks)": ([launch("scale")] * 3 + [launch("matmul", 16), launch("reduce", 1)])
    * 12_000,
    "PyTorch-like: init, then 76-launch steps": pytorch_like(800),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name, stream in STREAMS.items():
        best = float("inf")
        for _ in range(args.repeat):
            tracker = Tracker()
            feed = tracker.feed
            start = time.perf_counter()
            for signature in stream:
                feed(signature)
            best = min(best, time.perf_counter() - start)
        print(f"{name:44s} {len(stream):7d} launches  {best / len(stream) * 1e6:6.2f} us/launch  "
              f"relocks {tracker.relocks}  losses {tracker.losses}")


if __name__ == "__main__":
    main()
