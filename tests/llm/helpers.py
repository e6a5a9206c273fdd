"""A stub OpenAI-compatible server on 127.0.0.1 whose replies a test scripts per request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A script entry: (status, body) or ("sleep", seconds) before the next entry, or a callable(request) -> (status, body)
Reply = tuple[int, str]


def completion(text: str, prompt_tokens: int = 11, completion_tokens: int = 3) -> Reply:
    return 200, json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}],
                            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}})


class StubServer:
    """Serves ``/v1/chat/completions``; ``respond(request_json) -> Reply`` decides each answer."""

    def __init__(self, respond: Callable[[dict], Reply | tuple[str, float]]):
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.dropped = 0  # replies the client hung up on before they were written
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                reply = respond(body)
                if reply[0] == "sleep":
                    time.sleep(reply[1])
                    reply = completion("late")
                status, text = reply
                payload = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                try:
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    with lock:
                        server.dropped += 1

            def log_message(self, *args):  # keep test output clean
                pass

        lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
