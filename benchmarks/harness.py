"""Helpers shared by the benchmarks that start real `ragserve serve` processes on loopback: ports,
the server, its index, percentiles and the results files (what is asked and what runs beside the
server: workloads.py)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Every benchmark server: no metrics port (several servers may run at once), quiet logs.
# Whole-corpus warming off unless a benchmark measures it (bench_cold_start.py): a first visit
# stays a first visit, as the other benchmarks' figures assume.
SERVER_DEFAULTS = {"RAGSERVE_METRICS_PORT": "0", "RAGSERVE_LOG_LEVEL": "WARNING", "RAGSERVE_WARM_WHOLE_CORPUS": "false"}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def load_avg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# Ports handed out by this process. A server given a port binds it only when it is up (a vLLM
# server after about a minute), and until then the kernel may offer the same port again: a gRPC
# server started meanwhile took a vLLM server's port once, and the HTTP probe read HTTP/2 frames.
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port nobody listens on right now and that this process never handed out."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


# Every benchmark that starts a server can run it slowed down, so a fast host shows the slow host's
# case (RAGSERVE_BENCH_SLOW, or a benchmark's own --slow): `one-core` (taskset: it picks its threads
# from the one CPU it may use), `quota` (one CPU's worth of time over every CPU: a cgroup, as a
# container's CPU limit; root), `compile` (a C++ build at nice 19 beside it while it runs,
# benchmarks/neighbours.py). cpu_name() names the mode in every figure's header.
SLOW_MODES = ("none", "one-core", "quota", "compile")
_beside: dict[int, contextlib.ExitStack] = {}


def slow_mode() -> str:
    mode = os.environ.get("RAGSERVE_BENCH_SLOW", "none") or "none"
    if mode not in SLOW_MODES:
        raise SystemExit(f"RAGSERVE_BENCH_SLOW={mode!r}: one of {', '.join(SLOW_MODES)}")
    return mode


def quota_group(cpus: float) -> Path:
    """A cgroup whose processes get `cpus` CPUs' worth of time (cgroup v1 cpu or v2 cpu.max; root)."""
    period = 100_000
    v1 = Path("/sys/fs/cgroup/cpu")
    if v1.is_dir():
        group = v1 / "ragserve-bench"
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
    else:
        group = Path("/sys/fs/cgroup/ragserve-bench")
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
    return group


def slow_prefix(mode: str) -> tuple[str, ...]:
    """The command a server runs under in `mode` (none for `none` and `compile`)."""
    if mode == "one-core":
        return ("taskset", "-c", "0")
    if mode == "quota":
        procs = quota_group(1.0) / "cgroup.procs"
        return ("sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh")
    return ()


def start_server(
    index: Path,
    env: dict[str, str],
    log: Path,
    wait_s: float = 600.0,
    repo: Path = REPO,
    prefix: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `ragserve serve` on a free loopback port and wait until it is SERVING.

    Runs from `repo` (default: this checkout), so `-m ragserve.cli` imports that tree's code. Returns
    the process and its target ("127.0.0.1:PORT"); exits with the log's tail if the server never
    comes up. `prefix`: a command the server runs under (e.g. `taskset -c 0`); none given, the one
    RAGSERVE_BENCH_SLOW asks for (and with `compile`, the build beside it until stop_server).
    """
    mode = slow_mode()
    prefix = prefix or slow_prefix(mode)
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "ragserve.cli", "serve", "--port", str(port), "--index", str(index)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **SERVER_DEFAULTS, **env},
            cwd=repo,
        )
    health = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "health", "--port", str(port), "--wait", str(wait_s)],
        capture_output=True,
        cwd=repo,
    )
    if health.returncode != 0 or process.poll() is not None:
        stop_server(process)
        raise SystemExit(f"server did not start; see {log}:\n{log.read_text(errors='replace')[-3000:]}")
    if mode == "compile":
        from benchmarks.neighbours import cxx_build

        beside = contextlib.ExitStack()
        beside.enter_context(cxx_build(jobs=os.cpu_count() or 1, nice=19))
        _beside[process.pid] = beside
    return process, f"127.0.0.1:{port}"


def stop_server(process: subprocess.Popen[bytes]) -> None:
    beside = _beside.pop(process.pid, None)
    if beside is not None:
        beside.close()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def build_index(corpus: Path, index: Path) -> None:
    """Incremental: a second run over the same corpus publishes nothing new and takes seconds."""
    subprocess.run(
        [sys.executable, "-m", "indexer", "build", str(corpus), "--out", str(index), "--no-progress"],
        check=True,
        cwd=REPO,
    )


def ensure_index(index: Path | None, out: Path, corpus: Path) -> Path:
    """`index` as given, else one built from `corpus` into OUT/index once."""
    if index is not None:
        return index
    index = out / "index"
    if not (index / "CURRENT").exists():
        build_index(corpus, index)
    return index


def git_head(tree: Path = REPO) -> str:
    """The short commit `tree` is at (every results.md names the commit it measured)."""
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return run.stdout.strip()


def write_results(out: Path, text: str, results: object) -> None:
    """results.md (the table, also printed) and results.json (every request) in `out`."""
    import json

    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(text)


def plot_ttft(series: dict[str, list[float]], out: Path, xlabel: str = "client TTFT (ms)", log_x: bool = False) -> None:
    """Cumulative TTFT distributions, one line per series, into OUT/ttft.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, values in series.items():
        ordered = sorted(values)
        if ordered:
            ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of requests")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=110)


def cpu_name() -> str:
    """lscpu's model name (from /proc/cpuinfo), for the header of every figure, with the slow-down
    the servers run under when there is one."""
    mode = slow_mode()
    slowed = f", servers slowed: {mode}" if mode != "none" else ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + slowed
    except OSError:
        pass
    return (platform.processor() or platform.machine()) + slowed


def index_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark that serves an index already built: --index and --data."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--index", type=Path, required=True, help="an index root (CURRENT -> a version)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    return parser


def start_client() -> None:
    """Print the host, then freeze this client's heap: its own full collections (tens of ms) are
    not the server's latency."""
    print(f"{cpu_name()}; load at start {load_avg()}", flush=True)
    gc.freeze()
