"""The structure drawn from the imports (docs/ARCHITECTURE.md, "Floors" and "Checked rules")."""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from functools import cache
from pathlib import Path

from ragserve.request.pipeline import RagPipeline

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ragserve"
# Top to bottom; a module may import its own floor or lower ones (docs/ARCHITECTURE.md).
FLOORS = [
    {"cli", "server", "client"},
    {"factory"},
    {"request"},
    {"cache", "generate"},
    {"embed", "rerank", "read"},
    {"index"},
    {"config", "types", "errors", "budget", "prompt", "metrics", "pretrained", "onnx_export", "addresses", "digests"}
    | {"tracing", "logs", "v1", "filters", "access", "sentence_spans", "priority", "json_bytes", "heap"}
    | {"retrieval_first", "reports", "api_keys", "cost", "source_location", "events"},
]
FLOOR = {part: level for level, parts in enumerate(FLOORS) for part in parts}
GENERATOR_OR_INDEX_TYPES = {"RemoteVllmGenerator", "VllmGenerator", "HnswIndex", "QdrantIndex"}


@cache
def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        if "v1" in path.relative_to(package).parts:
            continue  # generated stubs
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@cache
def _imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of `package` each of its modules imports (at run time or for type checking alike)."""
    graph: dict[str, set[str]] = defaultdict(set)
    modules = _modules(package)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, node.module] if node.module else base)
                targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name].update(t for t in targets if t in modules)
    return graph


def _part(module: str) -> str:
    return module.split(".")[1]


def test_no_module_imports_a_higher_floor() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in _imports().items()
        for b in targets
        if "." in a and "." in b and FLOOR[_part(b)] < FLOOR[_part(a)]
    ]
    assert not upward


def test_no_two_folders_import_each_other_and_no_module_circle() -> None:
    folders: dict[str, set[str]] = defaultdict(set)
    for a, targets in _imports().items():
        for b in targets:
            if "." in a and "." in b and _part(a) != _part(b):
                folders[_part(a)].add(_part(b))
    assert not [(a, b) for a in folders for b in folders[a] if a < b and a in folders.get(b, set())]
    assert not _circles(_imports())


def test_no_module_circle_in_the_indexer() -> None:
    assert not _circles(_imports(REPO / "indexer"))


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Depth-first search for a circle among the modules themselves."""
    state: dict[str, str] = {}
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in graph.get(module, ()):
            if target == module or target.startswith(f"{module}."):
                continue  # a package importing its own modules
            if state.get(target) == "open":
                circles.append([*path, target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return circles


def test_the_named_boundaries_hold() -> None:
    imports = _imports()

    def reaches(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
        return [
            f"{a} -> {b}"
            for a, targets in imports.items()
            if a == prefix or a.startswith(f"{prefix}.")
            for b in targets
            if b.startswith(forbidden)
        ]

    for folder in ("ragserve.embed", "ragserve.rerank", "ragserve.read"):
        assert not reaches(folder, ("ragserve.index",))
    assert not reaches("ragserve.client", ("ragserve.server",))
    assert not reaches("ragserve.cache", ("ragserve.prompt", "ragserve.request"))
    settings_readers = {
        _part(a) for a, targets in imports.items() if "." in a and "ragserve.config" in targets and _imports_settings(a)
    }
    assert settings_readers <= {"factory", "server", "cli", "config"}


def _imports_settings(module: str) -> bool:
    tree = ast.parse(_modules()[module].read_text())
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "ragserve.config"
        and any(alias.name == "Settings" for alias in node.names)
        for node in ast.walk(tree)
    )


def test_no_isinstance_on_a_generator_or_index_type_outside_the_factory() -> None:
    found = []
    for name, path in _modules().items():
        if "." not in name or _part(name) == "factory":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & GENERATOR_OR_INDEX_TYPES:
                    found.append(f"{name}:{node.lineno}")
    assert not found


def test_files_and_functions_stay_small() -> None:
    long_files, long_functions = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > 400:
            long_files.append(name)
        for node in ast.walk(ast.parse(text)):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and (node.end_lineno or 0) - node.lineno + 1 > 60:
                long_functions.append(f"{name}.{node.name}")
    assert not long_files and not long_functions


def test_the_pipeline_takes_at_most_eight_parts() -> None:
    assert len(inspect.signature(RagPipeline.__init__).parameters) - 1 <= 8


# The same rules hold for the indexer and the benchmarks (`_modules` is ragserve/ only).
OTHER_CODE = [REPO / "indexer", REPO / "benchmarks"]
# Benchmark scripts over the size rules when they were first applied there: each may shrink, never
# grow (these sizes are ceilings), and a script not named here must keep to 400 and 60 lines.
BENCHMARK_CEILINGS = {
    "bench_ttft.py": 830,
    "bench_ttft.py:markdown": 161,
    "bench_ttft.py:main": 140,
    "workloads.py": 489,
    "bench_cache.py:main": 83,
    "bench_cold_start.py:main": 75,
    "bench_embed.py:main": 62,
    "bench_evidence.py:report": 62,
    "bench_load.py:main": 66,
    "bench_remote.py:main": 68,
    "bench_shared_host.py:main": 61,
    "bench_sizing.py:main": 70,
    "probe_spec.py:main": 68,
}


def _over_the_size_rules(path: Path) -> dict[str, int]:
    """This file's name and its functions' names (file:function) that are over 400 and 60 lines."""
    text = path.read_text()
    over = {path.name: len(text.splitlines())} if len(text.splitlines()) > 400 else {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or 0) - node.lineno + 1
            if length > 60:
                over[f"{path.name}:{node.name}"] = length
    return over


def test_the_indexer_keeps_to_the_size_rules() -> None:
    found = {}
    for path in (REPO / "indexer").rglob("*.py"):
        found |= {f"{path.relative_to(REPO)}:{name}": size for name, size in _over_the_size_rules(path).items()}
    assert not found


def test_benchmarks_keep_to_the_size_rules_or_their_ceilings() -> None:
    found = {}
    for path in (REPO / "benchmarks").glob("*.py"):
        found |= _over_the_size_rules(path)
    grown = {name: size for name, size in found.items() if size > BENCHMARK_CEILINGS.get(name, 0)}
    assert not grown


def test_no_isinstance_on_a_generator_or_index_type_in_the_indexer_or_benchmarks() -> None:
    found = []
    for path in [p for folder in OTHER_CODE for p in folder.rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & GENERATOR_OR_INDEX_TYPES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found


def test_ragserve_never_imports_the_indexer() -> None:
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            if any(module.split(".")[0] == "indexer" for module in modules):
                found.append(name)
    assert not found


def test_no_benchmark_imports_the_tests() -> None:
    found = []
    for path in (REPO / "benchmarks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
                found.append(path.name)
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names):
                found.append(path.name)
    assert not found


def test_the_architecture_page_names_every_protocol_tuning_module_and_pipeline_part() -> None:
    """docs/ARCHITECTURE.md is the map of record: it must not drift from the code it maps."""
    page = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    protocols = set()
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "indexer").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "Protocol" for b in node.bases):
                protocols.add(node.name)
    missing = {name for name in protocols if not name.startswith("_") and f"`{name}`" not in page}
    tuning = {f"tune/{p.name}" for p in (REPO / "indexer" / "tune").glob("*.py") if p.name != "__init__.py"}
    missing |= {module for module in tuning if f"`{module}`" not in page}
    parts = len(inspect.signature(RagPipeline.__init__).parameters) - 1
    words = {6: "six", 7: "seven", 8: "eight"}
    assert not missing and f"`RagPipeline` takes {words.get(parts, parts)} parts" in page


DOOR_NEUTRAL = (
    *("server/front.py", "server/gate.py", "server/identity.py", "server/validation.py", "server/limiter.py"),
    *("server/tls_files.py", "server/exposure.py"),
)
# A folder per door; the HTTP doors stand on server/http/, which knows none of them.
DOORS = ("grpc", "openai", "mcp", "page")


def test_the_front_knows_no_door() -> None:
    """The front every door calls, and what it stands on, import no wire library: a door maps its
    wire to the front's values and back (server/front.py)."""
    wires = ("grpc", "grpc_status", "google", "starlette", "uvicorn", "mcp")
    found = []
    for relative in DOOR_NEUTRAL:
        tree = ast.parse((PACKAGE / relative).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            found += [f"{relative}: {n}" for n in names if n.split(".")[0] in wires]
    assert not found


def test_no_door_imports_another_and_the_http_base_imports_none() -> None:
    """server/grpc/, server/openai/, server/mcp/ (and the page) each stand alone; the HTTP doors
    share server/http/ (the listener, its limits, the one HTTP error table, the one app)."""
    found = []
    for module, targets in _imports().items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "server" or parts[2] not in (*DOORS, "http"):
            continue
        for target in targets:
            other = target.split(".")
            if len(other) > 2 and other[1] == "server" and other[2] in DOORS and other[2] != parts[2]:
                found.append(f"{module} -> {target}")
    assert not found


def test_every_error_kind_maps_on_every_doors_table() -> None:
    """Each door's one table (gRPC's codes, the HTTP doors' statuses) names every kind; the MCP
    door's refusals before a tool runs use the HTTP table, its tool errors the kind's own name."""
    from ragserve.errors import ErrorKind
    from ragserve.server.grpc.status import CODES
    from ragserve.server.http.errors import STATUS

    for table in (CODES, STATUS):
        assert set(table) == set(ErrorKind), sorted(kind.name for kind in set(ErrorKind) - set(table))
    tables = set()
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())) if module.startswith("ragserve.server.") else ():
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                typed = ast.unparse(node.annotation)
                if typed.startswith("dict[ErrorKind"):
                    tables.add(f"{module}.{node.target.id}")
    assert tables == {"ragserve.server.grpc.status.CODES", "ragserve.server.http.errors.STATUS"}, tables
