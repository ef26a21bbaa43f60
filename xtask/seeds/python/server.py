"""A seed server: HTTP/1.1 keep-alive, serving one file at any path, one connection at a time.

Usage: server.py sendfile|copy PORT FILE. `sendfile` sends the body with socket.sendfile(f) (zero
copy); `copy` with the loop people write by hand: f.read(64 KiB) and sendall. Prints `ready` once
it listens. Used by ebpf/probe/tests/seeds.rs and `cargo xtask demo --seeds`.
"""

import os
import socket
import sys


def serve(mode: str, port: int, path: str) -> None:
    size = os.path.getsize(path)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Length: %d\r\n\r\n" % size
    )
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending and len(pending) < 65536:
                    data = conn.recv(65536)
                    if not data:
                        break
                    pending += data
                if b"\r\n\r\n" not in pending:
                    break
                request, _, pending = pending.partition(b"\r\n\r\n")
                conn.sendall(head)
                with open(path, "rb") as f:
                    if mode == "sendfile":
                        conn.sendfile(f)
                    else:
                        while True:
                            chunk = f.read(65536)
                            if not chunk:
                                break
                            conn.sendall(chunk)
                if b"connection: close" in request.lower():
                    break


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3])
