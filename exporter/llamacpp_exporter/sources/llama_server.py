"""llama-server's HTTP endpoints: /health, /slots, /metrics, /lora-adapters.

Pure parsers (``parse_slots``, ``parse_lora_adapters``, ``rename_server_metrics``) plus a
background poller. The poller, not the scrape, talks to llama-server, with short
timeouts: a slow or dead server never blocks a scrape of the exporter. /slots is polled
when the log shows a new task (to capture each task's ``params.lora`` and reused tokens
while it runs) and periodically.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from ..config import redact
from ..records import MAX_SLOTS, LoraAdapters, SlotsSnapshot, SlotState

log = logging.getLogger(__name__)

SERVER_PREFIX = "llamacpp_server_"
# /metrics, /slots and /lora-adapters are tasks in llama-server's queue: a long prompt batch
# can hold them for seconds. Giving up early would make llama-server log "cancel task" for
# them, which the conversation join would have to tell apart from a cancelled request; and
# polling happens off the scrape path, so waiting costs nothing. /health never waits.
QUEUED_READ_TIMEOUT = 60.0
# Largest answer read from each endpoint: a bigger one is dropped and counted, never buffered
# whole (a 512-slot /slots answer with long prompts is a few MB).
MAX_ANSWER_BYTES = {
    "health": 64 << 10,
    "metrics": 4 << 20,
    "slots": 32 << 20,
    "lora-adapters": 1 << 20,
    "models": 4 << 20,
}


class _Answer:
    """The part of an HTTP answer the poller uses, read under a size cap and a deadline."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Refused(Exception):
    """Answer too big, or too slow in total."""


# ---------------------------------------------------------------- pure parsers
def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# objects in a /slots answer, at most: a slot is a few dozen (its params, its LoRA list)
MAX_SLOTS_OBJECTS = MAX_SLOTS * 256


def slots_json(body: bytes) -> Any:
    """Parse /slots, refusing an answer of far more objects than any server's slots hold
    before building them (31 MB of tiny objects would take the better part of a GiB)."""
    if body.count(b"{") > MAX_SLOTS_OBJECTS:
        raise ValueError(f"/slots holds more than {MAX_SLOTS_OBJECTS} objects")
    return json.loads(body)


def parse_slots(obj: Any, model: str = "") -> SlotsSnapshot:
    """``/slots`` JSON -> numeric slot states. Text fields (prompt, generated) are never read."""
    if not isinstance(obj, list):
        raise ValueError("/slots did not return a list")
    if len(obj) > MAX_SLOTS:
        raise ValueError(f"/slots listed {len(obj)} slots, more than {MAX_SLOTS}")
    slots = []
    for el in obj:
        if not isinstance(el, dict) or _int(el.get("id")) is None:
            continue
        if not 0 <= el["id"] < len(obj):
            continue  # llama-server numbers its slots 0..n-1; another id would be a new series
        params = el.get("params") if isinstance(el.get("params"), dict) else {}
        lora_raw = params.get("lora") if params else None
        lora: tuple[tuple[int, float], ...] | None = None
        if isinstance(lora_raw, list):
            items = []
            for a in lora_raw:
                if isinstance(a, dict) and _int(a.get("id")) is not None and isinstance(a.get("scale"), (int, float)):
                    items.append((int(a["id"]), float(a["scale"])))
            lora = tuple(sorted(items))
        nt = el.get("next_token")
        n_decoded = None
        if isinstance(nt, list) and nt and isinstance(nt[0], dict):
            n_decoded = _int(nt[0].get("n_decoded"))
        slots.append(
            SlotState(
                id=el["id"],
                id_task=_int(el.get("id_task")),
                is_processing=bool(el.get("is_processing")),
                n_prompt_tokens=_int(el.get("n_prompt_tokens")),
                n_prompt_tokens_processed=_int(el.get("n_prompt_tokens_processed")),
                n_prompt_tokens_cache=_int(el.get("n_prompt_tokens_cache")),
                n_decoded=n_decoded,
                lora=lora,
                n_ctx=_int(el.get("n_ctx")),
            )
        )
    return SlotsSnapshot(tuple(slots), model)


