#!/usr/bin/env python3
"""A small HTTP file server with Range support, for tests of `arka pull` (standard library only).

  range_server.py --root DIR --port-file FILE --log FILE

Binds 127.0.0.1 on a free port and writes the port to --port-file once listening. Serves GET and
HEAD for files directly under --root. Each request is appended to --log as one line:
  METHOD PATH range=<Range header or -> status=<code> sent=<body bytes> ifrange=<If-Range or ->
Every file gets a strong ETag from its size and mtime; a Range request whose If-Range does not
match it is answered with the whole file (200), as RFC 9110 says.
Query parameters change the behaviour of one request, for fault injection:
  norange=1    ignore the Range header (answer 200 with the whole file)
  cut=N        announce the full length but close the connection after N body bytes
  redirect=1   answer 302 to the same path without this parameter
  slow=MS      sleep MS milliseconds before each 64 KiB chunk
"""
import argparse
import os
import re
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):  # keep stderr quiet; requests go to the log file
        pass

    def record(self, status, sent):
        with open(self.server.log_path, "a") as f:
            f.write("%s %s range=%s status=%d sent=%d ifrange=%s\n" % (self.command, self.path, self.headers.get("Range", "-"),
                                                                      status, sent, self.headers.get("If-Range", "-")))

    def do_HEAD(self):
        self.serve(head=True)

    def do_GET(self):
        self.serve(head=False)

    def serve(self, head):
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        name = urllib.parse.unquote(url.path.lstrip("/"))
        if q.get("redirect") == ["1"]:
            self.send_response(302)
            rest = [(k, v) for k, vs in q.items() if k != "redirect" for v in vs]
            self.send_header("Location", url.path + ("?" + urllib.parse.urlencode(rest) if rest else ""))
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.record(302, 0)
            return
        path = os.path.join(self.server.root, name)
        if not name or "/" in name or name.startswith(".") or not os.path.isfile(path):
            body = b"not found\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            self.record(404, 0)
            return
        st = os.stat(path)
        size = st.st_size
        etag = '"%x-%x"' % (size, st.st_mtime_ns)
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if rng and q.get("norange") != ["1"] and (if_range is None or if_range == etag):
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.record(416, 0)
                return
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or start > end:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                self.record(416, 0)
                return
            status = 206
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "none" if q.get("norange") == ["1"] else "bytes")
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", etag)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        sent = 0
        if not head:
            limit = int(q["cut"][0]) if "cut" in q else length
            with open(path, "rb") as f:
                f.seek(start)
                delay = int(q["slow"][0]) / 1000.0 if "slow" in q else 0
                while sent < min(length, limit):
                    if delay:
                        time.sleep(delay)
                    chunk = f.read(min(65536, min(length, limit) - sent))
                    if not chunk:
                        break
                    try:
                        self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    sent += len(chunk)
            self.wfile.flush()
        self.record(status, sent)
        if sent < length and not head:
            self.close_connection = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.root = os.path.abspath(a.root)
    srv.log_path = a.log
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, a.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
