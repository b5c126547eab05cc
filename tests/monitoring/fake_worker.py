"""A plain HTTP server with the endpoints sglang-router calls on a worker (health, server
and model info, generate); enough for the real router to register it and route to it.
Usage: python fake_worker.py HOST PORT"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        if path in ("/health", "/health_generate"):
            self._send(200, {})
        elif path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
            self._send(200, {"model_path": "lab-tiny", "served_model_name": "lab-tiny", "is_generation": True})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "lab-tiny", "object": "model"}]})
        else:
            self._send(404, {})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(200, {"text": "ok", "meta_info": {"id": "0", "finish_reason": {"type": "stop"},
                                                     "prompt_tokens": 1, "completion_tokens": 1}})

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
