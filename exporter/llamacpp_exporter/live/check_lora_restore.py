"""`llamacpp-exporter check-lora-restore`: is this llama-server affected by the LoRA restore bug?

The bug: a RAM prompt-cache entry restored into a slot is thrown away when the request's LoRA
differs from the *previous request's on that slot*, though the entry was computed under the
request's own LoRA (server-context.cpp launch_slot_with_task compares with slot.lora, which
the restore does not set). The upstream regression sequence shows it on one slot:

1. prompt A with the adapter,  2. prompt B without it,  3. prompt A again with the adapter.

Request 3 finds A's entry in the RAM cache and restores it; an affected server then clears it
("clearing cache for lora change") and computes A from scratch: ``timings.cache_n`` is 0. The
same sequence with no adapter on any request is the control: its third request must reuse A,
or the RAM cache did not restore at all here and nothing can be said about the LoRA.

Every request is pinned to one free slot (``id_slot``), so a server with several slots works;
prompts are short, four tokens each are generated, and a fresh nonce keeps old cache entries
from matching. Six requests in all. With the server's log (``--llama.log-path``, -lv 4) the
verdict also cites the log's own lines. No prompt or completion text is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from .. import parse as p

REQUESTS = 6
FIXED_IN = "upstream llama.cpp PR #30275 (once merged)"
WORKAROUND = "send the same LoRA on every request, or give each adapter its own slots (id_slot)"

EXIT_NOT_AFFECTED, EXIT_AFFECTED, EXIT_REFUSED, EXIT_INCONCLUSIVE = 0, 1, 2, 3


class Refused(Exception):
    """The check cannot run on this server; the message says why and what to do."""


@dataclass
class Run:
    """One sequence (A, B, A) and what its third request reused."""

    with_lora: bool
    prompt_tokens: int  # request 3's prompt (prompt_n + cache_n)
    reused: int  # request 3's cache_n
    discarded: int | None = None  # restores then "clearing cache for lora change" (log given)
    restores: int | None = None  # "found better prompt" restores (log given)

    @property
    def kept(self) -> bool:
        return self.prompt_tokens > 0 and self.reused >= 0.5 * self.prompt_tokens


def _prompt(nonce: str, which: str) -> str:
    words = " ".join(f"{which}{i}" for i in range(40))
    return f"{which.upper()} {nonce}: {words}. Continue:"


class Checker:
    def __init__(self, client: httpx.Client, slot: int | None, adapter: int | None, log_path: str | None) -> None:
        self.client, self.slot, self.adapter, self.log_path = client, slot, adapter, log_path

    def _get(self, path: str) -> Any:
        try:
            r = self.client.get(path)
        except httpx.HTTPError as e:
            raise Refused(f"cannot reach llama-server ({type(e).__name__}): is --llama.url right?") from None
        if r.status_code == 401:
            raise Refused("llama-server wants an API key: give --llama.api-key-file")
        if r.status_code in (404, 501):
            return None
        if r.status_code == 503:
            raise Refused("llama-server is still loading its model: try again when /health answers 200")
        if r.status_code != 200:
            raise Refused(f"llama-server answered {r.status_code} to GET {path}")
        try:
            return r.json()
        except ValueError:
            raise Refused(f"llama-server's answer to GET {path} is not JSON: is --llama.url a llama-server?") from None

    def preflight(self) -> tuple[int, int]:
        """(slot, adapter id) to use, or Refused."""
        adapters = self._get("/lora-adapters")
        if not isinstance(adapters, list) or not adapters:
            raise Refused("the server has no LoRA adapter loaded (start llama-server with --lora FILE): "
                          "the LoRA restore bug cannot occur")  # fmt: skip
        ids: list[int] = [a["id"] for a in adapters if isinstance(a, dict) and isinstance(a.get("id"), int)]
        if not ids:
            raise Refused("/lora-adapters lists no adapter with an id")
        adapter: int = self.adapter if self.adapter is not None else ids[0]
        if adapter not in ids:
            raise Refused(f"no LoRA adapter with id {adapter} (the server has {ids})")
        if self.log_path is not None and self._cache_disabled_in_log():
            raise Refused("the server's log says its RAM prompt cache is disabled (--cache-ram 0): "
                          "nothing is restored, so the bug cannot occur; start it with --cache-ram N")  # fmt: skip
        slots = self._get("/slots")
        if not isinstance(slots, list):
            raise Refused("the server does not answer /slots (--no-slots): the check needs it to pick a free slot")
        slots = [s for s in slots if isinstance(s, dict) and isinstance(s.get("id"), int)]
        idle: list[int] = [s["id"] for s in slots if not s.get("is_processing")]
        if self.slot is not None:
            if self.slot not in [s["id"] for s in slots]:
                raise Refused(f"the server has no slot {self.slot} (it has {len(slots)})")
            if self.slot not in idle:
                raise Refused(f"slot {self.slot} is busy: give a free one with --slot, or wait")
            return self.slot, adapter
        if not idle:
            raise Refused("no free slot: every slot is processing a request; try again when one is idle")
        return idle[0], adapter

    def _cache_disabled_in_log(self) -> bool:
        """The last word of the log on the RAM cache (a TRACE line of the start, -lv 4)."""
        disabled = None
        try:
            with open(self.log_path or "", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if "prompt cache is disabled" in line:
                        disabled = True
                    elif "prompt cache is enabled" in line:
                        disabled = False
        except OSError as e:
            raise Refused(f"cannot read the server's log {self.log_path}: {e.strerror}") from None
        return bool(disabled)

    def _complete(self, prompt: str, slot: int, lora: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"prompt": prompt, "n_predict": 4, "id_slot": slot, "cache_prompt": True, "lora": lora, "temperature": 0}
        try:
            r = self.client.post("/completion", json=body)
        except httpx.HTTPError as e:
            raise Refused(f"a request failed ({type(e).__name__}): the server may be overloaded") from None
        if r.status_code != 200:
            raise Refused(f"llama-server answered {r.status_code} to a check request")
        try:
            timings = r.json().get("timings") or {}
            return {"prompt_n": int(timings.get("prompt_n", 0)), "cache_n": int(timings.get("cache_n", 0))}
        except (ValueError, AttributeError, TypeError):
            raise Refused("llama-server's answer to a check request has no usable timings") from None

    def run(self, slot: int, adapter: int, with_lora: bool) -> Run:
        nonce = secrets.token_hex(6)
        a, b = _prompt(nonce, "alpha"), _prompt(nonce, "bravo")
        on = [{"id": adapter, "scale": 1.0 if with_lora else 0.0}]
        off = [{"id": adapter, "scale": 0.0}]
        log_from = os.path.getsize(self.log_path) if self.log_path and os.path.exists(self.log_path) else None
        self._complete(a, slot, on)
        self._complete(b, slot, off)
        third = self._complete(a, slot, on)
        run = Run(with_lora, third["prompt_n"] + third["cache_n"], third["cache_n"])
        if log_from is not None:
            run.discarded, run.restores = self._log_evidence(log_from, slot)
        return run

    def _log_evidence(self, offset: int, slot: int) -> tuple[int, int]:
        """(restored entries then cleared for a LoRA change, restores) in the log written since
        offset: a restore, then "clearing cache for lora change" on the slot before the task
        launches, is the discard."""
        discards = restores = 0
        restored = False
        with open(self.log_path or "", "rb") as fh:
            fh.seek(offset)
            for raw in fh.read().decode("utf-8", errors="replace").splitlines():
                ev = p.parse_line(raw).event
                if isinstance(ev, p.CacheRestored):
                    restores += 1
                    restored = True
                elif isinstance(ev, p.LoraCacheCleared) and ev.slot == slot and restored:
                    discards += 1
                elif isinstance(ev, p.TaskLaunched):
                    restored = False
        return discards, restores


def verdict(lora: Run, control: Run) -> tuple[int, str]:
    if not control.kept:
        return EXIT_INCONCLUSIVE, (
            f"inconclusive: even without a LoRA the restored prompt was not kept (reused {control.reused} of "
            f"{control.prompt_tokens} tokens), so the RAM cache did not restore here at all: --cache-ram 0, too "
            "small for the prompt, or the entry evicted by other traffic. Nothing is known about the LoRA bug."
        )
    if lora.kept:
        return EXIT_NOT_AFFECTED, (
            f"not affected: with the adapter the restored prompt was kept (reused {lora.reused} of "
            f"{lora.prompt_tokens} tokens), as in the control ({control.reused} of {control.prompt_tokens})."
        )
    evidence = ""
    if lora.discarded:
        evidence = " The log shows it: the entry was restored, then 'clearing cache for lora change' on the slot."
    return EXIT_AFFECTED, (
        f"AFFECTED: the entry restored for a prompt computed under its own LoRA was thrown away (reused "
        f"{lora.reused} of {lora.prompt_tokens} tokens; the control without a LoRA reused {control.reused} of "
        f"{control.prompt_tokens}). The server compared the request's LoRA with the previous request's on "
        f"that slot.{evidence} Fixed in {FIXED_IN}; until then, {WORKAROUND}."
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llamacpp-exporter check-lora-restore",
        description=(
            "Whether this llama-server throws away a restored RAM prompt-cache entry on a LoRA change "
            f"(the LoRA restore bug). Sends {REQUESTS} short requests pinned to one free slot: a prompt with a "
            "LoRA adapter, another without, the first again with it; then the same with no adapter as the "
            "control. Exit 0 not affected, 1 affected, 2 refused, 3 inconclusive."
        ),
    )
    ap.add_argument("--llama.url", dest="url", default="http://127.0.0.1:8080", help="llama-server base URL")
    ap.add_argument("--llama.api-key-file", dest="api_key_file", help="file holding llama-server's API key")
    ap.add_argument("--llama.log-path", dest="log_path", help="the server's log (-lv 4): the verdict cites its lines")
    ap.add_argument("--slot", type=int, help="the slot to use (default: the first free one)")
    ap.add_argument("--adapter", type=int, help="the LoRA adapter id to use (default: the first)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    ap.add_argument("--format", choices=("text", "json"), default="text", help="default text")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    headers = {}
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as fh:
                headers["Authorization"] = f"Bearer {fh.read().strip()}"
        except OSError as e:
            print(
                f"llamacpp-exporter check-lora-restore: cannot read {args.api_key_file}: {e.strerror}", file=sys.stderr
            )
            return EXIT_REFUSED
    with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=args.timeout) as client:
        checker = Checker(client, args.slot, args.adapter, args.log_path)
        try:
            slot, adapter = checker.preflight()
            print(
                f"check-lora-restore: sending {REQUESTS} requests to slot {slot} (3 with LoRA adapter {adapter}, "
                "3 without as the control; 4 tokens each)",
                file=sys.stderr,
            )
            lora = checker.run(slot, adapter, with_lora=True)
            control = checker.run(slot, adapter, with_lora=False)
        except Refused as e:
            print(f"llamacpp-exporter check-lora-restore: refused: {e}", file=sys.stderr)
            return EXIT_REFUSED
    code, text = verdict(lora, control)
    if args.format == "json":
        out = {"verdict": ["not_affected", "affected", "refused", "inconclusive"][code], "message": text}
        print(json.dumps({**out, "slot": slot, "with_lora": asdict(lora), "control": asdict(control)}))
    else:
        print(text)
    return code
