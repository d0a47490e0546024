"""Promise 12: a non-grpcio gRPC implementation (grpclib) drives health watch and streaming Query."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.servers import LiveServer

REPO = Path(__file__).resolve().parents[3]


def test_grpclib_client_watches_health_and_streams_a_query(live_server: LiveServer, tmp_path: Path) -> None:
    plugin = shutil.which("protoc-gen-grpclib_python", path=str(Path(sys.executable).parent))
    assert plugin, "grpclib's protoc plugin is missing (pip install grpclib)"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'protos'}",
            f"--plugin=protoc-gen-grpclib_python={plugin}",
            f"--grpclib_python_out={tmp_path}",
            "ragserve/v1/rag.proto",
        ],
        check=True,
    )
    host, port = live_server.target.rsplit(":", 1)
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "grpclib_client.py"), host, port, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["watch"] == ["SERVING"]
    kinds = seen["query"]
    assert kinds[0] == "retrieval" and kinds[-1] == "final" and "token" in kinds
    assert seen["retrieve_doc_ids"][0] == "hnsw-approximate-nearest-neighbour.md"
