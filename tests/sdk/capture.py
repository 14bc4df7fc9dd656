#!/usr/bin/env python3
"""Loopback capture origin (plain HTTP, no postern): records every request — method, path,
headers in the order sent, body — as one JSON line, then misbehaves as told so the SDK
retries. Used to measure what vendor SDKs change between their own tries.

usage: capture.py MODE OUT.jsonl   (prints the port on stdout)
MODE: 500 (complete 500, Retry-After-Ms 10 / Retry-After 0 so backoff stays short; each
      answer carries a Stripe-style `Request-Id: req_<n>`),
      close (read the request, close without answering), stall:SECS (answer nothing for SECS).
"""
import json
import socket
import sys
import threading
import time


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append([name, value.strip()])
    length = 0
    chunked = False
    for name, value in headers:
        if name.lower() == "content-length":
            length = int(value)
        if name.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    body = rest
    if chunked:
        while not body.endswith(b"0\r\n\r\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    else:
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
    return {"method": method, "path": path, "headers": headers,
            "body": body.decode("utf-8", "replace"), "t": time.time()}


COUNT = [0]


def serve(conn, mode, out, lock):
    with conn:
        while True:
            req = read_request(conn)
            if req is None:
                return
            with lock:
                out.write(json.dumps(req) + "\n")
                out.flush()
                COUNT[0] += 1
                rid = b"req_%d" % COUNT[0]
            if mode == "close":
                return
            if mode.startswith("stall:"):
                time.sleep(float(mode.split(":", 1)[1]))
                return
            body = b'{"error":{"message":"capture says 500","type":"api_error"}}'
            conn.sendall(
                b"HTTP/1.1 500 Internal Server Error\r\n"
                b"Content-Type: application/json\r\n"
                b"Retry-After-Ms: 10\r\nRetry-After: 0\r\nRequest-Id: " + rid + b"\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    out = open(path, "a")
    lock = threading.Lock()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, mode, out, lock), daemon=True).start()


if __name__ == "__main__":
    main()
