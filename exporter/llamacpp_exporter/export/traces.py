"""A request record as a trace: the spans, their ids and their times, as plain values.

Pure: no OpenTelemetry import here (the SDK is an optional extra, export/otlp.py sends what
this makes). One trace per record: a server span from the request's arrival (its launch where
the log does not pin the arrival) to its release, with child spans for its queue, its prefill and
its decoding at the log's own times, span events for what the log told of it, and links from
the decoding to the prefills of other requests that overlapped it.

The ids come from the record's identity (model, slot, task, launch in server time): the same
request read again (an exporter restart, a replay, `analyze --otlp` of a log the live exporter
followed) gets the same trace and span ids, so a backend holds it once. A link names another
request's prefill span by that request's key, with no lookup.

Numbers and fixed words only, as everywhere: no text of a prompt or a completion can reach a
span, because a record holds none.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from ..records import RecordKey, RequestRecord, end_to_end_seconds, finish_reason, time_to_first_token

AttributeValue = str | int | float | bool
Attributes = dict[str, AttributeValue]

MAX_RUNS: Final = 64  # server runs whose offsets are kept
PROVIDER: Final = "llama.cpp"  # gen_ai.provider.name (gen_ai.system before it)
# the server's operation, in the GenAI conventions' words: the log does not tell a chat from a
# plain completion, so a sampled task is a text completion
OPERATION: Final = {"completion": "text_completion", "embedding": "embeddings"}


class RunOffsets:
    """Per server run (model, epoch): the Unix time of its log time 0, in microseconds. llama-server
    stamps its lines with the time since it started and a line is read at or after it was
    written, so the smallest (read time - log time) of the lines read live is the run's start,
    within the reader's lag. Written by the pipeline's thread, read by the sender's."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, int], int] = {}

    def saw(self, model: str, epoch: int, read_us: int, log_us: int) -> None:
        """A line of this run written at log_us was read at read_us (Unix time)."""
        key = (model, epoch)
        offset = read_us - log_us
        known = self._offsets.get(key)
        if known is None or offset < known:
            if known is None and len(self._offsets) >= MAX_RUNS:
                del self._offsets[next(iter(self._offsets))]
            self._offsets[key] = offset

    def offset(self, model: str, epoch: int) -> int | None:
        return self._offsets.get((model, epoch))


@dataclass(frozen=True, slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class SpanLink:
    trace_id: int
    span_id: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class Span:
    name: str
    trace_id: int
    span_id: int
    parent_id: int | None  # None: the trace's root (the server span)
    start_ns: int  # Unix time
    end_ns: int
    attributes: Attributes
    server: bool = False  # SpanKind.SERVER; the others are INTERNAL
    error: bool = False
    events: tuple[SpanEvent, ...] = ()
    links: tuple[SpanLink, ...] = ()


def _digest(key: RecordKey, part: str, size: int) -> int:
    text = f"{key.model}\0{key.slot}\0{key.task}\0{key.start_us}\0{part}"
    n = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=size).digest(), "big")
    return n or 1  # an all-zero id is invalid in OpenTelemetry


def trace_id(key: RecordKey) -> int:
    return _digest(key, "trace", 16)


def span_id(key: RecordKey, part: str) -> int:
    """part: request, queue, prefill or decode."""
    return _digest(key, part, 8)


def trace_id_hex(key: RecordKey) -> str:
    """As OpenTelemetry writes it (and Tempo and Jaeger look it up): 32 lower-case hex digits."""
    return f"{trace_id(key):032x}"


def _ns(offset_us: int, log_us: int) -> int:
    return (offset_us + log_us) * 1000


def _put(attrs: Attributes, name: str, value: AttributeValue | None) -> None:
    if value is not None:
        attrs[name] = value


# the server span's attributes taken as the record has them, where it has them (None: left out)
_FROM_RECORD: Final = (
    ("gen_ai.usage.input_tokens", "prompt_tokens"),
    ("gen_ai.usage.output_tokens", "generated_tokens"),
    ("gen_ai.latency.time_in_queue", "queue_seconds"),
    ("gen_ai.latency.time_in_model_prefill", "prefill_seconds"),
    ("gen_ai.latency.time_in_model_decode", "decode_seconds"),
    ("llamacpp.lora.config", "lora_config"),
    ("llamacpp.prompt.tokens", "prompt_tokens"),
    ("llamacpp.prompt.reused_tokens", "reused_tokens"),
    ("llamacpp.prompt.computed_tokens", "prefill_tokens"),
    ("llamacpp.prompt.wasted_tokens", "wasted_prompt_tokens"),
    ("llamacpp.cache.outcome", "outcome"),
    ("llamacpp.cache.miss_cause", "miss_cause"),
    ("llamacpp.cache.restore_result", "restore_result"),
    ("llamacpp.conversation", "conversation"),
    ("llamacpp.conversation.source", "conversation_source"),
    ("llamacpp.time_per_output_token", "time_per_output_token_seconds"),
    ("llamacpp.contention", "contention"),
    ("llamacpp.slowed_by_conversation", "slowed_by_conversation"),
    ("llamacpp.draft.acceptance", "draft_acceptance"),
)


