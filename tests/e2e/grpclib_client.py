"""A non-grpcio client (grpclib, pure Python), run as its own process.

    python grpclib_client.py HOST PORT STUBS_DIR

Prints one JSON object: the health statuses seen by a Watch and the Query event kinds.
Kept out of the test process because grpclib and grpcio both register the health .proto.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys


async def main(host: str, port: int, stubs_dir: str) -> None:
    from grpclib.client import Channel
    from grpclib.health.v1.health_grpc import HealthStub
    from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

    spec = importlib.util.spec_from_file_location("rag_grpc", f"{stubs_dir}/ragserve/v1/rag_grpc.py")
    assert spec and spec.loader
    rag_grpc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rag_grpc)
    from ragserve.v1 import rag_pb2 as pb

    result: dict[str, object] = {}
    async with Channel(host, port) as channel:
        async with HealthStub(channel).Watch.open() as watch:
            await watch.send_message(HealthCheckRequest(service=""), end=True)
            reply = await watch.recv_message()
            result["watch"] = [HealthCheckResponse.ServingStatus.Name(reply.status)]
            await watch.cancel()
        stub = rag_grpc.RagServiceStub(channel)
        kinds = []
        async with stub.Query.open(timeout=120) as stream:
            await stream.send_message(pb.QueryRequest(query="What is HNSW?", max_tokens=12), end=True)
            async for event in stream:
                kinds.append(event.WhichOneof("event"))
        result["query"] = kinds
        reply = await stub.Retrieve(pb.RetrieveRequest(query="What is HNSW?", top_k=2))
        result["retrieve_doc_ids"] = [p.doc_id for p in reply.passages]
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