def context_usage(snap: SlotsSnapshot) -> float:
    """Tokens held over context size, summed over the slots; NaN if /slots does not say."""
    held = total = 0
    for s in snap.slots:
        if s.n_ctx is None or s.n_ctx <= 0:
            return float("nan")
        total += s.n_ctx
        held += min((s.n_prompt_tokens or 0) + (s.n_decoded or 0), s.n_ctx)
    return held / total if total else float("nan")


def loaded_models(obj: Any) -> list[str] | None:
    """A router's ``/models``: the models loaded now (status "loaded"). None when the answer is
    not a router's (a plain server's entries have no status)."""
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    out, router = [], False
    for m in data:
        if not isinstance(m, dict):
            continue
        status = m.get("status")
        if not isinstance(status, dict):
            continue
        router = True
        if status.get("value") == "loaded" and isinstance(m.get("id"), str):
            out.append(m["id"])
    return out if router else None


def with_model_label(families: list[Metric], model: str) -> list[Metric]:
    for fam in families:
        fam.samples = [Sample(s.name, {**s.labels, "model": model}, s.value) for s in fam.samples]
    return families


def merge_families(per_model: list[list[Metric]]) -> list[Metric]:
    """One family per name, with every model's samples."""
    merged: dict[str, Metric] = {}
    for fams in per_model:
        for fam in fams:
            if fam.name in merged:
                merged[fam.name].samples.extend(fam.samples)
            else:
                merged[fam.name] = fam
    return list(merged.values())


def parse_lora_adapters(obj: Any, model: str = "") -> LoraAdapters:
    if not isinstance(obj, list):
        raise ValueError("/lora-adapters did not return a list")
    scales = []
    for a in obj:
        if isinstance(a, dict) and _int(a.get("id")) is not None and isinstance(a.get("scale"), (int, float)):
            scales.append((int(a["id"]), float(a["scale"])))
    return LoraAdapters(tuple(sorted(scales)), model)


MAX_SERVER_SERIES = 1000  # per re-exported family: llama-server's own have a handful

# llama-server's throughput gauges are averages since the previous GET /metrics, and each GET
# resets them (server-context.cpp, b11434 around line 5040): the exporter's own poll defines
# their window, and a Prometheus scraping llama-server as well sees shorter averages.
_RESET_BY_POLL = ("prompt_tokens_seconds", "predicted_tokens_seconds")
_RESET_HELP = (
    " Averaged since the previous GET /metrics, which resets it: here, since the exporter's previous "
    "poll. Prefer rate() of the _total counters."
)
# Since llama.cpp PR #26920 (b11434 has it) prompt_tokens_total excludes tokens reused from the
# cache, which prompt_tokens_cached_total counts; before it, prompt_tokens_total counted them in.
_PROMPT_HELP_NEW = (
    "Prompt tokens computed (prefilled), tokens reused from the cache excluded: this build reports them in "
    "llamacpp_server_prompt_tokens_cached_total (llama.cpp PR #26920 and later)."
)
_PROMPT_HELP_OLD = (
    "Prompt tokens processed, tokens reused from the cache included: this build predates llama.cpp PR #26920 "
    "(it has no prompt_tokens_cached_total)."
)


_NOT_LEGACY = re.compile(r"[^a-zA-Z0-9_]|^[0-9]")


def _legacy_name(name: str) -> str:
    """``llamacpp:x`` -> ``llamacpp_server_x``, and every character but letters, digits and
    underscores made an underscore: colons are for recording rules, and /metrics relies on
    legacy names (exposition.negotiate)."""
    return _NOT_LEGACY.sub("_", name.replace("llamacpp:", SERVER_PREFIX, 1))


