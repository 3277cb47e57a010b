"""The engine's decode steps alone and beside a process that takes a share of one core in bursts, as the serving
path does per token (perf/README "Served"): how much of a step the other work costs.

On two cores, if the engine lost only the CPU the other process takes, a step would grow by 2 / (2 - share); if a
step waited whenever either of its two threads is off its core (each of a step's barriers waits for the
descheduled one), by 1 / (1 - share). Three rounds of: no competitor, 0.75 ms of every 3.5 (the serving path's
CPU per token at one stream), 1.75 of every 3.5.

    .venv/bin/python perf/interference_steps.py [qformat]      # build/checkpoints/small-<qformat>, default fp8
"""
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "perf")]
import engine_bench  # noqa: E402
from toolkit.engine.runtime.model_runner import ModelRunner  # noqa: E402


def competitor(busy_ms: float, period_ms: float, stop) -> None:
    """Spin busy_ms of every period_ms until stopped."""
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < busy_ms / 1e3:
            pass
        time.sleep(max(0.0, (period_ms - busy_ms) / 1e3))


def main() -> None:
    checkpoint = ROOT / "build" / "checkpoints" / f"small-{sys.argv[1] if len(sys.argv) > 1 else 'fp8'}"
    runner = ModelRunner(checkpoint, num_blocks=64 * 8, block_size=engine_bench.BLOCK, native=True)
    runner.warm_up(8, 128)
    for round_ in range(3):
        for busy, period in ((0.0, 1.0), (0.75, 3.5), (1.75, 3.5)):
            stop, other = mp.Event(), None
            if busy:
                other = mp.Process(target=competitor, args=(busy, period, stop))
                other.start()
                time.sleep(0.2)
            steps = [min(engine_bench.median_step(runner, batch, 128, 32) for _ in range(3)) * 1e3 for batch in (1, 8)]
            if other:
                stop.set()
                other.join()
            share = busy / period
            print(f"round {round_}, the other process {share:.2f} of a core: step B=1 {steps[0]:.2f} ms, B=8 "
                  f"{steps[1]:.2f} ms (lost CPU only x{2 / (2 - share):.2f}, barrier-coupled x{1 / (1 - share):.2f})",
                  flush=True)


if __name__ == "__main__":
    main()
