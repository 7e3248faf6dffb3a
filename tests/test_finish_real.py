"""How requests end, against a real llama-server: generations stopped by their token limit,
generations stopped because the context filled up, and a streaming client that went away.
Each response says which (its `truncated`), and the client knows which one it cancelled;
the exporter's llamacpp_requests_finished_total and its records must say the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from realserver import LlamaServer, llama_server_binary, model_files
from support import samples, start_exporter, wait_records

pytestmark = pytest.mark.real_server


def _complete(url: str, words: int, n_predict: int) -> dict[str, Any]:
    prompt = "Tell a long story about " + " ".join(f"word{i}" for i in range(words))
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": n_predict, "temperature": 0}, timeout=120)
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def _cancel_while_streaming(url: str) -> None:
    """Reads the first generated tokens of a long generation, then hangs up."""
    body = {"prompt": "Count from one to a thousand:", "n_predict": 400, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as r:
        for chunk in r.iter_bytes():
            if b"content" in chunk:
                break


def test_requests_stopped_truncated_and_cancelled_are_counted_as_the_responses_say(tmp_path: Path) -> None:
    # 512 tokens of context and no context shift (llama-server's default): a generation that
    # reaches the end of the context stops there, truncated
    srv = LlamaServer(llama_server_binary(), model_files()[0], None, tmp_path / "srv", n_parallel=1, ctx=512).start()
    try:
        exp = start_exporter(srv, tmp_path)
        try:
            answers = [_complete(srv.url, 10, 8), _complete(srv.url, 100, 2000), _complete(srv.url, 20, 8)]
            answers.append(_complete(srv.url, 80, 2000))
            _cancel_while_streaming(srv.url)
            recs = wait_records(tmp_path / "events.jsonl", len(answers) + 1, timeout=60)
            text = exp.metrics_text()
        finally:
            exp.stop()
    finally:
        srv.stop()
    truncated = sum(a["truncated"] for a in answers)
    assert truncated == 2, [(a["truncated"], a["stop_type"], a["tokens_predicted"]) for a in answers]
    finished = {dict(k)["reason"]: v for k, v in samples(text, "llamacpp_requests_finished_total").items()}
    # the client that went away is cancelled by its cancel line, never an ending the log does not show
    assert finished == {
        "stop": len(answers) - truncated,
        "truncated": truncated,
        "cancelled": 1,
        "failed": 0,
        "unknown": 0,
    }
    assert sorted(r["truncated"] for r in recs) == sorted([a["truncated"] for a in answers] + [False])
    (gone,) = [r for r in recs if r["cancelled"]]
    assert not gone["truncated"] and gone["generated_tokens"] is None