def rename_server_metrics(text: str) -> list[Metric]:
    """llama-server's ``llamacpp:name`` families -> ``llamacpp_server_name``.

    Colons are reserved for recording rules. A family declared counter whose sample does
    not end in ``_total`` (``n_tokens_max``, a high-water mark) is re-typed gauge. A family
    with more than MAX_SERVER_SERIES series is cut there (ValueError after the rest: counted).
    """
    out = []
    cut = []
    # the client parser appends _total to counter samples that lack it: note the real names
    raw_names = {ln.split("{", 1)[0].split(" ", 1)[0] for ln in text.splitlines() if ln and ln[0] != "#"}
    cached_counted_apart = "llamacpp:prompt_tokens_cached_total" in raw_names
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("llamacpp:"):
            continue  # only llama-server's own families: anything else could clash with ours
        name = _legacy_name(fam.name)
        typ = fam.type
        samples = [
            Sample(_legacy_name(s.name), {_legacy_name(k): v for k, v in s.labels.items()}, s.value)
            for s in fam.samples
        ]
        if typ == "counter" and fam.name in raw_names:
            typ = "gauge"
            samples = [Sample(name, s.labels, s.value) for s in samples]
        if typ not in ("counter", "gauge"):
            typ = "untyped"
        if len(samples) > MAX_SERVER_SERIES:
            cut.append(f"{name} ({len(samples)} series)")
            samples = samples[:MAX_SERVER_SERIES]
        doc = fam.documentation or name
        short = name.removeprefix(SERVER_PREFIX)
        if short in _RESET_BY_POLL:
            doc += _RESET_HELP
        elif short == "prompt_tokens":
            doc = _PROMPT_HELP_NEW if cached_counted_apart else _PROMPT_HELP_OLD
        m = Metric(name, doc, typ)
        m.samples = samples
        out.append(m)
    if cut:
        raise TooManySeries(out, cut)
    return out


class TooManySeries(ValueError):
    """Families cut at MAX_SERVER_SERIES; ``families`` holds what is re-exported."""

    def __init__(self, families: list[Metric], cut: list[str]) -> None:
        super().__init__(f"more than {MAX_SERVER_SERIES} series in: {', '.join(cut)[:300]}")
        self.families = families


# ---------------------------------------------------------------- the poller
ENDPOINTS = ("health", "metrics", "slots", "lora-adapters", "models")


