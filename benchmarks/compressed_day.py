"""A compressed day of a llama-server in production, followed by the exporter as users run it.

About 20 minutes of multi-user traffic against a real llama-server (the test command's build,
4 slots, --cache-ram, a LoRA adapter, --embeddings): chat users with and without the adapter
(some send X-Conversation-Id, some do not), requests with n = 2, embeddings, clients that give
up. Meanwhile, at fixed points of the day: the exporter killed (SIGKILL) three times and started
again, llama-server's --log-file rotated (deploy/logrotate/rotate.sh), llama-server restarted three
times (the first into -lv 3, the second back to -lv 4; each drained first, as an operator's
restart), and the adapter's global scale changed by POST /lora-adapters. A real Prometheus scrapes
the exporter every second with the shipped rules, LlamaCppExporterBlind's window compressed like
the day (--blind-window, default 2m; its `for` 30s).

It prints:
- every answered request's record against its response's timings (prompt, reused, computed and
  generated tokens, prefill and decode time, LoRA state, choices): exact, unknown with its reason,
  or wrong (listed); requests without a record; records without a response (clients that gave up);
  conversations named, and named wrong;
- the events file: records written, and written twice;
- the exporter's memory over the day (each life after a kill apart: flat after warm-up?);
- the log's share of llama-server's own token counters in each stretch of the day, and when
  LlamaCppExporterBlind's expression held (expected: the -lv 3 stretch only) and which alerts fired.

Not part of the test command (it takes the day's length). Nothing passes or fails on figures;
it exits 1 only if the run itself broke.

    .venv/bin/python benchmarks/compressed_day.py [--minutes 20] [--blind-window 2m]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from procfs import rss_mib  # noqa: E402
from promql import Prometheus  # noqa: E402
from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files  # noqa: E402
from workload import LORA_ACTIVE, text  # noqa: E402

from llamacpp_exporter.assemble.attribution import MAX_TASKS  # noqa: E402
from llamacpp_exporter.assemble.join import MAX_RESULTS  # noqa: E402
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer  # noqa: E402
from mixin import queries, rules  # noqa: E402

SALT = "a-compressed-day-of-enough-length"
GLOBAL_SCALE = 0.25  # the adapter's global scale after the day's POST /lora-adapters


# ------------------------------------------------------------------ the day's traffic


@dataclass
class Response:
    """One answered request: what was sent and what the server answered (numbers only)."""

    kind: str  # chat, n2, embedding
    conv: str | None  # the X-Conversation-Id sent, if any
    lora: str  # the adapter state it ran with: active, none, or "either" (global scale changed meanwhile)
    t0: float
    t1: float
    run: int  # which llama-server process answered (0..3)
    verbosity: int
    choices: int = 1
    prompt_n: int = 0
    cache_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    inputs: int = 0  # embeddings: documents embedded
    usage_prompt_tokens: int = 0


@dataclass
class Day:
    """What the traffic and the orchestrator share: the gate a drain closes, requests in flight."""

    url: str
    end: float
    open: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    run: int = 0
    verbosity: int = 4
    scale_changes: list[float] = field(default_factory=list)  # when the global scale changed
    global_scale: float = 0.0
    answered: list[Response] = field(default_factory=list)
    gave_up: int = 0
    refused: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def over(self) -> bool:
        return time.time() >= self.end

    def post(
        self,
        client: httpx.Client,
        path: str,
        body: dict[str, Any],
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> tuple[Any, int, int, float]:
        """POST once the gate is open; the response's JSON, the server run and verbosity it ran
        under, and the global adapter scale in force when it was sent."""
        while not self.open.wait(1.0):
            if self.over():
                raise TimeoutError("the day ended")
        with self.lock:
            self.in_flight += 1
            run, verbosity, scale = self.run, self.verbosity, self.global_scale
        try:
            r = client.post(path, json=body, timeout=timeout, headers=headers)
            r.raise_for_status()
            return r.json(), run, verbosity, scale
        finally:
            with self.lock:
                self.in_flight -= 1

    def lora_state(self, explicit: bool, scale: float, t0: float) -> str:
        if explicit:
            return "active"
        if any(t0 <= t <= time.time() for t in self.scale_changes):
            return "either"
        return "active" if scale else "none"

    def answer(self, resp: Response) -> None:
        with self.lock:
            self.answered.append(resp)


def _timings(resp: Response, t: dict[str, Any]) -> Response:
    resp.prompt_n, resp.cache_n = int(t["prompt_n"]), int(t["cache_n"])
    resp.prompt_ms, resp.predicted_n, resp.predicted_ms = (
        float(t["prompt_ms"]),
        int(t["predicted_n"]),
        float(t["predicted_ms"]),
    )
    return resp


def chat_user(day: Day, user: int) -> None:
    """Conversation after conversation: users 0 and 3 with the adapter on every turn, 1 and 4
    without it, 2 alternating per turn; users 0-2 send X-Conversation-Id, 3 and 4 do not."""
    rng = random.Random(f"day-{user}")
    n = 0
    with httpx.Client(base_url=day.url) as c:
        while not day.over():
            name = f"user{user}-conv{n}"
            n += 1
            headers = {"X-Conversation-Id": name} if user < 3 else {}
            messages = [{"role": "system", "content": f"assistant {name}. " + text(rng, rng.choice((30, 400, 900)))}]
            for turn in range(rng.randint(2, 7)):
                if day.over():
                    return
                messages.append({"role": "user", "content": text(rng, rng.randint(15, 70))})
                explicit = user in (0, 3) or (user == 2 and turn % 2 == 0)
                body: dict[str, Any] = {"messages": messages, "max_tokens": rng.randint(8, 48), "temperature": 0}
                body["cache_prompt"] = True
                if explicit:
                    body["lora"] = LORA_ACTIVE
                t0 = time.time()
                try:
                    res, run, verbosity, scale = day.post(c, "/v1/chat/completions", body, 600, headers)
                except TimeoutError:
                    return
                except httpx.HTTPError as e:
                    with day.lock:
                        day.errors[type(e).__name__] += 1
                    break  # the conversation is lost to the client: a new one
                resp = Response(
                    "chat",
                    headers.get("X-Conversation-Id"),
                    day.lora_state(explicit, scale, t0),
                    t0,
                    time.time(),
                    run,
                    verbosity,
                )
                day.answer(_timings(resp, res["timings"]))
                messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or "ok"})
                time.sleep(rng.uniform(0.3, 2.0))
            time.sleep(rng.uniform(1.0, 4.0))


def quick_client(day: Day, kind: str, seed: str, until: float) -> None:
    """Short requests back to back, as a classifier's calls or a batch job: a short prompt, a few
    tokens, no conversation. They make the many tasks that fill the exporter's per-task tables."""
    rng = random.Random(seed)
    with httpx.Client(base_url=day.url) as c:
        while time.time() < until:
            messages = [{"role": "user", "content": text(rng, rng.randint(4, 12))}]
            body = {"messages": messages, "max_tokens": rng.randint(2, 5), "temperature": 0}
            t0 = time.time()
            try:
                res, run, verbosity, scale = day.post(c, "/v1/chat/completions", body, 600)
            except TimeoutError:
                return
            except httpx.HTTPError as e:
                with day.lock:
                    day.errors[type(e).__name__] += 1
                continue
            resp = Response(kind, None, day.lora_state(False, scale, t0), t0, time.time(), run, verbosity)
            day.answer(_timings(resp, res["timings"]))


