"""How a grid should use the cores: N trainings at a time with one thread each, or one at a time with N threads.

    python bench/grid_cores.py                                   # the stdlib grid's core rows, 40 steps each
    python bench/grid_cores.py --grid configs/grids/stdlib_bpe.py --runs dense routed --steps 20 --rounds 1

Takes runs of a grid file (seed 1), trains each for --steps steps with the grid's own train.py command (into a
temporary folder, no evaluation), once with --cores processes at a time of one thread each and once one at a
time with --cores threads, the two arrangements alternating over --rounds rounds. Prints the wall time of each
round and the tokens per second of all trainings together: the arrangement with more is what compare.py's
default --jobs should be.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanoaha.grid.gridfile import load_grid  # noqa: E402
from nanoaha.grid.plan import plan, train_argv  # noqa: E402


def train_all(commands, processes, threads):
    """Wall seconds to run every command, `processes` at a time, each with `threads` threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}

    def run(argv):
        result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-2000:]}")

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=processes) as pool:
        list(pool.map(run, commands))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", default="configs/grids/stdlib_bytes.py")
    parser.add_argument("--runs", nargs="+", default=["dense", "local", "LLLG", "routed"])
    parser.add_argument("--steps", type=int, default=40, help="training steps of each run")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if min(args.steps, args.cores, args.rounds) < 1:
        parser.error("--steps, --cores and --rounds must be at least 1")
    grid = load_grid(args.grid)
    unknown = set(args.runs) - set(grid.runs)
    if unknown:
        parser.error(f"no run {', '.join(sorted(unknown))} in {args.grid}; it has {', '.join(grid.runs)}")
    with tempfile.TemporaryDirectory() as out_root:
        jobs = {job.run: job for job in reversed(plan(grid, out_root)) if job.run in args.runs}  # lowest seed
        tokens, commands = 0, []
        for name in args.runs:
            job = jobs[name]
            tokens += args.steps * job.tcfg.batch_size * job.tcfg.grad_accum * job.mcfg.block_size
            commands.append(lambda i, job=job: train_argv(job, grid, out_root) + [
                f"--max_iters={args.steps}", f"--eval_interval={args.steps}", f"--log_interval={args.steps}",
                "--warmup_iters=1", f"--out_dir={os.path.join(out_root, f'{job.run}_{i}')}"])
        print(f"command: python {' '.join(sys.argv)}")
        print(f"{len(args.runs)} trainings of {args.steps} steps ({', '.join(args.runs)} of {args.grid}), "
              f"{tokens:,} tokens per round; {os.cpu_count()} CPU cores\n")
        print("| round | arrangement | wall s | tokens/s, all trainings |\n|---|---|---|---|")
        arrangements = [(f"{args.cores} at a time x 1 thread", args.cores, 1),
                        (f"1 at a time x {args.cores} threads", 1, args.cores)]
        totals = {name: 0.0 for name, _, _ in arrangements}
        run_index = 0
        for round_no in range(1, args.rounds + 1):
            order = arrangements if round_no % 2 else arrangements[::-1]
            for name, processes, threads in order:
                run_index += 1
                seconds = train_all([make(run_index) for make in commands], processes, threads)
                totals[name] += seconds
                print(f"| {round_no} | {name} | {seconds:.1f} | {tokens / seconds:,.0f} |", flush=True)
        (first, a), (second, b) = totals.items()
        print(f"\nall rounds: {first} {a:.1f} s, {second} {b:.1f} s: "
              f"{first if a < b else second} is {max(a, b) / min(a, b):.2f}x faster")


if __name__ == "__main__":
    main()