class PollerMetrics:
    """What the poller saw of each endpoint: up, errors, durations; the /health and /slots state."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry
        # endpoint -> 1/0 of its last request; a request still waiting past its deadline is 0
        self.last_up: dict[str, float] = {}
        self.in_flight: dict[str, float] = {}  # endpoint -> monotonic start of the request now waiting
        self.verdict_seconds = 2.0  # set by the poller: its timeout
        if r is not None:
            r.register(_UpCollector(self))
        self.scrape_errors = Counter(
            "llamacpp_exporter_scrape_errors", "Failed requests to llama-server endpoints.", ["endpoint"], registry=r
        )
        self.answers_oversized = Counter(
            "llamacpp_exporter_answers_oversized",
            "Answers of llama-server endpoints dropped because they exceeded the exporter's size cap.",
            ["endpoint"],
            registry=r,
        )
        self.last_success = Gauge(
            "llamacpp_exporter_last_success_timestamp_seconds",
            "Unix time of the last successful request to each llama-server endpoint.",
            ["endpoint"],
            registry=r,
        )
        self.scrape_duration = Gauge(
            "llamacpp_exporter_scrape_duration_seconds",
            "Duration of the last request to each llama-server endpoint.",
            ["endpoint"],
            registry=r,
        )
        self.loading = Gauge(
            "llamacpp_loading",
            "1 while llama-server's /health answers 503 (it is loading the model): not down, not ready.",
            registry=r,
        )
        self.slots_processing = Gauge(
            "llamacpp_slots_processing",
            "Slots processing a task at the last /slots poll (NaN when /slots is not polled or did not answer).",
            registry=r,
        )
        self.kv_usage = Gauge(
            "llamacpp_slots_context_usage_ratio",
            "Tokens the slots hold (prompt + generated of each slot's last task, as /slots shows them) over their "
            "context size, at the last /slots poll (NaN when /slots is not polled or did not answer).",
            registry=r,
        )
        self.slots_processing.set(float("nan"))
        self.kv_usage.set(float("nan"))
        for e in ENDPOINTS:
            self.scrape_errors.labels(e)


class _UpCollector(Collector):
    """``llamacpp_up`` at scrape time: an endpoint whose request has been waiting longer than
    the poller's timeout is down now, not when the request finally ends (a server that answers
    a byte a second, or a task that holds /slots for a minute)."""

    def __init__(self, m: PollerMetrics) -> None:
        self.m = m

    def describe(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("llamacpp_up", _UP_HELP, labels=["endpoint"])

    def collect(self) -> Iterable[Metric]:
        m = self.m
        f = GaugeMetricFamily("llamacpp_up", _UP_HELP, labels=["endpoint"])
        now = time.monotonic()
        started = dict(m.in_flight)
        for endpoint in sorted(set(m.last_up) | set(started)):
            overdue = endpoint in started and now - started[endpoint] > m.verdict_seconds
            if overdue:
                f.add_metric([endpoint], 0.0)
            elif endpoint in m.last_up:
                f.add_metric([endpoint], m.last_up[endpoint])
        yield f


_UP_HELP = (
    "Whether the last request to this llama-server endpoint succeeded within the timeout (0 while one "
    "has waited longer)."
)


# llama-server's default port: 8080 up to b11434, 9931 from b11549 on (common/common.h)
DEFAULT_PORTS: Final = (8080, 9931)


def polled_url(listening: str) -> str | None:
    """The URL to poll for a server whose log says ``listening on <url>``: an address bound to
    every interface (0.0.0.0, ::) is reached on loopback. None for what is not an HTTP URL."""
    try:
        parts = urlsplit(listening)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(parts.hostname, parts.hostname)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{port}"


class ServerAddress:
    """Where llama-server is polled, and why. --llama.url when given. Else the address of the
    log's ``listening on`` line once it has been read (a restart on another port included);
    until then llama-server's default ports on loopback, 8080 and then 9931, each tried in turn
    until one answers. Read by the poller threads, set by them and by the pipeline thread: the
    pair (url, reason) is replaced whole."""

    def __init__(self, configured: str | None) -> None:
        self.configured = configured.rstrip("/") if configured else None
        self._candidates = [f"http://127.0.0.1:{port}" for port in DEFAULT_PORTS]
        self._probing = self.configured is None
        self._warned_log: str | None = None
        if self.configured is not None:
            self._now = (self.configured, "given by --llama.url")
        else:
            self._now = (self._candidates[0], self._trying())

    def _trying(self) -> str:
        return (
            "no --llama.url given and no 'listening on' line read from the log yet: trying llama-server's "
            "default ports, 8080 and 9931 (its default from b11549 on), until one answers"
        )

    @property
    def url(self) -> str:
        return self._now[0]

    def describe(self) -> str:
        url, reason = self._now
        return f"{redact(url)} ({reason})"

    def from_log(self, listening: str) -> None:
        """The log's ``listening on`` line of the server (not of a router's child)."""
        url = polled_url(listening)
        if url is None:
            return
        if self.configured is not None:
            configured_port = urlsplit(self.configured).port or (443 if self.configured.startswith("https") else 80)
            if urlsplit(url).port != configured_port and self._warned_log != url:
                self._warned_log = url
                log.warning(
                    "the log says llama-server listens on %s, but --llama.url is %s: check --llama.url "
                    "(llama-server's default port is 9931 from b11549 on, 8080 before)",
                    listening,
                    redact(self.configured),
                )
            return
        self._probing = False
        if url != self._now[0] or not self._now[1].startswith("from the log"):
            self._now = (url, f"from the log's 'listening on {listening}' line")
            log.info("polling llama-server at %s", self.describe())

    def unreachable(self, url: str) -> None:
        """Nothing listens at ``url`` (the connection was refused or timed out)."""
        if self._probing and url == self._now[0]:
            i = self._candidates.index(url) if url in self._candidates else -1
            self._now = (self._candidates[(i + 1) % len(self._candidates)], self._trying())

    def answered(self, url: str) -> None:
        """llama-server (or something) answered at ``url``."""
        if self._probing and url == self._now[0]:
            self._probing = False
            port = urlsplit(url).port
            self._now = (url, f"no --llama.url given: it answered on llama-server's default port {port}")
            log.info("polling llama-server at %s", self.describe())


class ServerPoller:
    """Background poller of llama-server. Thread-safe; results are delivered through
    ``on_snapshot`` / ``on_adapters`` and kept for the scrape-time collector."""

    def __init__(
        self,
        address: ServerAddress | str,
        *,
        api_key: str | None,
        timeout: float,
        interval: float,
        poll_slots: bool,
        poll_metrics: bool,
        registry: CollectorRegistry | None,
        on_snapshot: Callable[[SlotsSnapshot], None],
        on_adapters: Callable[[LoraAdapters], None],
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.address = address if isinstance(address, ServerAddress) else ServerAddress(address)
        self.client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 1.0)),
            transport=transport,
        )
        self.interval = interval
        self.poll_slots = poll_slots
        self.poll_metrics = poll_metrics
        self.metrics = PollerMetrics(registry)
        self.metrics.verdict_seconds = timeout
        self.on_snapshot = on_snapshot
        self.on_adapters = on_adapters
        self.connect_timeout = min(timeout, 1.0)
        self.timeout = timeout
        self._next_adapters = 0.0  # /lora-adapters from then on (tests turn it off)
        self._wake = threading.Event()
        self._until_prefill = False  # a woken poll should also wait for prefills to start
        self._lock = threading.Lock()
        self.server_families: list[Metric] = []
        self._logged_down: dict[str, str] = {}
        self._slots_disabled = False
        # a router (llama-server --models-preset/--models-dir): the models loaded at the last
        # /models poll; its /slots, /metrics and /lora-adapters are per model. None: a plain server
        self.models: list[str] | None = None
        self.metrics_on_own_thread = False  # run_metrics polls /metrics (the exporter's threads)
        self._woken_models: set[str] = set()

    def request_slots_poll(self, until_prefill_started: bool = False, model: str = "") -> None:
        """Poll /slots now. One poll gives a task's LoRA; only where the log lacks the reused
        tokens (below -lv 4) is it worth polling again until the task's prefill has begun.
        A router's child names its model: only that model's /slots is polled."""
        if until_prefill_started:
            self._until_prefill = True
        with self._lock:
            self._woken_models.add(model)
        self._wake.set()

    def _path(self, path: str, model: str) -> str | tuple[str, dict[str, str]]:
        # autoload=false: a poll must never make the router load a model
        return path if not model else (path, {"model": model, "autoload": "false"})

    def _discover_router(self) -> None:
        """A plain server answers /slots and /metrics without a model; a router answers 400 and
        lists its models (with their status) at /models."""
        r = self._get("models", "/models")
        if r is None:
            return
        try:
            models = loaded_models(r.json())
        except (ValueError, RecursionError):
            models = None
        if models is not None and self.models is None:
            log.info("llama-server is a router: polling /slots and /metrics of each loaded model")
        self.models = models

    def _get(self, endpoint: str, path: str | tuple[str, dict[str, str]]) -> _Answer | None:
        t0 = time.monotonic()
        # /health must answer at once; the others may queue behind tasks inside llama-server,
        # which costs nothing off the scrape path, but never longer than the deadline in total:
        # a server that answers a byte a second does not keep a stale value alive
        deadline = self.timeout if endpoint == "health" else QUEUED_READ_TIMEOUT
        timeout = httpx.Timeout(deadline, connect=self.connect_timeout)
        cap = MAX_ANSWER_BYTES.get(endpoint, 1 << 20)
        r: _Answer | None = None
        self.metrics.in_flight[endpoint] = t0
        url, params = (path, None) if isinstance(path, str) else path
        base = self.address.url
        try:
            with self.client.stream("GET", base + url, params=params, timeout=timeout) as resp:
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > cap:
                        self.metrics.answers_oversized.labels(endpoint).inc()
                        raise _Refused(f"answer larger than {cap} bytes")
                    if time.monotonic() - t0 > deadline:
                        raise _Refused(f"answer took longer than {deadline:g} s")
                r = _Answer(resp.status_code, bytes(body))
            ok = r.status_code == 200
            err = None if ok else f"HTTP {r.status_code}"
        except _Refused as e:
            r, ok, err = None, False, str(e)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            r, ok, err = None, False, type(e).__name__
            self.address.unreachable(base)
        except httpx.HTTPError as e:
            r, ok, err = None, False, type(e).__name__
        if endpoint == "health" and r is not None:
            # llama-server answers /health: 200, 503 while loading, 401 without its API key
            if r.status_code in (200, 401, 503):
                self.address.answered(base)
            else:
                self.address.unreachable(base)
        if ok:
            self.metrics.last_success.labels(endpoint).set(time.time())
        self.metrics.scrape_duration.labels(endpoint).set(time.monotonic() - t0)
        self.metrics.last_up[endpoint] = 1.0 if ok else 0.0
        self.metrics.in_flight.pop(endpoint, None)
        if endpoint == "health":
            # llama-server answers 503 on every path until the model is loaded
            self.metrics.loading.set(1 if r is not None and r.status_code == 503 else 0)
        if not ok:
            self.metrics.scrape_errors.labels(endpoint).inc()
            if self._logged_down.get(endpoint) != err:
                self._logged_down[endpoint] = err or ""
                hint = ""
                if r is not None and r.status_code == 401:
                    hint = " (llama-server wants an API key: set --llama.api-key-file or LLAMA_API_KEY)"
                elif r is not None and r.status_code == 501 and endpoint == "metrics":
                    hint = " (start llama-server with --metrics)"
                elif r is not None and r.status_code == 503:
                    hint = " (loading the model)"
                elif r is not None and r.status_code == 501 and endpoint == "slots":
                    hint = " (llama-server runs with --no-slots: LoRA state and -lv 3 reuse are unavailable)"
                elif r is not None and r.status_code == 400 and self.models is None and endpoint != "models":
                    hint = " (a router? asking /models)"
                log.warning("llama-server %s%s: %s%s", redact(base), url, err, hint)
            if r is not None and r.status_code == 400 and self.models is None and endpoint != "models":
                self._discover_router()
            return None
        if endpoint in self._logged_down:
            del self._logged_down[endpoint]
            log.info("llama-server %s%s answers again", redact(base), url)
        return r

    def _targets(self) -> list[str]:
        """ "" for a plain server, else the router's loaded models."""
        return [""] if self.models is None else self.models

    def poll_slots_once(self, models: Iterable[str] | None = None) -> SlotsSnapshot | None:
        """/slots of a plain server, or of each (given) model a router has loaded. Returns the
        last snapshot taken (None when one failed)."""
        last: SlotsSnapshot | None = None
        processing, usage = 0, []
        targets = self._targets() if models is None else [m for m in models if m in self._targets()]
        for model in targets:
            snap = self._poll_slots(model)
            if snap is None:
                self.metrics.slots_processing.set(float("nan"))
                self.metrics.kv_usage.set(float("nan"))
                return None
            processing += sum(1 for s in snap.slots if s.is_processing)
            usage.append(context_usage(snap))
            last = snap
        if last is not None:
            self.metrics.slots_processing.set(processing)
            self.metrics.kv_usage.set(max(usage))
        return last

    def _poll_slots(self, model: str) -> SlotsSnapshot | None:
        r = self._get("slots", self._path("/slots", model))
        snap = None
        if r is not None:
            try:
                snap = parse_slots(slots_json(r.content), model)
            except (ValueError, RecursionError) as e:
                self.metrics.scrape_errors.labels("slots").inc()
                log.warning("unexpected /slots answer: %s", e)
        if snap is None:
            # an empty snapshot still tells the assembler a poll happened, so records that
            # wait for their task's LoRA are emitted (as unknown) instead of held back
            self.on_snapshot(SlotsSnapshot((), model))
            return None
        self.on_snapshot(snap)
        return snap

    def poll_metrics_once(self) -> None:
        per_model: list[list[Metric]] = []
        for model in self._targets():
            r = self._get("metrics", self._path("/metrics", model))
            if r is None:
                continue
            try:
                try:
                    fams = rename_server_metrics(r.text)
                except TooManySeries as e:  # what is within the cap is re-exported; counted
                    fams = e.families
                    self.metrics.scrape_errors.labels("metrics").inc()
                    if self._logged_down.get("metrics-series") != str(e):
                        self._logged_down["metrics-series"] = str(e)
                        log.warning("llama-server /metrics: %s; cut there", e)
                per_model.append(with_model_label(fams, model) if model else fams)
            except Exception as e:  # malformed exposition: keep going without it
                self.metrics.scrape_errors.labels("metrics").inc()
                log.warning("cannot parse llama-server /metrics: %s", e)
        with self._lock:
            self.server_families = merge_families(per_model)

    def poll_health_once(self) -> None:
        self._get("health", "/health")

    def run_health(self, stop: threading.Event) -> None:
        """/health on its own thread: a slow /slots or /metrics never delays it."""
        self._run_alone(stop, "health", self.poll_health_once)

    def run_metrics(self, stop: threading.Event) -> None:
        """/metrics on its own thread: a slow /metrics never delays /slots (nor the reverse)."""
        self._run_alone(stop, "metrics", self.poll_metrics_once)

    def _run_alone(self, stop: threading.Event, endpoint: str, poll: Callable[[], None]) -> None:
        while not stop.is_set():
            try:
                poll()
            except Exception:  # counted; the next interval polls again
                log.exception("polling llama-server's /%s failed", endpoint)
                self.metrics.scrape_errors.labels(endpoint).inc()
            stop.wait(self.interval)

    def poll_all_once(self, include_health: bool = True, include_metrics: bool = True) -> None:
        if include_health:
            self.poll_health_once()
        if self.models is not None:
            self._discover_router()  # which models are loaded now
        if self.poll_metrics and include_metrics:
            self.poll_metrics_once()
        if time.monotonic() >= self._next_adapters:
            # at every full poll: a request without a lora list runs with the global scales in
            # force at its launch, known only between two polls that found them unchanged
            for model in self._targets():
                r = self._get("lora-adapters", self._path("/lora-adapters", model))
                if r is not None:
                    try:
                        self.on_adapters(parse_lora_adapters(r.json(), model))
                    except (ValueError, RecursionError):
                        self.metrics.scrape_errors.labels("lora-adapters").inc()
        if self.poll_slots:
            self.poll_slots_once()

    def run(self, stop: threading.Event) -> None:
        next_full = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_full:
                try:
                    self.poll_all_once(include_health=False, include_metrics=not self.metrics_on_own_thread)
                except Exception:  # a bug here must not stop polling and freeze every value
                    log.exception("polling llama-server failed")
                    self.metrics.scrape_errors.labels("health").inc()
                next_full = now + self.interval
            woken = self._wake.wait(timeout=max(0.0, min(next_full - time.monotonic(), self.interval)))
            if stop.is_set():
                break
            if woken:
                self._wake.clear()  # always: a wake left set would spin this loop
                until_prefill, self._until_prefill = self._until_prefill, False
                with self._lock:
                    models, self._woken_models = self._woken_models, set()
                if not self.poll_slots:
                    continue
                try:
                    if until_prefill:
                        self._poll_until_started(stop, models)
                    else:
                        self.poll_slots_once(None if self.models is None else models)
                except Exception:  # counted, and the next wake or full poll tries again
                    log.exception("polling llama-server's /slots failed")
                    self.metrics.scrape_errors.labels("slots").inc()

    def _poll_until_started(self, stop: threading.Event, models: set[str]) -> None:
        # A task's reused-token count is trustworthy once its prefill has begun; poll a few
        # times, briefly, until every busy slot is past that point.
        for _ in range(40):
            snap = self.poll_slots_once(None if self.models is None else models)
            if snap is None:
                return
            waiting = any(
                s.is_processing and not (s.n_prompt_tokens_processed or 0) and not (s.n_decoded or 0)
                for s in snap.slots
            )
            if not waiting or stop.wait(0.025):
                return

    def collect_server_families(self) -> Iterable[Metric]:
        with self._lock:
            return list(self.server_families)

    def close(self) -> None:
        self.client.close()
