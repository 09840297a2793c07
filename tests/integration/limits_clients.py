#!/usr/bin/env python3
"""Clients that press on `arka serve`'s limits; each prints one JSON line. Standard library only.

    limits_clients.py flood HOST PORT N_WS N_KEEPALIVE MODEL [--probes N]
        Opens N_WS WebSockets (GET /v1/ws, 101) and N_KEEPALIVE keep-alive connections (one
        GET /health each, then silence), all idle, then times fresh-connection GET /health and
        POST /v1/completions (max_tokens 1): how many of each kind got through, how many the
        server closed since, the latencies (ms).
    limits_clients.py stall HOST PORT N BYTES PID
        N connections each announce an 8 MiB body and send BYTES of it, then stall: how many
        were refused at once (503), and the gateway's (PID) resident memory before and after (MiB).
    limits_clients.py bigbody HOST PORT SECONDS
        Two clients send 8 MB JSON bodies back to back for SECONDS while a third asks /health
        every 10 ms: the bodies sent, their statuses, /health latencies (p50, p99, max, ms).
"""
import json
import socket
import sys
import time


def recv_head(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    return buf


def recv_response(s):
    """One response with a Content-Length body; returns (status, body)."""
    buf = recv_head(s)
    head, _, rest = buf.partition(b"\r\n\r\n")
    status = int(head[9:12]) if len(head) >= 12 else 0
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest[:n]


def connect(host, port):
    s = socket.create_connection((host, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def timed(host, port, req):
    t0 = time.perf_counter()
    s = connect(host, port)
    s.sendall(req)
    status, body = recv_response(s)
    s.close()
    return status, (time.perf_counter() - t0) * 1000, body


def closed_by_server(s):
    s.setblocking(False)
    try:
        d = s.recv(4096)
        return d == b"" or (len(d) > 0 and d[0] == 0x88)  # EOF, or a close frame
    except BlockingIOError:
        return False
    except OSError:
        return True


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return -1


def stall(host, port, n, nbytes, pid):
    before = rss_mib(pid)
    socks, refused, other = [], 0, 0
    part = b"[" + b"1," * (nbytes // 2)
    for _ in range(n):
        s = connect(host, port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 8388608\r\n\r\n")
        s.settimeout(5)
        try:
            s.sendall(part[:nbytes])
        except OSError:
            pass
        socks.append(s)
    time.sleep(1.5)
    after = rss_mib(pid)
    for s in socks:
        s.setblocking(True)
        s.settimeout(0.05)
        try:
            head = s.recv(4096)
            if head[9:12] == b"503":
                refused += 1
            elif head:
                other += 1
        except (socket.timeout, OSError):
            pass
    print(json.dumps({"conns": n, "refused_503": refused, "other": other, "rss_before_mib": round(before, 1),
                      "rss_stalled_mib": round(after, 1), "growth_mib": round(after - before, 1)}))
    for s in socks:
        s.close()


def bigbody(host, port, seconds):
    """The senders are processes of their own, so the /health timings are not the client's."""
    import multiprocessing as mp
    body = b'{"model":"stories260K","prompt":[' + b",".join([b"1234"] * 1600000) + b'],"max_tokens":1}'
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    stop = time.time() + seconds
    q = mp.Queue()

    def sender():
        statuses = {}
        while time.time() < stop:
            st, _, _ = timed(host, port, req)
            statuses[st] = statuses.get(st, 0) + 1
        q.put(statuses)

    procs = [mp.Process(target=sender) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(0.3)
    lat = []
    while time.time() < stop:
        st, ms, _ = timed(host, port, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        lat.append(ms)
        time.sleep(0.01)
    statuses = {}
    for _ in procs:
        for k, v in q.get().items():
            statuses[str(k)] = statuses.get(str(k), 0) + v
    for p in procs:
        p.join()
    lat.sort()
    print(json.dumps({"body_mb": round(len(body) / 1e6, 1), "bodies_sent": sum(statuses.values()), "statuses": statuses,
                      "health_n": len(lat), "health_ms_p50": round(lat[len(lat) // 2], 2),
                      "health_ms_p99": round(lat[int(len(lat) * 0.99)], 2), "health_ms_max": round(lat[-1], 2)}))


def main():
    if sys.argv[1] == "stall":
        stall(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return
    if sys.argv[1] == "bigbody":
        bigbody(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return
    host, port, n_ws, n_ka, model = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    probes = int(sys.argv[sys.argv.index("--probes") + 1]) if "--probes" in sys.argv else 20
    hs = (b"GET /v1/ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    out = {"ws_101": 0, "ws_other": 0, "ka_200": 0, "ka_other": 0}
    socks_ws, socks_ka = [], []
    t0 = time.time()
    for _ in range(n_ws):
        s = connect(host, port)
        s.sendall(hs)
        head = recv_head(s)
        if head[9:12] == b"101":
            out["ws_101"] += 1
        else:
            out["ws_other"] += 1
        socks_ws.append(s)
    for _ in range(n_ka):
        s = connect(host, port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _ = recv_response(s)
        out["ka_200" if status == 200 else "ka_other"] += 1
        socks_ka.append(s)
    out["open_s"] = round(time.time() - t0, 2)
    health, gen, statuses = [], [], []
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 1, "temperature": 0}).encode()
    post = (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
    for _ in range(probes):
        st, ms, _ = timed(host, port, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        health.append(ms)
        statuses.append(st)
        st, ms, _ = timed(host, port, post)
        gen.append(ms)
        statuses.append(st)
    out["statuses"] = sorted(set(statuses))
    out["health_ms_max"] = round(max(health), 2)
    out["health_ms_p50"] = round(sorted(health)[len(health) // 2], 2)
    out["completion_ms_max"] = round(max(gen), 2)
    out["completion_ms_p50"] = round(sorted(gen)[len(gen) // 2], 2)
    time.sleep(0.2)
    out["ws_closed_by_server"] = sum(closed_by_server(s) for s in socks_ws)
    out["ka_closed_by_server"] = sum(closed_by_server(s) for s in socks_ka)
    print(json.dumps(out))
    for s in socks_ws + socks_ka:
        s.close()


if __name__ == "__main__":
    main()
