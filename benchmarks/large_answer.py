"""A large answer (a listing page of 30 MB) read through the sync's own connection
(platform_api/http1.py) against ``httpx.Client`` on the same server, in turns.

Run: ``python3 benchmarks/large_answer.py [--mb 32] [--rounds 5]`` (from another
checkout's root for that revision: ``python3 /path/to/benchmarks/large_answer.py --tree .``).

The server is a socket on loopback answering every request with the same page
(``Content-Length``); each round reads it once through each client, and the figure is the
ratio of the reading thread's CPU (the answer parsed as JSON in both). No cap bounds an
answer's size on either path: only ``--timeout``, within which it must arrive whole.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path


def serve(answer: bytes) -> str:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def connection(conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                buffer = buffer.partition(b"\r\n\r\n")[2]
                conn.sendall(answer)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=connection, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    import httpx
    import orjson

    from prime_runs_spool.platform_api.client import PlatformClient
    from prime_runs_spool.platform_api.settings import Secret, Settings

    rows = [{"id": f"s{i}", "completion": "y" * 300} for i in range(int(args.mb * 1e6 / 330))]
    body = orjson.dumps({"samples": rows, "total": len(rows)})
    url = serve(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body))
    settings = Settings(base_url=url, api_key=Secret("sk-benchmark"), team_id="t", frontend_url="http://app.test")
    clients = {"own": PlatformClient(settings, timeout=120),
               "httpx": PlatformClient(settings, timeout=120, transport=httpx.HTTPTransport())}
    cpu: dict[str, list[float]] = {name: [] for name in clients}
    for name, client in clients.items():
        client.list_samples("ev-1")  # connected, warmed
    for _ in range(args.rounds):
        for name, client in clients.items():
            start = time.thread_time()
            client.list_samples("ev-1")
            cpu[name].append(time.thread_time() - start)
    own, through_httpx = statistics.median(cpu["own"]), statistics.median(cpu["httpx"])
    print(f"{len(body) / 1e6:.1f} MB answer, thread CPU a reading (median of {args.rounds}): "
          f"own {own * 1000:.0f} ms, httpx.Client {through_httpx * 1000:.0f} ms, ratio {own / through_httpx:.2f}")


if __name__ == "__main__":
    main()
