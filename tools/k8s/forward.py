"""Forwards 127.0.0.1:<port> to a Service's cluster IP, through kube-proxy's rules.

`kubectl port-forward svc/...` picks one pod when it starts and breaks when that pod goes away, so a
rolling upgrade or a deleted gateway pod would cut the developer's and the tests' connection. This
relay opens one connection to the Service per client connection; kube-proxy spreads them over the
Ready pods as it would for any client in the cluster.

    python3 tools/k8s/forward.py --listen-port 8080 --target 10.96.0.42:8080
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.write_eof() if writer.can_write_eof() else writer.close()


async def relay(target_host: str, target_port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(target_host, target_port)
    except OSError as e:
        # The client sees its connection closed; its log shows why (a pod that left the Service late).
        print(f"{time.strftime('%H:%M:%S')} no connection to {target_host}:{target_port}: {e}", file=sys.stderr, flush=True)
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
    for w in (writer, upstream_writer):
        w.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--target", required=True, help="cluster IP and port, e.g. 10.96.0.42:8080")
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    server = await asyncio.start_server(lambda r, w: relay(host, int(port), r, w), "127.0.0.1", args.listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
