"""What a server start costs: seconds to SERVING and the CPU-seconds spent getting there.

    python benchmarks/bench_server_start.py --out /tmp/server-start --starts 5
    python benchmarks/bench_server_start.py --out /tmp/server-start --compare /tmp/before --starts 5

Indexes the bundled sample documents once, then starts `ragserve serve` over them `--starts`
times per configuration, one at a time: retrieval only (RAGSERVE_GENERATION_ENABLED=false, the
shape of a retrieval sidecar and of most test servers) and the full server (the vLLM engine in
process). With `--compare DIR` (another checkout of the project, e.g. `git worktree add /tmp/before
HEAD~1`) the same starts run from that tree too, alternating with this one, so the ratio comes
from one run on one host. Reported per row: seconds to SERVING (p50, max) and the CPU-seconds
the server and its children had spent when it was SERVING (p50, max). RAGSERVE_BENCH_SLOW slows
the servers (benchmarks/harness.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, ensure_index, git_head, load_avg, start_server, stop_server, write_results  # noqa: E402

CONFIGS = {
    "retrieval only": {"RAGSERVE_GENERATION_ENABLED": "false"},
    "full (engine in process)": {},
}


def cpu_seconds(pid: int) -> float:
    """The process's CPU time and that of its children, living or waited for."""
    process = psutil.Process(pid)
    spent = process.cpu_times()
    total = spent.user + spent.system + spent.children_user + spent.children_system
    for child in process.children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def one_start(index: Path, env: dict[str, str], log: Path, repo: Path) -> tuple[float, float]:
    started = time.perf_counter()
    process, _ = start_server(index, env, log, repo=repo)
    to_serving = time.perf_counter() - started
    try:
        return to_serving, cpu_seconds(process.pid)
    finally:
        stop_server(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout, started alternately")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of CONFIGS")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = ensure_index(None, args.out, REPO / "indexer" / "sample_docs")
    trees = {f"this tree ({git_head()})": REPO}
    if args.compare is not None:
        trees[f"{args.compare} ({git_head(args.compare)})"] = args.compare.resolve()
    runs: dict[str, list[tuple[float, float]]] = {}
    for config in args.configs.split(","):
        for attempt in range(args.starts):
            for tree, repo in trees.items():
                row = f"{config} | {tree}"
                log = args.out / f"server-{len(runs.get(row, []))}-{abs(hash(row)) % 10**6}.log"
                runs.setdefault(row, []).append(one_start(index, CONFIGS[config], log, repo))
                print(f"{row}: start {attempt + 1}: {runs[row][-1][0]:.2f} s, {runs[row][-1][1]:.2f} CPU-s", flush=True)
    lines = [
        f"# What a server start costs ({cpu_name()}, load {load_avg()}, {git_head()})",
        "",
        "| configuration | tree | starts | to SERVING p50 / max (s) | CPU-s at SERVING p50 / max |",
        "|---|---|---|---|---|",
    ]
    for row, values in runs.items():
        wall, cpu = [v[0] for v in values], [v[1] for v in values]
        lines.append(
            f"| {row} | {len(values)} | {statistics.median(wall):.2f} / {max(wall):.2f} "
            f"| {statistics.median(cpu):.2f} / {max(cpu):.2f} |"
        )
    write_results(args.out, "\n".join(lines), {row: values for row, values in runs.items()})


if __name__ == "__main__":
    main()
