#!/usr/bin/python3
"""Stand-in for nvidia_gpu_exporter in the lab (no GPU): serves a recorded scrape on the
address given by --web.listen-address, like the real binary."""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

# The recorded scrape, put in by prepare.yml.
SCRAPE = @SCRAPE@.encode()
address = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--web.listen-address="))
host, port = address.rsplit(":", 1)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(SCRAPE if self.path == "/metrics" else b"")

    def log_message(self, *args):
        pass


HTTPServer((host, int(port)), Handler).serve_forever()