def side_clients(day: Day) -> None:
    """Every few seconds one of: a chat with n = 2, an embeddings request of 2-3 documents, or a
    client that gives up (a long prompt, 1 s of patience)."""
    rng = random.Random("day-side")
    k = 0
    with httpx.Client(base_url=day.url) as c:
        while not day.over():
            time.sleep(rng.uniform(2.0, 6.0))
            k += 1
            t0 = time.time()
            try:
                if k % 3 == 0:
                    body = {"messages": [{"role": "user", "content": text(rng, 20)}], "max_tokens": 6, "n": 2}
                    res, run, verbosity, scale = day.post(c, "/v1/chat/completions", body, 600)
                    resp = Response("n2", None, day.lora_state(False, scale, t0), t0, time.time(), run, verbosity)
                    resp.choices = len(res["choices"])
                    day.answer(_timings(resp, res["timings"]))
                elif k % 3 == 1:
                    docs = [text(rng, rng.randint(5, 30)) for _ in range(rng.randint(2, 3))]
                    res, run, verbosity, scale = day.post(c, "/v1/embeddings", {"input": docs}, 600)
                    resp = Response(
                        "embedding", None, day.lora_state(False, scale, t0), t0, time.time(), run, verbosity
                    )
                    resp.inputs, resp.usage_prompt_tokens = len(docs), int(res["usage"]["prompt_tokens"])
                    day.answer(resp)
                else:
                    body = {"prompt": text(rng, 1500), "n_predict": 64, "cache_prompt": True}
                    try:
                        day.post(c, "/completion", body, 1.0)
                    except httpx.TimeoutException:
                        with day.lock:
                            day.gave_up += 1
                    else:
                        with day.lock:
                            day.errors["a give-up client answered in time"] += 1
            except TimeoutError:
                return
            except httpx.HTTPError as e:
                with day.lock:
                    day.errors[type(e).__name__] += 1


