"""A server's version is what it answers to GET /version (cellbench.serve.server.observe_version):
a real HTTP server on loopback, whose answer the test changes, and one without the endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cellbench.serve.server import observe_version


@pytest.fixture
def server():
    state = {"answer": {"version": "0.31.0"}, "status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(state["answer"]).encode()
            self.send_response(state["status"] if self.path == "/version" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()


def test_the_recorded_version_follows_the_servers_answer(server):
    base, state = server
    assert observe_version(base)["version"] == "0.31.0"
    state["answer"] = {"version": "0.32.0"}
    seen = observe_version(base)
    assert seen == {"observed_from": "GET /version", "version": "0.32.0", "http_status": 200}


def test_a_server_without_the_endpoint_gives_null_and_its_status(server):
    base, state = server
    state["status"] = 404
    seen = observe_version(base)
    assert seen["version"] is None and seen["http_status"] == 404


def test_no_server_gives_null_and_the_error():
    seen = observe_version("http://127.0.0.1:9", timeout_s=2)
    assert seen["version"] is None and "ConnectionError" in seen["error"]