def request_attributes(rec: RequestRecord) -> Attributes:
    """The server span's attributes: the GenAI conventions' names where they have one (those
    vLLM and SGLang set on theirs), the exporter's own under llamacpp.* (as its metrics name them)."""
    a: Attributes = {
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,
        "gen_ai.operation.name": OPERATION.get(rec.kind, rec.kind),
        "llamacpp.slot": rec.slot,
        "llamacpp.task": rec.task,
        "llamacpp.task.kind": rec.kind,
        "llamacpp.selection_path": rec.path,
        "llamacpp.lora": rec.lora,
        "llamacpp.finish_reason": finish_reason(rec),
    }
    if rec.model:
        a["gen_ai.request.model"] = rec.model
    if rec.choices > 1:
        a["gen_ai.request.choice.count"] = rec.choices
    for name, field in _FROM_RECORD:
        _put(a, name, getattr(rec, field))
    _put(a, "gen_ai.latency.time_to_first_token", time_to_first_token(rec))
    _put(a, "gen_ai.latency.e2e", end_to_end_seconds(rec))
    if rec.overlap_seconds:
        a["llamacpp.overlap_seconds"] = rec.overlap_seconds
    return a


def _selection_event(rec: RequestRecord, at_ns: int) -> SpanEvent:
    a: Attributes = {"llamacpp.selection_path": rec.path, "llamacpp.ram.consulted": rec.ram_consulted}
    if rec.ram_consulted:
        a["llamacpp.ram.candidates"] = rec.ram_candidates
        _put(a, "llamacpp.ram.best_similarity", rec.ram_best_f_sim)
    _put(a, "llamacpp.slot.tokens_before", rec.slot_tokens_before)
    return SpanEvent("slot selected", at_ns, a)


def _restore_event(rec: RequestRecord, at_ns: int) -> SpanEvent:
    a: Attributes = {"llamacpp.lora_cache_cleared": rec.lora_cache_cleared}
    _put(a, "llamacpp.cache.restore_result", rec.restore_result)
    _put(a, "llamacpp.cache.restored_tokens", rec.restored_tokens)
    _put(a, "llamacpp.cache.restored_entry_lora_config", rec.restored_entry_lora_config)
    return SpanEvent("prompt cache restored", at_ns, a)


def spans_of(rec: RequestRecord, offset_us: int) -> list[Span]:
    """The trace of one record; offset_us is the Unix time (in microseconds) of its server run's
    log time 0. Empty for a record without a launch time (none from the log lacks one)."""
    if rec.start_us is None:
        return []
    key = rec.key
    tid = trace_id(key)
    root = span_id(key, "request")
    launch = rec.start_us
    arrival = launch - round(rec.queue_seconds * 1e6) if rec.queue_seconds is not None else launch
    end = rec.end_us if rec.end_us is not None else launch
    spans: list[Span] = []
    if rec.queue_seconds is not None:
        spans.append(
            Span("queue", tid, span_id(key, "queue"), root, _ns(offset_us, arrival), _ns(offset_us, launch), {})
        )
    decode_end = rec.decode_end_us
    prefill_end = end
    if decode_end is not None and rec.decode_seconds is not None:
        prefill_end = decode_end - round(rec.decode_seconds * 1e6)
        links = tuple(
            SpanLink(
                trace_id(other := RecordKey(rec.model, slot, task, start)),
                span_id(other, "prefill"),
                {"llamacpp.overlap_seconds": seconds},
            )
            for slot, task, start, seconds in rec.overlapped_prefills
        )
        decode: Attributes = {"gen_ai.usage.output_tokens": rec.generated_tokens or 0}
        _put(decode, "llamacpp.time_per_output_token", rec.time_per_output_token_seconds)
        if rec.overlap_seconds:
            decode["llamacpp.overlap_seconds"] = rec.overlap_seconds
        _put(decode, "llamacpp.overlapping_prefill_tokens", rec.overlapping_prefill_tokens)
        events: tuple[SpanEvent, ...] = ()
        if rec.context_shifts:
            # the log's time of each shift is not kept: one event at the decoding's end
            events = (
                SpanEvent(
                    "context shift",
                    _ns(offset_us, decode_end),
                    {
                        "llamacpp.context_shifts": rec.context_shifts,
                        "llamacpp.context_shift.discarded_tokens": rec.context_shift_discarded_tokens,
                    },
                ),
            )
        spans.append(
            Span(
                "decode",
                tid,
                span_id(key, "decode"),
                root,
                _ns(offset_us, prefill_end),
                _ns(offset_us, decode_end),
                decode,
                events=events,
                links=links,
            )
        )
    if rec.prefill_seconds is not None and (decode_end is not None or rec.kind == "embedding"):
        prefill: Attributes = {}
        _put(prefill, "llamacpp.prompt.computed_tokens", rec.prefill_tokens)
        _put(prefill, "llamacpp.prompt.reused_tokens", rec.reused_tokens)
        start = prefill_end - round(rec.prefill_seconds * 1e6)
        spans.append(
            Span(
                "prefill",
                tid,
                span_id(key, "prefill"),
                root,
                _ns(offset_us, start),
                _ns(offset_us, prefill_end),
                prefill,
            )
        )
    request_events = [_selection_event(rec, _ns(offset_us, launch))]
    if rec.ram_restored:
        request_events.append(_restore_event(rec, _ns(offset_us, launch)))
    name = OPERATION.get(rec.kind, rec.kind) + (f" {rec.model}" if rec.model else "")
    spans.insert(
        0,
        Span(
            name,
            tid,
            root,
            None,
            _ns(offset_us, arrival),
            _ns(offset_us, max(end, arrival)),
            request_attributes(rec),
            server=True,
            error=rec.failed,
            events=tuple(request_events),
        ),
    )
    return spans
