"""`llamacpp-exporter top`: who is slowing everyone down right now.

Reads a running exporter's /api/v1/conversations and prints the conversations by the decode
time their prefills cost the other slots, with the slowdown on top: time per output
token while another slot prefills vs while none does. Pseudonyms only, never text.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
from typing import Any

import httpx

from ..config import DEFAULT_PORT, redact
from ..export.concern import cell

COLUMNS = (
    ("CONVERSATION", "conversation", 14),
    ("SLOT", "slot", 4),
    ("REQS", "requests", 5),
    ("PROMPT", "prompt_tokens", 7),
    ("REUSED", "reused_tokens", 7),
    ("PREFILL s", "prefill_seconds", 10),
    ("COST TO OTHERS s", "cost_to_others_seconds", 17),
    ("WASTED tok", "wasted_prompt_tokens", 10),
    ("LAST MISS CAUSE", "last_miss_cause", 20),
)


def fetch(url: str, timeout: float, client: httpx.Client | None = None) -> dict[str, Any]:
    get = client.get if client is not None else httpx.get
    r = get(url.rstrip("/") + "/api/v1/conversations", timeout=timeout)
    if r.status_code == 401:
        raise httpx.HTTPError("401 Unauthorized: the exporter wants basic auth (--username, --password-file)")
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def client(args: argparse.Namespace) -> httpx.Client:
    """A client for an exporter behind its --web.config.file: basic auth, a CA for its
    certificate, a client certificate where it requires one."""
    auth = None
    if args.username is not None:
        if args.password_file is None:
            raise ValueError("--username needs --password-file")
        with open(args.password_file, encoding="utf-8") as fh:
            auth = (args.username, fh.read().strip())
    verify: ssl.SSLContext | bool = True
    if args.insecure_skip_verify:
        verify = False
    elif args.ca_file or args.cert_file:
        verify = ssl.create_default_context(cafile=args.ca_file)
        if args.cert_file:
            verify.load_cert_chain(args.cert_file, args.key_file)
    return httpx.Client(auth=auth, verify=verify)


def render(data: dict[str, Any], limit: int) -> str:
    c = data.get("contention", {})
    busy, calm = c.get("while_other_slot_prefills", {}), c.get("otherwise", {})

    def speed(d: dict[str, Any]) -> str:
        tps, tpot = d.get("tokens_per_second"), d.get("mean_time_per_output_token_seconds")
        if not tps or tpot is None:
            return f"no data ({d.get('requests', 0)} requests)"
        return f"{tps:.1f} tokens/s ({tpot * 1000:.1f} ms/token, {d.get('requests', 0)} requests)"

    lines = [
        f"llamacpp-exporter top: last {int(data.get('window_seconds', 0))} s",
        f"  generation while another slot prefills: {speed(busy)}",
        f"  generation otherwise:                   {speed(calm)}",
        "",
        " ".join(h.rjust(w) if i else h.ljust(w) for i, (h, _, w) in enumerate(COLUMNS)),
    ]
    rows = data.get("conversations", [])[:limit]
    for r in rows:
        lines.append(
            " ".join(
                cell(r.get(k), 2).rjust(w) if i else cell(r.get(k), 2).ljust(w) for i, (_, k, w) in enumerate(COLUMNS)
            )
        )
    if not rows:
        lines.append("(no conversation in the window)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="llamacpp-exporter top", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}", help="the exporter's address")
    ap.add_argument("--once", action="store_true", help="print one snapshot and exit")
    ap.add_argument("--format", choices=["table", "json"], default="table", help="output format (default table)")
    ap.add_argument("--interval", type=float, default=2.0, help="refresh interval in seconds (default 2)")
    ap.add_argument("--limit", type=int, default=20, help="conversations shown (default 20)")
    ap.add_argument("--timeout", type=float, default=5.0, help="timeout of each request (default 5)")
    tls = ap.add_argument_group("an exporter with --web.config.file (basic auth, TLS)")
    tls.add_argument("--username", help="basic auth user")
    tls.add_argument("--password-file", metavar="FILE", help="file holding the basic auth password")
    tls.add_argument("--ca-file", metavar="FILE", help="CA certificate that signed the exporter's (https:// URLs)")
    tls.add_argument("--cert-file", metavar="FILE", help="client certificate, where the exporter requires one")
    tls.add_argument("--key-file", metavar="FILE", help="the client certificate's key")
    tls.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the exporter's certificate")
    args = ap.parse_args(argv)
    try:
        http = client(args)
    except (OSError, ValueError, ssl.SSLError) as e:
        print(f"llamacpp-exporter top: {e}", file=sys.stderr)
        return 2
    try:
        while True:
            try:
                data = fetch(args.url, args.timeout, http)
            except (httpx.HTTPError, ValueError) as e:
                print(f"llamacpp-exporter top: {redact(f'cannot read {args.url}: {e}')}", file=sys.stderr)
                if args.once:
                    return 1
                time.sleep(args.interval)
                continue
            if args.format == "json":
                data["conversations"] = data.get("conversations", [])[: args.limit]
                out = json.dumps(data, indent=None if not args.once else 2)
            else:
                out = render(data, args.limit)
            if args.once:
                print(out)
                return 0
            if args.format == "table":
                sys.stdout.write("\x1b[H\x1b[2J")  # home and clear, like top(1)
            print(out, flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