# ------------------------------------------------------------------ the day's events


@dataclass
class Timeline:
    t0: float
    marks: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.marks.append((time.time(), what))
        print(f"  {time.time() - self.t0:7.1f} s  {what}", flush=True)


def drain(day: Day) -> None:
    """Close the gate and wait for the requests in flight (an operator's graceful restart)."""
    day.open.clear()
    deadline = time.time() + 600
    while day.in_flight and time.time() < deadline:
        time.sleep(0.1)


def rotate(log: Path) -> None:
    busybox = shutil.which("busybox")
    if busybox is None:
        raise SystemExit("busybox is missing: run tests/setup/setup.sh")
    env = {**os.environ, "LOG": str(log), "MAX_MB": "0", "KEEP": "3"}
    subprocess.run([busybox, "sh", str(ROOT / "deploy/logrotate/rotate.sh"), "--once"], check=True, env=env)


def compressed_rules(work: Path, window: str) -> list[Path]:
    """The shipped rules, LlamaCppExporterBlind's window and `for` compressed like the day."""
    c = queries.thresholds()
    c["exporter_blind"] = {**c["exporter_blind"], "window": window, "for": "30s"}
    out = []
    for name, doc in (("rules.yaml", rules.recording_rules(c)), ("alerts.yaml", rules.alerting_rules(c))):
        p = work / name
        p.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
        out.append(p)
    return out


# ------------------------------------------------------------------ checking


CHECKED = ("prompt_tokens", "reused_tokens", "prefill_tokens", "generated_tokens", "lora", "choices")


def expected(resp: Response) -> dict[str, Any]:
    return {
        "prompt_tokens": resp.prompt_n + resp.cache_n,
        "reused_tokens": resp.cache_n,
        "prefill_tokens": resp.prompt_n,
        "generated_tokens": resp.predicted_n,
        "lora": resp.lora,
        "choices": resp.choices,
    }


def unknown_reason(name: str, rec: dict[str, Any], resp: Response) -> str:
    if name in ("prompt_tokens", "reused_tokens"):
        return (
            "reused tokens: -lv 3 logs none, and /slots did not show the task"
            if resp.verbosity < 4
            else f"{name} not in the log"
        )
    if name == "lora" and rec.get("lora_config") == "global":
        return "LoRA state: no list sent, and the global scales at its launch not known (after a restart, around the change)"
    if name == "lora":
        return "LoRA state: /slots did not show the task's list"
    return f"{name} unknown"


