"""What runs beside a server under measurement: a C++ build at the lowest priority (the neighbour a
CI agent or a backup is), niced jobs of the server's own session, so a benchmark can show what a
shared host costs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# A translation unit heavy in standard-library templates: each g++ run takes seconds of CPU, reads
# hundreds of headers and allocates and frees hundreds of MB, as a real build's steps do.
_CXX_SOURCE = """
#include <algorithm>
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>
template <int N> struct Unit {
    std::map<std::string, std::vector<int>> table;
    std::unordered_map<int, std::string> names;
    int run(const std::string& text) {
        std::regex word("[a-z]+" + std::to_string(N));
        auto begin = std::sregex_iterator(text.begin(), text.end(), word);
        int found = 0;
        for (auto it = begin; it != std::sregex_iterator(); ++it) table[it->str()].push_back(++found);
        std::sort(table[text].begin(), table[text].end());
        return found + Unit<N - 1>().run(text);
    }
};
template <> struct Unit<0> { int run(const std::string&) { return 0; } };
int main(int argc, char** argv) { std::cout << Unit<24>().run(argc > 1 ? argv[1] : "x") << std::endl; }
"""


@contextlib.contextmanager
def cxx_build(jobs: int, nice: int = 19) -> Iterator[None]:
    """`jobs` g++ compiles at a time at `nice`, one after another, for as long as the block runs
    (what `make -jN` does at the lowest priority: CI agents, backups)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cxx-neighbour-") as folder:
        source = Path(folder) / "unit.cpp"
        source.write_text(_CXX_SOURCE)
        loop = f'while true; do g++ -O2 -std=c++17 -c "{source}" -o "$(mktemp -p {folder})"; rm -f {folder}/tmp.*; done'
        builds = [
            subprocess.Popen(["nice", "-n", str(nice), "bash", "-c", loop], start_new_session=True) for _ in range(jobs)
        ]
        try:
            yield
        finally:
            for build in builds:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(build.pid, signal.SIGKILL)
                build.wait()


# Jobs that keep a core busy forever: pure Python (the interpreter's loop, little memory traffic),
# or numpy streaming arrays far larger than the caches through memory.
NICED_JOBS = {
    "cpu": "while True:\n    sum(i * i for i in range(10_000))",
    "memory": (
        "import numpy as np\na = np.ones(32 << 20)\nb = np.empty_like(a)\n"
        "while True:\n    np.multiply(a, 1.0001, out=b)\n    a, b = b, a"
    ),
}


@contextlib.contextmanager
def niced_jobs(kind: str, jobs: int = 2, nice: int = 19) -> Iterator[None]:
    """`jobs` of NICED_JOBS[kind] at `nice`, in this process's session (and so the autogroup of a
    server this process started): what `nice -n 19 job &` in the server's own shell is."""
    started = [
        subprocess.Popen([sys.executable, "-c", NICED_JOBS[kind]], preexec_fn=lambda: os.nice(nice))
        for _ in range(jobs)
    ]
    try:
        yield
    finally:
        for job in started:
            job.kill()
            job.wait()
