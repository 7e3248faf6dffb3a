"""A router's log demultiplexed (llama-server --models-preset / --models-dir): its children's
lines to one assembler per child, its own lines to its figures (export/router.py).

The router forwards each child's log lines prefixed with ``[port] ``; ``spawning server
instance with name=M on port P`` says which model the child on P serves
(server-models.cpp, server_models::load). A model name becomes a label value only from a spawn
line or the router's list of available models, checked against a bounded character set and
capped in number: the names are the operator's presets and model files, never a client's text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Final

from . import parse
from .assemble.assembler import Assembler
from .export.metrics import LogMetrics, RequestMetrics
from .export.router import RouterMetrics

log = logging.getLogger(__name__)

MAX_MODELS: Final = 64  # label values; models past this are "other"
UNKNOWN: Final = "unknown"  # a child whose spawn line the exporter never read
OTHER: Final = "other"
_LABEL_SAFE: Final = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}")


class ChildNames:
    """Port -> model, from the spawn lines, and the bounded set of model label values."""

    def __init__(self) -> None:
        self._by_port: dict[int, str] = {}
        self.known: set[str] = set()

    def label(self, name: str) -> str:
        """The label value for a model the router named: only a model it spawned."""
        return name if name in self.known else OTHER

    def available(self, name: str) -> None:
        if name not in self.known and len(self.known) < MAX_MODELS and _LABEL_SAFE.fullmatch(name):
            self.known.add(name)

    def spawned(self, name: str, port: int) -> str:
        self.available(name)
        model = self.label(name)
        self._by_port[port] = model
        return model

    def of_port(self, port: int) -> str:
        return self._by_port.get(port, UNKNOWN)

    def ports_of(self, name: str) -> list[int]:
        model = self.label(name)
        return [p for p, m in self._by_port.items() if m == model]

    def gone(self, port: int) -> None:
        self._by_port.pop(port, None)


class RouterDemux:
    """Which assembler a line goes to: a child's by its port, or the router's own figures."""

    def __init__(
        self,
        new_assembler: Callable[[str], Assembler],
        requests: RequestMetrics,
        metrics: LogMetrics,
        router: RouterMetrics,
    ) -> None:
        self.new_assembler = new_assembler  # for a model
        self.requests = requests
        self.metrics = metrics
        self.router = router
        self.children: dict[int, Assembler] = {}  # by the port its lines are prefixed with
        self.names = ChildNames()

    def child(self, port: int) -> Assembler:
        a = self.children.get(port)
        if a is None:
            model = self.names.of_port(port)
            self.requests.model_known(model)
            a = self.children[port] = self.new_assembler(model)
        return a

    def _child_gone(self, port: int) -> None:
        """The child process on this port ended (or its port now serves another model)."""
        a = self.children.pop(port, None)
        if a is not None:
            a.flush(True)
            if all(c.model != a.model for c in self.children.values()):
                self.metrics.forget_model(a.model)

    def router_line(self, ev: parse.Event) -> None:
        r, names = self.router, self.names
        if not r.mode:  # any of the router's own lines says it is one
            r.mode = True
            self.requests.forget_model("")  # the router serves no request under its own name
            self.metrics.forget_model("")
            log.info("llama-server runs in router mode: one pipeline per model instance")
        if isinstance(ev, parse.ModelAvailable):
            names.available(ev.name)
        elif isinstance(ev, parse.ChildSpawned):
            if ev.port in self.children:
                self._child_gone(ev.port)
            model = names.spawned(ev.name, ev.port)
            r.spawned(model)
        elif isinstance(ev, parse.ChildExited):
            model = names.label(ev.name)
            r.exited(model, ev.status)
            for port in names.ports_of(ev.name):
                self._child_gone(port)
                names.gone(port)
        elif isinstance(ev, parse.RequestProxied):
            r.proxied(names.label(ev.name))
        elif isinstance(ev, parse.ModelRequestQueued):
            r.queued(names.label(ev.name))
        elif isinstance(ev, parse.ModelRequestCancelled):
            r.cancelled_while_loading(names.label(ev.name))


ROUTER_EVENTS: Final = frozenset(
    {
        parse.RouterStarted,
        parse.ModelAvailable,
        parse.ChildSpawned,
        parse.ChildExited,
        parse.RequestProxied,
        parse.ModelRequestQueued,
        parse.ModelRequestCancelled,
    }
)