def same_time(rec: dict[str, Any], resp: Response) -> bool:
    return (
        rec.get("prefill_seconds") is not None
        and rec.get("decode_seconds") is not None
        and abs(rec["prefill_seconds"] * 1000 - resp.prompt_ms) <= 0.0051
        and abs(rec["decode_seconds"] * 1000 - resp.predicted_ms) <= 0.0051
    )


def check(day: Day, records: list[dict[str, Any]]) -> dict[str, Any]:
    completions = [r for r in records if r["kind"] == "completion"]
    taken: set[int] = set()
    verdicts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    wrong: list[str] = []
    names = Counter[str]()
    ps = Pseudonymizer(SALT)
    chats = [a for a in day.answered if a.kind != "embedding"]
    by_prefill: defaultdict[int, list[int]] = defaultdict(list)  # the log prints hundredths of a ms
    for i, r in enumerate(completions):
        if r.get("prefill_seconds") is not None:
            by_prefill[round(r["prefill_seconds"] * 100_000)].append(i)
    for resp in chats:
        near = round(resp.prompt_ms * 100)
        pool = by_prefill[near - 1] + by_prefill[near] + by_prefill[near + 1]
        cands = [i for i in pool if i not in taken and same_time(completions[i], resp)]
        if len(cands) != 1:
            verdicts["no record" if not cands else "several records"] += 1
            continue
        taken.add(cands[0])
        rec = completions[cands[0]]
        want = expected(resp)
        bad, unknown = [], []
        for name in CHECKED:
            got = rec.get(name)
            if name == "lora" and want["lora"] == "either":
                continue
            if got is None or got == "unknown":
                unknown.append(unknown_reason(name, rec, resp))
            elif got != want[name]:
                bad.append(f"{name} {got} (response: {want[name]})")
        if rec.get("cancelled") or rec.get("failed"):
            bad.append("taken for cancelled or failed")
        if bad:
            verdicts["wrong"] += 1
            wrong.append(f"{resp.kind} run {resp.run} task {rec['task']}: " + ", ".join(bad))
        elif unknown:
            verdicts["exact where known"] += 1
            reasons.update(set(unknown))
        else:
            verdicts["exact"] += 1
        source = rec.get("conversation_source")
        names[source or "none"] += 1
        if source == "header" and (resp.conv is None or rec["conversation"] != ps("id:" + resp.conv)):
            names["header, wrong"] += 1
    left = [r for i, r in enumerate(completions) if i not in taken]
    embeddings = [r for r in records if r["kind"] == "embedding"]
    emb_sent = [a for a in day.answered if a.kind == "embedding"]
    return {
        "answered": len(chats),
        "kinds": Counter(a.kind for a in chats),
        "verdicts": verdicts,
        "reasons": reasons,
        "wrong": wrong,
        "conversations": names,
        "unanswered records": Counter(
            "cancelled"
            if r.get("cancelled")
            else "failed"
            if r.get("failed")
            else "finished"
            if r.get("generated_tokens") is not None
            else "ending unknown"
            for r in left
        ),
        "embedding records": len(embeddings),
        "embedding inputs sent": sum(a.inputs for a in emb_sent),
        "embedding inputs sent at -lv 3": sum(a.inputs for a in emb_sent if a.verbosity < 4),
        "embedding prompt tokens": (
            sum(r.get("prompt_tokens") or 0 for r in embeddings),
            sum(a.usage_prompt_tokens for a in emb_sent),
        ),
    }


def read_events(path: Path) -> tuple[list[dict[str, Any]], int, int]:
    """The records (each once, by its identity), how many lines were records, and proof lines."""
    files = sorted(path.parent.glob(path.name + "*"), key=lambda p: p.name)
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    lines = proofs = 0
    for p in files:
        if p.name.endswith("log-position"):
            continue
        for line in p.read_text().splitlines():
            obj = json.loads(line)
            if "proof" in obj:
                proofs += 1
                continue
            lines += 1
            seen.setdefault((obj.get("model"), obj["slot"], obj["task"], obj.get("start_us")), obj)
    return list(seen.values()), lines, proofs


