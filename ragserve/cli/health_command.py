"""`ragserve health`: a probe of the service (or one health name), usable with auth on, that can
also wait until warming has pre-filled the KV cache."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import typer

from ragserve.cli.app import app
from ragserve.cli.client_commands import ClientFlags, client_command, fail, run_client
from ragserve.client import ClientSettings
from ragserve.errors import RagError


@app.command()
@client_command
def health(
    flags: ClientFlags,
    wait: Annotated[float, typer.Option(help="Keep probing up to this many seconds")] = 0.0,
    service: Annotated[
        str,
        typer.Option(
            help="The health name to ask for: empty for the whole service (answers too); "
            "ragserve.v1.RagService/Retrieve for retrieval alone, which a generator outage leaves SERVING"
        ),
    ] = "",
    warm: Annotated[
        bool,
        typer.Option(
            help="Once SERVING, also wait (within --wait) until warming has pre-filled the KV cache, so "
            "that traffic routed next finds its passages warm; says what it warmed"
        ),
    ] = False,
) -> None:
    """Exit 0 when the service (or the --service name) reports SERVING; usable as a probe, with auth on too."""
    from ragserve.client import call_metadata, channel_credentials

    target = flags.target
    try:
        access = flags.access()
        metadata = call_metadata(target, access)
        credentials = channel_credentials(access)
    except RagError as exc:
        fail(exc)
    give_up = time.monotonic() + wait
    status, details = _probe(target, access, credentials, metadata, wait, service)
    if status == "SERVING":
        typer.echo(status)
        if warm:
            _wait_warm(target, access, give_up)
        return
    from ragserve.client import explain_status

    if status in ("NOT_SERVING", "SERVICE_UNKNOWN", "UNKNOWN"):
        typer.echo(status)
    elif status == "NOT_FOUND":
        typer.echo(f"NOT_FOUND: the server has no health status named {service!r}", err=True)
    else:
        import grpc

        typer.echo(f"{status}: {explain_status(grpc.StatusCode[status], details, target)}", err=True)
    raise typer.Exit(1)


def _wait_warm(target: str, access: ClientSettings, give_up: float) -> None:
    """Poll Info until warming has finished for the serving version; exit 1 when `give_up` passes
    first. A server that reports no warming has none to wait for."""
    from ragserve.client import RagClient

    warming: Any = None

    async def poll() -> None:
        nonlocal warming
        async with RagClient(target, access=access) as client:
            while True:
                reply = await client.info()
                warming = reply.warming if reply.HasField("warming") else None
                if warming is None or warming.done or time.monotonic() >= give_up:
                    return
                await asyncio.sleep(0.5)

    run_client(poll, target)
    if warming is None:
        typer.echo("warm: this server does not report warming")
    elif warming.done:
        typer.echo(
            f"warm: {warming.passages} passages ({warming.tokens} tokens) in {warming.seconds:.1f} s, "
            f"{warming.left_out} left cold"
        )
    else:
        typer.echo(
            f"still warming: {warming.passages} passages ({warming.tokens} tokens) so far, "
            f"{warming.passages + warming.left_out} of {warming.planned} tried",
            err=True,
        )
        raise typer.Exit(1)


def _probe(
    target: str, access: ClientSettings, credentials: Any, metadata: Any, wait: float, service: str = ""
) -> tuple[str, str]:
    """The health status of `service` (and the error's details); probes every half second, up to
    `wait` seconds, until SERVING. Refused credentials end the wait at once: retrying cannot help."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from ragserve.client import channel_options

    options = channel_options(access)
    give_up = time.monotonic() + wait
    status, details = "UNKNOWN", ""
    with (
        grpc.insecure_channel(target, options=options)
        if credentials is None
        else grpc.secure_channel(target, credentials, options=options)
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0, metadata=metadata)
                status, details = str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)), ""
            except grpc.RpcError as exc:
                status, details = exc.code().name, str(exc.details() or "")
            final = status in ("SERVING", "UNAUTHENTICATED", "PERMISSION_DENIED")
            if final or time.monotonic() >= give_up:
                return status, details
            time.sleep(0.5)
