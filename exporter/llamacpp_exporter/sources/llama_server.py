"""The poller of llama-server's HTTP endpoints: /health, /slots, /metrics, /lora-adapters (and a
router's /models), with what it saw of each as metrics and what the operator should do in the
exporter's log.

The poller, not the scrape, talks to llama-server, with short timeouts: a slow or dead server
never blocks a scrape of the exporter. /slots is polled when the log shows a new task (to
capture each task's ``params.lora`` and reused tokens while it runs) and periodically. Beside
it: one GET under a size cap and a deadline (http_get.py), where to poll (server_address.py),
and what the answers say (server_answers.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import redact
from ..records import LoraAdapters, SlotsSnapshot
from .http_get import Answer, Fetched, fetch
from .server_address import ServerAddress
from .server_answers import (
    TooManySeries,
    context_usage,
    loaded_models,
    merge_families,
    parse_lora_adapters,
    parse_slots,
    rename_server_metrics,
    slots_json,
    with_model_label,
)

log = logging.getLogger(__name__)

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

    def answered(self, endpoint: str, got: Fetched, seconds: float) -> None:
        """A request to the endpoint ended after ``seconds``: how."""
        ok = got.error is None
        if got.oversized:
            self.answers_oversized.labels(endpoint).inc()
        if ok:
            self.last_success.labels(endpoint).set(time.time())
        self.scrape_duration.labels(endpoint).set(seconds)
        self.last_up[endpoint] = 1.0 if ok else 0.0
        self.in_flight.pop(endpoint, None)
        if endpoint == "health":
            # llama-server answers 503 on every path until the model is loaded
            self.loading.set(1 if got.answer is not None and got.answer.status_code == 503 else 0)
        if not ok:
            self.scrape_errors.labels(endpoint).inc()


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


def down_hint(endpoint: str, status: int | None, router_unknown: bool) -> str:
    """What the operator should know of an endpoint's failure, told with it in the log."""
    if status == 401:
        return " (llama-server wants an API key: set --llama.api-key-file or LLAMA_API_KEY)"
    if status == 501 and endpoint == "metrics":
        return " (start llama-server with --metrics)"
    if status == 503:
        return " (loading the model)"
    if status == 501 and endpoint == "slots":
        return " (llama-server runs with --no-slots: LoRA state and -lv 3 reuse are unavailable)"
    if status == 400 and router_unknown:
        return " (a router? asking /models)"
    return ""


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

    def _get(self, endpoint: str, path: str | tuple[str, dict[str, str]]) -> Answer | None:
        """The endpoint's answer, None when it failed (counted, and told once in the log)."""
        t0 = time.monotonic()
        # /health must answer at once; the others may queue behind tasks inside llama-server,
        # which costs nothing off the scrape path, but never longer than the deadline in total:
        # a server that answers a byte a second does not keep a stale value alive
        deadline = self.timeout if endpoint == "health" else QUEUED_READ_TIMEOUT
        url, params = (path, None) if isinstance(path, str) else path
        base = self.address.url
        self.metrics.in_flight[endpoint] = t0
        got = fetch(
            self.client, base + url, params, deadline, self.connect_timeout, MAX_ANSWER_BYTES.get(endpoint, 1 << 20)
        )
        status = got.answer.status_code if got.answer is not None else None
        if got.unreachable:
            self.address.unreachable(base)
        elif endpoint == "health" and status is not None:
            # llama-server answers /health: 200, 503 while loading, 401 without its API key
            if status in (200, 401, 503):
                self.address.answered(base)
            else:
                self.address.unreachable(base)
        self.metrics.answered(endpoint, got, time.monotonic() - t0)
        router_unknown = self.models is None and endpoint != "models"
        if got.error is None:
            if endpoint in self._logged_down:
                del self._logged_down[endpoint]
                log.info("llama-server %s%s answers again", redact(base), url)
            return got.answer
        if self._logged_down.get(endpoint) != got.error:
            self._logged_down[endpoint] = got.error
            hint = down_hint(endpoint, status, router_unknown)
            log.warning("llama-server %s%s: %s%s", redact(base), url, got.error, hint)
        if status == 400 and router_unknown:
            self._discover_router()
        return None

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
