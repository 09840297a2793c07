#!/usr/bin/env python3
"""A fake OpenAI-compatible completions server with known timing, for tests of `arka bench serve`
(standard library only).

  sse_timing_server.py --port-file FILE --log FILE [--ttft-ms 80] [--itl-ms 20]
                       [--fail-every K] [--error-every K] [--close-delimited]

Binds 127.0.0.1 on a free port and writes the port to --port-file once listening.
  GET /v1/models        {"object": "list", "data": [{"id": "fake-model"}, {"id": "other-model"}]}
  POST /v1/completions  streaming only. The request is checked (model "fake-model", "stream": true,
                        stream_options.include_usage true, an integer max_tokens >= 1, a prompt of
                        words); a bad one gets HTTP 400 or 404 with an OpenAI-style error body.
                        Then: a ": ping" comment; the first token --ttft-ms after the request was
                        read, one more every --itl-ms (an absolute schedule: delays do not add up),
                        max_tokens chunks of text " tok" in all; a usage chunk (prompt_tokens = words
                        + 1 for a BOS, completion_tokens = max_tokens, prompt_tokens_details.cached_tokens
                        = the longest run of leading words shared with an earlier prompt, in whole
                        blocks of 16, as a prefix cache would give), written in two pieces 5 ms apart
                        so the client must join a line across reads; data: [DONE].
Faults, counted over completion requests (1-based, in the order they are read):
  --fail-every K    every K-th is answered HTTP 500 {"error": {"message": "injected failure ..."}}
  --error-every K   every K-th (unless already failed) gets an error event after two tokens
  --empty-every K   every K-th (unless already failed) ends at once: no text chunk, a finish chunk
                    with finish_reason "stop", usage with completion_tokens 0, [DONE] (a valid
                    empty answer, as from a model whose first token ends the generation)
Framing: HTTP/1.1 chunked transfer-encoding by default; --close-delimited answers HTTP/1.0 with
no length and closes the connection at the end of the body.
Each completion request appends one line to --log:
  t=<monotonic s> n=<count> status=<code> words=<n> max_tokens=<m> inflight=<open streams> prompt=<sha1 prefix>
  head=<sha1 prefix of its first 16 words> key=<the bearer key's last 6 characters, or ->
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # all-at-once runs open every connection together


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def record(self, line):
        with self.server.lock:
            with open(self.server.log_path, "a") as f:
                f.write(line + "\n")

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def error(self, status, message):
        self.send_json(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"},
                                                            {"id": "other-model", "object": "model"}]})
        else:
            self.error(404, "no route " + self.path)

    def write(self, data):
        if self.server.close_delimited:
            self.wfile.write(data)
        else:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def do_POST(self):
        t_read = time.monotonic()
        n_len = self.headers.get("Content-Length")
        if n_len is None:
            return self.error(411, "Content-Length required")
        raw = self.rfile.read(int(n_len))
        if self.path != "/v1/completions":
            return self.error(404, "no route " + self.path)
        srv = self.server
        with srv.lock:
            srv.count += 1
            n = srv.count
        try:
            q = json.loads(raw)
        except ValueError as e:
            return self.error(400, "bad JSON: %s" % e)
        prompt = q.get("prompt")
        m = q.get("max_tokens")
        words = prompt.split(" ") if isinstance(prompt, str) else []
        if q.get("model") != "fake-model":
            self.record("t=%.6f n=%d status=404" % (t_read, n))
            return self.error(404, "The model '%s' does not exist" % q.get("model"))
        if (q.get("stream") is not True or (q.get("stream_options") or {}).get("include_usage") is not True
                or not isinstance(m, int) or isinstance(m, bool) or m < 1 or not words or not all(w.isalpha() for w in words)):
            self.record("t=%.6f n=%d status=400" % (t_read, n))
            return self.error(400, "bad request: %s" % raw[:200])
        digest = hashlib.sha1(prompt.encode()).hexdigest()[:12]
        head = hashlib.sha1(" ".join(words[:16]).encode()).hexdigest()[:12]
        auth = self.headers.get("Authorization") or ""
        key = auth[-6:] if auth.startswith("Bearer ") else "-"
        with srv.lock:
            shared = max([common_prefix(words, p) for p in srv.prompts] + [0])
            srv.prompts.append(words)
        self.cached = shared // 16 * 16
        if srv.fail_every and n % srv.fail_every == 0:
            self.record("t=%.6f n=%d status=500 words=%d max_tokens=%d inflight=0 prompt=%s" % (t_read, n, len(words), m, digest))
            return self.error(500, "injected failure %d" % n)
        with srv.lock:
            srv.inflight += 1
            inflight = srv.inflight
        self.counted = True
        self.record("t=%.6f n=%d status=200 words=%d max_tokens=%d inflight=%d prompt=%s head=%s key=%s" % (
            t_read, n, len(words), m, inflight, digest, head, key))
        try:
            self.stream(t_read, n, m, len(words))
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.leave()
            self.close_connection = True

    def leave(self):
        # Out of the in-flight count before the bytes that end the stream: the client may send
        # its next request as soon as it has them, and must not be seen overlapping this one.
        if getattr(self, "counted", False):
            self.counted = False
            with self.server.lock:
                self.server.inflight -= 1

    def stream(self, t0, n, m, words):
        srv = self.server
        if srv.close_delimited:
            self.protocol_version = "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if srv.close_delimited:
            self.send_header("Connection", "close")
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.write(b": ping\n\n")
        base = {"id": "cmpl-%d" % n, "object": "text_completion", "created": int(time.time()), "model": "fake-model"}
        if srv.empty_every and n % srv.empty_every == 0:
            m = 0
            fin = dict(base, choices=[{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}], usage=None)
            self.write(b"data: " + json.dumps(fin).encode() + b"\n\n")
        for k in range(m):
            delay = t0 + (srv.ttft + k * srv.itl) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if srv.error_every and n % srv.error_every == 0 and k == 2:
                self.leave()
                self.write(b"data: " + json.dumps({"error": {"message": "injected stream error %d" % n}}).encode() + b"\n\n")
                self.end_stream()
                return
            chunk = dict(base, choices=[{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}], usage=None)
            self.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = dict(base, choices=[], usage={"prompt_tokens": words + 1, "completion_tokens": m, "total_tokens": words + 1 + m,
                                              "prompt_tokens_details": {"cached_tokens": self.cached}})
        line = b"data: " + json.dumps(usage).encode() + b"\n\n"
        self.write(line[:len(line) // 2])
        time.sleep(0.005)
        self.write(line[len(line) // 2:])
        self.leave()
        self.write(b"data: [DONE]\n\n")
        self.end_stream()

    def end_stream(self):
        if not self.server.close_delimited:
            self.wfile.write(b"0\r\n\r\n")


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--ttft-ms", type=float, default=80)
    ap.add_argument("--itl-ms", type=float, default=20)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--error-every", type=int, default=0)
    ap.add_argument("--empty-every", type=int, default=0)
    ap.add_argument("--close-delimited", action="store_true")
    a = ap.parse_args()
    srv = Server(("127.0.0.1", 0), Handler)
    srv.log_path = a.log
    srv.ttft, srv.itl = a.ttft_ms / 1e3, a.itl_ms / 1e3
    srv.fail_every, srv.error_every, srv.close_delimited = a.fail_every, a.error_every, a.close_delimited
    srv.empty_every = a.empty_every
    srv.lock = threading.Lock()
    srv.count = srv.inflight = 0
    srv.prompts = []
    open(a.log, "a").close()
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(tmp, a.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
