"""Fixtures of the engine tests: the tiny model (built once), a real `transformers serve` process
serving it on 127.0.0.1, and a small scripted OpenAI-compatible server for the failure modes a
real local server does not produce on demand (429 with Retry-After, 503, `n` choices, reasoning).
Everything is offline: no Hugging Face Hub, no price-list download.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tiny_serving import free_port, serve_tiny_model

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RAW_THINK = "<think>\nplan: read, add</think>\n\n```python\nprint(1)\n```"


@pytest.fixture
def closed_port_api_base() -> str:
    """An api_base where nothing listens (a stopped server)."""
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from shared_models import tiny_model as shared_tiny_model

    return shared_tiny_model()


@pytest.fixture(scope="session")
def served_model(tiny_model_dir, tmp_path_factory) -> Iterator[dict]:
    """`transformers serve <tiny model dir>` on a free port; yields api_base and the model name."""
    with serve_tiny_model(tiny_model_dir, tmp_path_factory.mktemp("serve")) as served:
        served.wait_until_up()
        yield {"api_base": served.api_base, "model": served.model, "log": served.log}


class ScriptedServer:
    """OpenAI-compatible `/v1/chat/completions` whose replies depend on the requested model:

    - `flaky`: 429 with `Retry-After: 1`, then 503, then a normal reply (per ScriptedServer);
    - `no-n`: 400 for a request with `n` > 1;
    - `raw-think`: the reasoning inline in `content` (`RAW_THINK`);
    - anything else: `n` choices, usage with reasoning tokens, and `reasoning_content`;
    - with `return_token_ids` (vLLM's), the prompt's token ids and choice i's `TOKEN_IDS[i]`.
    Every request body is kept in `requests`, its headers in `headers` (lower-case names).
    A `slow` model's replies take 0.2 s (requests overlap).
    """

    RAW_THINK = RAW_THINK
    PROMPT_IDS = (1, 2, 3, 4, 5)
    TOKEN_IDS = ((10, 11, 99, 12), (10, 99, 12, 13, 14, 15), (20,))  # 99 stands for </think>

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._flaky_calls = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append(body)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, headers, payload = server.reply(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for key, value in {**headers, "content-type": "application/json"}.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, body: dict) -> tuple[int, dict, dict]:
        if body["model"] == "flaky":
            self._flaky_calls += 1
            if self._flaky_calls == 1:
                return 429, {"retry-after": "1"}, {"error": {"message": "slow down"}}
            if self._flaky_calls == 2:
                return 503, {}, {"error": {"message": "overloaded"}}
        n = int(body.get("n") or 1)
        if body["model"] == "slow":
            time.sleep(0.2)
        if body["model"] == "no-n" and n > 1:
            return 400, {}, {"error": {"message": "n > 1 is not supported", "code": 400}}
        if body["model"] == "raw-think":  # reasoning inline, as a server without a parser sends
            messages = [{"role": "assistant", "content": RAW_THINK} for _ in range(n)]
        else:
            messages = [
                {"role": "assistant", "content": f"answer {i}", "reasoning_content": f"thought {i}"}
                for i in range(n)
            ]
        choices = [
            {
                "index": i,
                "finish_reason": "stop",
                "message": messages[i],
            }
            for i in range(n)
        ]
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": 7 * n,
            "total_tokens": 10 + 7 * n,
            "completion_tokens_details": {"reasoning_tokens": 3 * n},
        }
        if body.get("return_token_ids"):
            for i, choice in enumerate(choices):
                choice["token_ids"] = list(self.TOKEN_IDS[i % len(self.TOKEN_IDS)])
        payload = {
            "prompt_token_ids": list(self.PROMPT_IDS) if body.get("return_token_ids") else None,
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": choices,
            "usage": usage,
        }
        return 200, {}, payload

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()
