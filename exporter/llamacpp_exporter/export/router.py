"""A router's own figures (llama-server --models-preset / --models-dir): model instances
started and ended, requests queued or cancelled while their model loads, requests proxied, by
model. Fed by the router demux (demux.py); nothing is exported until the log shows a router."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class RouterMetrics(Collector):
    """The router's own figures, by model; nothing until the log shows a router."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.mode = False
        self.loads: dict[str, float] = {}
        self.exits: dict[tuple[str, str], float] = {}
        self.queued_: dict[str, float] = {}
        self.cancelled: dict[str, float] = {}
        self.proxied_: dict[str, float] = {}
        self.running: dict[str, int] = {}
        registry.register(self)

    def _known(self, model: str) -> None:
        for d in (self.loads, self.queued_, self.cancelled, self.proxied_):
            d.setdefault(model, 0.0)
        for result in ("ok", "error"):
            self.exits.setdefault((model, result), 0.0)
        self.running.setdefault(model, 0)

    def spawned(self, model: str) -> None:
        self._known(model)
        self.loads[model] += 1
        self.running[model] += 1

    def exited(self, model: str, status: int) -> None:
        self._known(model)
        self.exits[(model, "ok" if status == 0 else "error")] += 1
        self.running[model] = max(0, self.running[model] - 1)

    def proxied(self, model: str) -> None:
        self._known(model)
        self.proxied_[model] += 1

    def queued(self, model: str) -> None:
        self._known(model)
        self.queued_[model] += 1

    def cancelled_while_loading(self, model: str) -> None:
        self._known(model)
        self.cancelled[model] += 1

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        if self.mode:
            yield from self._families()

    def _families(self) -> Iterator[Metric]:
        def counter(name: str, doc: str, values: dict[str, float]) -> CounterMetricFamily:
            f = CounterMetricFamily(name, doc, labels=["model"])
            for model, v in sorted(values.items()):
                f.add_metric([model], v)
            return f

        yield counter(
            "llamacpp_router_model_loads",
            "Model instances a llama-server router started (one child process each).",
            self.loads,
        )
        exits = CounterMetricFamily(
            "llamacpp_router_model_exits",
            "Model instances that ended, by result: ok (exit status 0: unloaded or stopped), error (crashed or "
            "killed).",
            labels=["model", "result"],
        )
        for (model, result), v in sorted(self.exits.items()):
            exits.add_metric([model, result], v)
        yield exits
        yield counter(
            "llamacpp_router_requests_queued",
            "Requests that waited for their model to load.",
            self.queued_,
        )
        yield counter(
            "llamacpp_router_requests_cancelled_while_loading",
            "Requests cancelled (by a stop) while their model was loading.",
            self.cancelled,
        )
        yield counter(
            "llamacpp_router_requests_proxied",
            "Requests the router passed to a model instance, the exporter's /slots and /metrics polls among them.",
            self.proxied_,
        )
        running = GaugeMetricFamily(
            "llamacpp_router_model_instances",
            "Instances of the model running, as the router's log says (started and not yet ended).",
            labels=["model"],
        )
        for model, n in sorted(self.running.items()):
            running.add_metric([model], n)
        yield running