def query_range(prom: Prometheus, promql: str, start: float, end: float, step: float = 5.0) -> list[dict[str, Any]]:
    r = httpx.get(
        prom.url + "/api/v1/query_range", params={"query": promql, "start": start, "end": end, "step": step}, timeout=30
    )
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def query_at(prom: Prometheus, promql: str, at: float) -> list[dict[str, Any]]:
    r = httpx.get(prom.url + "/api/v1/query", params={"query": promql, "time": at}, timeout=30)
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def tasks_seen(prom: Prometheus, at: float) -> int:
    """Requests and embedding tasks the exporter has counted since it started (its counters
    start again at 0 in each life)."""
    n = 0
    for family in ("llamacpp_requests_total", "llamacpp_embedding_tasks_total"):
        res = query_at(prom, f"sum({family})", at)
        n += int(float(res[0]["value"][1])) if res else 0
    return n


# ------------------------------------------------------------------ the day


EVENTS = (
    (0.10, "kill"),
    (0.20, "rotate"),
    (0.28, "restart -lv 3"),
    (0.36, "kill"),
    (0.46, "restart -lv 4"),
    (0.54, "scale"),
    (0.62, "kill"),
    (0.76, "restart -lv 4"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--blind-window", default="2m", help="LlamaCppExporterBlind's window for the compressed day")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    ap.add_argument(
        "--max-tracked",
        type=int,
        default=2000,
        help="the exporter's --conversations.max-tracked: each batch request is a conversation of its own",
    )
    ap.add_argument("--quick", type=int, default=2, help="clients sending short requests back to back all day")
    ap.add_argument(
        "--batch-minutes",
        type=float,
        default=15.0,
        help="after the day, a batch job of short requests (4 clients) in the exporter's last life: "
        "enough tasks to fill its per-task tables, so that its memory can level off",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compressed-day-"))
    binary = llama_server_binary()
    model, lora = model_files()
    server = LlamaServer(
        binary, model, lora, work / "server", n_parallel=4, ctx=16384, cache_ram=256, log_file=True,
        extra=["--embeddings", "--pooling", "mean"],
    )  # fmt: skip
    server.start()
    salt = work / "salt"
    salt.write_text(SALT + "\n")
    events = work / "exporter" / "events.jsonl"
    exp_args = ["--llama.url", server.url, "--llama.log-path", str(server.log_path), "--llama.log-from-start"]
    exp_args += ["--events.path", str(events), "--llama.poll-interval", "1", "--conversations.salt-file", str(salt)]
    exp_args += ["--conversations.max-tracked", str(args.max_tracked)]
    exporter = ExporterProcess(exp_args, work / "exporter").start()
    prom = Prometheus(
        work / "prometheus",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in compressed_rules(work, args.blind_window)],
            "scrape_configs": [
                {"job_name": "llamacpp", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
            ],
        },
    )
    prom.wait_scraped(1)
    length = args.minutes * 60
    start = time.time()
    day = Day(server.url, start + length)
    day.open.set()
    tl = Timeline(start)
    memory: list[tuple[float, int, float]] = []  # (seconds into the day, exporter life, RSS MiB)
    life = [0]
    print(f"== a compressed day of {args.minutes:g} minutes (work directory {work})", flush=True)
    tl.mark(f"traffic starts: 5 chat users, {args.quick} quick clients, n = 2, embeddings, clients that give up")

    sampling = threading.Event()
    sampling.set()

    def sample_memory() -> None:
        while sampling.is_set():
            proc = exporter.proc
            if proc is not None and proc.poll() is None:
                mib = rss_mib(proc.pid)
                if mib is not None:
                    memory.append((time.time() - start, life[0], mib))
            time.sleep(5.0)

    threads = [threading.Thread(target=chat_user, args=(day, u), daemon=True) for u in range(5)]
    threads += [
        threading.Thread(target=quick_client, args=(day, "quick", f"quick-{k}", day.end), daemon=True)
        for k in range(args.quick)
    ]
    threads += [threading.Thread(target=side_clients, args=(day,), daemon=True)]
    sampler = threading.Thread(target=sample_memory, daemon=True)
    for t in [*threads, sampler]:
        t.start()
    stretches: list[tuple[float, str]] = [(start, "-lv 4")]
    try:
        for at, what in EVENTS:
            time.sleep(max(0.0, start + at * length - time.time()))
            if what == "kill":
                assert exporter.proc is not None
                exporter.proc.send_signal(signal.SIGKILL)
                exporter.proc.wait(10)
                tl.mark(f"exporter killed (SIGKILL), life {life[0]} ends")
                time.sleep(5.0)
                life[0] += 1
                exporter.start()
                tl.mark(f"exporter started again, life {life[0]}")
            elif what == "rotate":
                rotate(server.log_path)
                tl.mark("llama-server's log rotated (copytruncate, rotate.sh)")
            elif what == "scale":
                r = httpx.post(server.url + "/lora-adapters", json=[{"id": 0, "scale": GLOBAL_SCALE}], timeout=10)
                r.raise_for_status()
                with day.lock:
                    day.global_scale = GLOBAL_SCALE
                    day.scale_changes.append(time.time())
                tl.mark(f"POST /lora-adapters: the adapter's global scale 0 -> {GLOBAL_SCALE}")
            else:
                verbosity = int(what.split()[-1])
                drain(day)
                server.stop()
                server.verbosity = verbosity
                server.start()
                with day.lock:
                    day.run += 1
                    day.verbosity = verbosity
                    day.global_scale = 0.0  # a new process starts with --lora-init-without-apply
                day.open.set()
                stretches.append((time.time(), f"-lv {verbosity}"))
                tl.mark(f"llama-server restarted at -lv {verbosity} (drained first), run {day.run}")
        time.sleep(max(0.0, day.end - time.time()))
        tl.mark("traffic stops")
        for t in threads:
            t.join(timeout=120)
        if args.batch_minutes > 0:
            until = time.time() + args.batch_minutes * 60
            batch = [
                threading.Thread(target=quick_client, args=(day, "batch", f"batch-{k}", until), daemon=True)
                for k in range(4)
            ]
            tl.mark(f"a batch job: 4 clients of short requests back to back for {args.batch_minutes:g} minutes")
            for t in batch:
                t.start()
            for t in batch:
                t.join(timeout=args.batch_minutes * 60 + 120)
            tl.mark("the batch job ends")
        time.sleep(5.0)  # the last lines read, the last scrape and evaluation
        sampling.clear()
        end = time.time()
        metrics = exporter.metrics_text()
        report(day, tl, events, memory, prom, stretches, start, end, args.blind_window, metrics, args.max_tracked)
    finally:
        exporter.stop()
        server.stop()
        prom.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def report(
    day: Day,
    tl: Timeline,
    events: Path,
    memory: list[tuple[float, int, float]],
    prom: Prometheus,
    stretches: list[tuple[float, str]],
    start: float,
    end: float,
    window: str,
    metrics: str,
    max_tracked: int,
) -> None:
    records, lines, proofs = read_events(events)
    print("\n== the events file")
    print(
        f"record lines {lines}, distinct records {len(records)}, written twice {lines - len(records)}; proof lines {proofs}"
    )
    got = check(day, records)
    print("\n== every answered request against its record")
    print(
        f"answered requests (chat, quick and n = 2): {got['answered']} {dict(got['kinds'])}; clients that gave up: {day.gave_up}; client errors: {dict(day.errors)}"
    )
    for verdict, n in sorted(got["verdicts"].items()):
        print(f"  {verdict:>20}: {n}")
    for reason, n in got["reasons"].most_common():
        print(f"    unknown, {n} requests: {reason}")
    for w in got["wrong"][:20]:
        print(f"    WRONG {w}")
    print(f"records without a response (the clients that gave up): {dict(got['unanswered records'])}")
    print(f"conversations: {dict(got['conversations'])}")
    print(
        f"embeddings: {got['embedding records']} records for {got['embedding inputs sent']} documents sent "
        f"({got['embedding inputs sent at -lv 3']} of them at -lv 3, where the log cannot tell an embedding task: "
        "a task without timings, 'ending unknown' above); "
        f"prompt tokens {got['embedding prompt tokens'][0]} in the records, {got['embedding prompt tokens'][1]} in the responses"
    )

    print(
        f"\n== the exporter's memory (RSS MiB) by life, every minute, with the tasks it has seen (its tables "
        f"hold at most {MAX_TASKS} or {MAX_RESULTS} tasks, and the conversations of --conversations.window "
        f"up to --conversations.max-tracked {max_tracked})"
    )
    by_life: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t, lf, mib in memory:
        by_life[lf].append((t, mib))
    for lf, pts in sorted(by_life.items()):
        row = []
        next_minute = pts[0][0]
        for t, mib in pts:
            if t >= next_minute:
                row.append(f"{t / 60:4.1f}m {mib:5.1f} ({tasks_seen(prom, start + t)} tasks)")
                next_minute = t + 60
        warm = [mib for t, mib in pts if t >= pts[0][0] + 60]
        growth = (
            f"after its first minute {min(warm):.1f} -> {warm[-1]:.1f} (max {max(warm):.1f})" if warm else "too short"
        )
        print(f"  life {lf}: {', '.join(row)}; {growth}")
        full = next((t for t, _ in pts[:: max(1, len(pts) // 60)] if tasks_seen(prom, start + t) >= MAX_RESULTS), None)
        if full is not None:
            after = [mib for t, mib in pts if t >= full]
            print(
                f"    past {MAX_RESULTS} tasks from {full / 60:.1f} min: RSS {after[0]:.1f} -> {after[-1]:.1f} "
                f"(min {min(after):.1f}, max {max(after):.1f}) over {(pts[-1][0] - full) / 60:.1f} min"
            )

    print("\n== the log's share of llama-server's own token counters, by stretch of the day")
    marks = [t for t, _ in tl.marks]
    cuts = sorted({start, *marks, end})
    sel = 'job="llamacpp"'
    for a, b in zip(cuts, cuts[1:], strict=False):
        if b - a < 30:
            continue
        lv = next(name for t, name in reversed(stretches) if t <= a + 1)
        secs = int(b - a)
        shares = []
        for kind in queries.LOG_SHARE_KINDS:
            res = query_at(prom, queries.log_share(kind, sel, "instance", f"{secs}s"), b)
            shares.append(f"{kind} {float(res[0]['value'][1]):.1%}" if res else f"{kind} -")
        print(f"  {(a - start) / 60:5.1f}-{(b - start) / 60:5.1f} min ({lv}): " + ", ".join(shares))

    print(f"\n== alerts over the day (LlamaCppExporterBlind's window {window}, for 30s)")
    active: dict[tuple[str, str], list[float]] = defaultdict(list)
    for series in query_range(prom, "ALERTS", start, end):
        m = series["metric"]
        key = (m["alertname"], m["alertstate"] + (f" {m['kind']}" if "kind" in m else ""))
        active[key] += [float(t) for t, _ in series["values"]]
    if not active:
        print("  none")
    for (name, state), ts in sorted(active.items()):
        spans: list[list[float]] = []
        for t in sorted(set(ts)):
            if spans and t - spans[-1][1] <= 10:
                spans[-1][1] = t
            else:
                spans.append([t, t])
        text_spans = ", ".join(f"{(a - start) / 60:.1f}-{(b - start) / 60:.1f} min" for a, b in spans)
        print(f"  {name} ({state}): {text_spans}")
    print("\n== the day's events")
    for t, what in tl.marks:
        print(f"  {(t - start) / 60:5.1f} min  {what}")
    unrec = [
        line for line in metrics.splitlines() if line.startswith("llamacpp_exporter_log_lines_unrecognized_total{")
    ]
    print(f"unrecognized lines (last life): {len(unrec)} series")


if __name__ == "__main__":
    sys.exit(main())
