"""The OpenAI completions route on 127.0.0.1 as the one-question probes (ttft_beside_prefill.py,
priority_ttft.py, shared_prefix_urgent.py) send it: plain urllib, no dependencies."""
import json
import time
import urllib.request


def post(port, body, timeout=900):
    """POSTs `body` to /v1/completions; returns the open response (a stream when it asks for one)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def stream_times(port, body):
    """Sends a streaming request; returns (seconds to the first event with text, or None when
    none came, seconds to the end of the stream)."""
    t = time.time()
    first = None
    for line in post(port, dict(body, stream=True)):
        line = line.decode().strip()
        if first is None and line.startswith("data: {"):
            if json.loads(line[6:])["choices"][0]["text"]:
                first = time.time() - t
    return first, time.time() - t
