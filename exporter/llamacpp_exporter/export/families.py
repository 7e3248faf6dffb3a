"""Metric families as plain numbers by label values, rendered at scrape time: what the request
metrics (metrics.py) and every concern a record feeds (concerns.py) declare their series with."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from .exposition import Encoding, RenderedChildren


class CounterValues:
    """A counter family as plain numbers by label values, rendered at scrape time: an update
    costs a dict lookup, no lock and no label check (client_python's advice for exporters).
    Each child's exposition is kept and rendered again only when its value changed."""

    metric_family: type[CounterMetricFamily] | type[GaugeMetricFamily] = CounterMetricFamily

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str] = (), space: Sequence[Sequence[str]] | None = None
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, list(labelnames)
        # the values of the labels after the model, whose every combination exists from the
        # moment the model is known (None: children made by what happens, slots say)
        self.space = space
        self.values: dict[tuple[str, ...], float] = {}
        self.rendered = RenderedChildren(self._family)

    def known(self, model: str) -> None:
        if self.space is not None:
            for rest in itertools.product(*self.space):
                self.add((model, *rest), 0.0)

    def add(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self.values[key] = self.values.get(key, 0.0) + amount

    def forget(self, model: str) -> None:
        """The model's series go (it is served no more)."""
        for key in [k for k in self.values if k[0] == model]:
            del self.values[key]

    def _family(self, children: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
        f = self.metric_family(self.name, self.doc, labels=self.labelnames)
        for key, value in children:
            f.add_metric(key, value)
        return f

    def family(self) -> Metric:
        return self._family(list(self.values.items()))

    def render(self, encoding: Encoding) -> list[bytes]:
        # the value is its own version: an unchanged child is not rendered again
        return self.rendered.render(encoding, [(key, value, value) for key, value in list(self.values.items())])


class GaugeValues(CounterValues):
    """A gauge family as plain numbers (set by assignment to ``values``)."""

    metric_family = GaugeMetricFamily


# an exemplar as (labels, value, time): made an Exemplar (a NamedTuple, built in the
# interpreter) only when its child is rendered, not at every observation
ExemplarParts = tuple[dict[str, str], float, float]
HistogramChild = tuple[list[float], list[ExemplarParts | None], list[float]]


class HistogramValues:
    """A histogram family as plain numbers: per label values, the count in each bucket (not
    cumulative), the sum and the number of observations, and the last exemplar of each bucket.
    Rendered as prometheus_client's Histogram renders it, each child again only after an
    observation."""

    metric_family = HistogramMetricFamily

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], buckets: Sequence[float], space: Sequence[Sequence[str]]
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, list(labelnames)
        self.space = space  # as CounterValues'
        self.bounds = [float(b) for b in buckets] + [math.inf]
        self.le = [floatToGoString(b) for b in self.bounds]
        self.children: dict[tuple[str, ...], HistogramChild] = {}
        self.rendered = RenderedChildren(self._family)

    def known(self, model: str) -> None:
        for rest in itertools.product(*self.space):
            self.child((model, *rest))

    def child(self, key: tuple[str, ...]) -> HistogramChild:
        c = self.children.get(key)
        if c is None:
            c = self.children[key] = ([0.0] * len(self.bounds), [None] * len(self.bounds), [0.0, 0.0])
        return c

    def forget(self, model: str) -> None:
        """The model's series go (it is served no more)."""
        for key in [k for k in self.children if k[0] == model]:
            del self.children[key]

    def observe(self, key: tuple[str, ...], value: float, exemplar: dict[str, str] | None) -> None:
        counts, exemplars, total = self.child(key)
        total[0] += value
        total[1] += 1  # observations, NaN included: the child's version
        if value <= math.inf:  # not NaN: the first bucket whose bound is >= the value
            i = _first_at_least(self.bounds, value)
            counts[i] += 1
            if exemplar is not None:
                exemplars[i] = (exemplar, value, time.time())

    def _family(self, children: Iterable[tuple[tuple[str, ...], HistogramChild]]) -> Metric:
        f = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, (counts, exemplars, total) in children:
            acc = 0.0
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            for le, n, ex in zip(self.le, counts, exemplars, strict=True):
                acc += n
                buckets.append((le, acc) if ex is None else (le, acc, Exemplar(*ex)))
            f.add_metric(key, buckets, total[0])
        return f

    def family(self) -> Metric:
        return self._family(list(self.children.items()))

    def render(self, encoding: Encoding) -> list[bytes]:
        return self.rendered.render(encoding, [(key, child[2][1], child) for key, child in list(self.children.items())])


def _first_at_least(bounds: list[float], value: float) -> int:
    """bisect.bisect_left(bounds, value), written out: compiled, native float comparisons
    instead of a module call comparing boxed floats (tests/test_exposition.py holds it to it)."""
    lo, hi = 0, len(bounds)
    while lo < hi:
        mid = (lo + hi) // 2
        if bounds[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


class FamiliesCollector(Collector):
    """Plain-number families, rendered in the order given."""

    def __init__(self, families: list[CounterValues | HistogramValues]) -> None:
        self.families = families

    def describe(self) -> Iterator[Metric]:
        # the names, so that registration checks them and ?name[]= finds them
        for f in self.families:
            yield f.metric_family(f.name, f.doc, labels=f.labelnames)

    def collect(self) -> Iterator[Metric]:
        for f in self.families:
            yield f.family()

    def render_exposition(self, encoding: Encoding) -> list[bytes]:
        return [part for f in self.families for part in f.render(encoding)]
