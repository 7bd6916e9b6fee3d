"""A TCP proxy that holds every byte for a fixed time in each direction: a far-away node.

The kernel on the benchmark box has no ``netem`` qdisc (``tc qdisc add ... netem`` fails
with "unknown qdisc kind"), so the cross-datacenter scenarios put this proxy in front of
the destination node's AMQP port instead. What ``netem delay D`` on that port would do
to both directions, it does in user space: each chunk read from one side is written to
the other side no earlier than ``D`` after it was read, in the order it was read (one
FIFO per direction), so the round trip through it is ``2 D`` and the byte stream is
unchanged. It does not limit bandwidth and never drops: the reader keeps reading while
earlier chunks wait (up to `MAX_CHUNKS_IN_FLIGHT` per direction), so a sender's window
fills the "pipe" as it would on a long link.

    python -m bench.delay_proxy --target-port 5673 --delay-ms 20   # prints its port

`DelayProxy` runs it as a child process for the benchmark (started and stopped
there); its CPU time is read from /proc so the report can say what the simulated
network cost the box.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import TracebackType

# Chunks read from one side and not yet written to the other; past this the proxy
# stops reading, and TCP flow control pushes back on the sender (a full pipe). 4096
# chunks of up to 64 KiB is far more than 20 ms of a local link carries.
MAX_CHUNKS_IN_FLIGHT = 4096
READ_BYTES = 65536
LOOPBACK = "127.0.0.1"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy `reader` to `writer`, each chunk leaving `delay` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_CHUNKS_IN_FLIGHT)

    async def read_side() -> None:
        while chunk := await reader.read(READ_BYTES):
            await pending.put((loop.time() + delay, chunk))
        await pending.put((loop.time() + delay, b""))  # end of stream, delayed like data

    async def write_side() -> None:
        while True:
            due, chunk = await pending.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    reading = asyncio.ensure_future(read_side())
    try:
        await write_side()
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await reading


async def _serve_connection(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    """One client connection: a connection to the target, and a delayed relay each way."""
    try:
        # The TCP handshake to a far node takes a round trip too.
        await asyncio.sleep(2 * delay)
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    for writer in (client_writer, server_writer):
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    relays = [
        asyncio.ensure_future(_relay(client_reader, server_writer, delay)),
        asyncio.ensure_future(_relay(server_reader, client_writer, delay)),
    ]
    try:
        # Either side closing ends the pair, as a dropped link would.
        _done, still_running = await asyncio.wait(relays, return_when=asyncio.FIRST_EXCEPTION)
        for relay in still_running:
            await relay
    except (ConnectionError, OSError):
        pass
    finally:
        for relay in relays:
            relay.cancel()
        for writer in (client_writer, server_writer):
            writer.close()


async def serve(target: tuple[str, int], delay: float, port: int = 0) -> asyncio.Server:
    """Listen on loopback (`port`, 0: any free one) and relay to `target` with `delay`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_connection(reader, writer, target, delay)

    return await asyncio.start_server(handle, LOOPBACK, port)


async def _main(target_port: int, delay: float) -> None:
    server = await serve((LOOPBACK, target_port), delay)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)  # the parent reads this line to learn where to connect
    async with server:
        await server.serve_forever()


class DelayProxy:
    """The proxy as a child process in front of ``127.0.0.1:target_port``.

    ``with DelayProxy(port, 0.020) as proxy:`` connect to ``proxy.port``;
    ``proxy.cpu_seconds()`` is its CPU time so far (user + system, all threads).
    """

    def __init__(self, target_port: int, delay_seconds: float) -> None:
        if delay_seconds < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay_seconds}")
        self.target_port = target_port
        self.delay_seconds = delay_seconds
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> DelayProxy:
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.delay_proxy",
                "--target-port",
                str(self.target_port),
                "--delay-ms",
                str(self.delay_seconds * 1000),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.isdigit():
            self.__exit__(None, None, None)
            raise RuntimeError(
                f"delay proxy to port {self.target_port} did not start: printed {line!r}"
            )
        # Printed once its socket listens: ready.
        self.port = int(line)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def cpu_seconds(self) -> float:
        if self._process is None:
            raise RuntimeError("the delay proxy is not running")
        return process_cpu_seconds(self._process.pid)


def process_cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, all threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delay_proxy", description=__doc__)
    parser.add_argument("--target-port", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error(f"--delay-ms must be >= 0, got {args.delay_ms}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.target_port, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
