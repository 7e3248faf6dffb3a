"""The per-request record and the snapshots the poller feeds into the assembler."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from types import UnionType
from typing import Any, Literal, NamedTuple, TypeGuard, Union, get_args, get_origin, get_type_hints

# The fixed words of a record, as types (mypy checks every assignment) and as tuples (the
# label values the metrics pre-create, the report's rows).
SelectionPath = Literal["slot", "ram", "pinned", "unknown"]
LoraState = Literal["none", "active", "unknown"]
RestoreResult = Literal[
    "kept",
    "discarded_lora_wrongful",
    "discarded_lora_correct",
    "discarded_lora_unknown",
    "reprocessed",
]
Outcome = Literal["hit", "partial", "miss"]
# what a task did: a completion (chat, /completion, infill) samples tokens; an embedding (or
# rerank) task only evaluates its prompt. Told apart by the TRACE line "sampler chain" (-lv 4).
TaskKind = Literal["completion", "embedding"]
MissCause = Literal["lora_discard", "forced_reprocess", "evicted", "no_cache_entry", "slot_prefix_mismatch", "unknown"]
Contention = Literal["prefill", "none"]
ReuseSource = Literal["log", "slots"]
JoinSource = Literal["header", "lineage", "uncertain"]
# how a request ended, as far as the log states it: stop (its timings, then its release: an end
# of sequence, a stop word or its token limit, which llama-server tells apart only at DEBUG),
# truncated (the context filled up: the release line's truncated = 1), cancelled (its client
# went away while it ran: a cancel line, no timings), failed (an error line for it, no timings),
# unknown (released without timings, and no cancel or error line for it: the log does not show
# how it ended; on the tested builds every ending has one of those lines, so a build that no
# longer logs its timings, or a log below -lv 3, and never the server's failure)
FinishReason = Literal["stop", "truncated", "cancelled", "failed", "unknown"]

PATHS: tuple[SelectionPath, ...] = get_args(SelectionPath)
LORA_STATES: tuple[LoraState, ...] = get_args(LoraState)
RESTORE_RESULTS: tuple[RestoreResult, ...] = get_args(RestoreResult)
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
TASK_KINDS: tuple[TaskKind, ...] = get_args(TaskKind)
MISS_CAUSES: tuple[MissCause, ...] = get_args(MissCause)
CONTENTION: tuple[Contention, ...] = get_args(Contention)
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)
MAX_SLOTS = 512  # far above any -np in use; each slot id is a label value

_SELECTION_PATH: dict[str, SelectionPath] = {"lcp": "slot", "lru": "ram", "id": "pinned"}


# Larger caches the capacity figures are given for, as multiples of the --cache-ram in force
LARGER_CACHE_FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)
MIB = 1048576.0  # the log's cache sizes are in MiB; records hold bytes


def evicted_miss(rec: RequestRecord) -> bool:
    """A miss of a conversation whose RAM-cache entry had been evicted before it came back."""
    return rec.outcome == "miss" and rec.miss_cause == "evicted"


def kept_by_larger_cache(rec: RequestRecord, factor: float) -> bool | None:
    """Would a --cache-ram `factor` times the one in force have kept the entry this evicted
    miss needed? None when the log cannot tell (no byte limit, the entry not followed)."""
    need, limit = rec.cache_size_needed_bytes, rec.cache_limit_bytes
    if need is None or not limit:
        return None
    return need <= factor * limit


def avoidable_prefill_seconds(rec: RequestRecord) -> float:
    """The prefill a restore of the evicted entry would have saved: the share of the prompt
    the entry held (it held the conversation up to its previous turn)."""
    if not rec.prefill_seconds or not rec.prompt_tokens or rec.evicted_entry_tokens is None:
        return 0.0
    return rec.prefill_seconds * min(1.0, rec.evicted_entry_tokens / rec.prompt_tokens)


def time_to_first_token(rec: RequestRecord) -> float | None:
    """From the request's arrival to its first token: its queue and its prefill. None where the
    log does not pin the arrival."""
    if rec.queue_seconds is None or rec.prefill_seconds is None:
        return None
    return rec.queue_seconds + rec.prefill_seconds


def end_to_end_seconds(rec: RequestRecord) -> float | None:
    """From the request's arrival to its release. None where the log does not pin the arrival."""
    if rec.queue_seconds is None or rec.start_us is None or rec.end_us is None:
        return None
    return rec.queue_seconds + (rec.end_us - rec.start_us) / 1e6


def finish_reason(rec: RequestRecord) -> FinishReason:
    if rec.generated_tokens is None and rec.kind == "completion":
        return "failed" if rec.failed else "cancelled" if rec.cancelled else "unknown"
    return "truncated" if rec.truncated else "stop"


def ended_unanswered(rec: RequestRecord) -> bool:
    """Cancelled or failed, as the log states it: no timings, and a cancel or error line."""
    return rec.generated_tokens is None and (rec.cancelled or rec.failed)


def selection_path(method: str | None) -> SelectionPath:
    return _SELECTION_PATH.get(method or "", "unknown")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Everything the exporter learned about one finished task. Numbers and fixed words only;
    frozen: the metrics, the events file and the callbacks all see the same record."""

    epoch: int
    slot: int
    task: int
    model: str = ""  # the router's name of the model (its child process); "" for a plain server
    kind: TaskKind = "completion"
    choices: int = 1  # n > 1: one record for the request, its children are its other choices
    path: SelectionPath = "unknown"
    lora: LoraState = "unknown"
    lora_config: str | None = None  # effective adapter scales, e.g. "0:0.5"; None when unknown
    prompt_tokens: int | None = None
    reused_tokens: int | None = None
    reuse_source: ReuseSource | None = None  # "log" (-lv 4) or "slots" (/slots while running)
    slot_tokens_before: int | None = None  # what the slot held when it was selected
    state_source_task: int | None = None  # the task whose state the prompt was compared with
    # (task, common prefix) of each RAM-cache entry the lookup compared the prompt with, where
    # the task that computed the entry is known
    compared_entries: tuple[tuple[int, int], ...] = ()
    ram_consulted: bool = False
    ram_candidates: int = 0
    ram_best_f_sim: float | None = None
    ram_restored: bool = False
    restored_tokens: int | None = None
    restored_entry_lora_config: str | None = None
    restore_result: RestoreResult | None = None
    lora_mismatch_reuse: bool = False
    lora_cache_cleared: bool = False
    forced_reprocess: bool = False
    outcome: Outcome | None = None
    miss_cause: MissCause | None = None
    # the conversation came back after its RAM-cache entry was evicted: the smallest --cache-ram
    # that would have kept the entry (llama-server evicts the oldest first; at least this much
    # when above 4x the limit), the limit in force, the entry's tokens and context checkpoints
    # (with checkpoints the size is a floor). None otherwise or when the log cannot tell (see
    # assemble/cachemirror.py)
    cache_size_needed_bytes: float | None = None
    cache_limit_bytes: float | None = None
    evicted_entry_tokens: int | None = None
    evicted_entry_checkpoints: int | None = None
    small_task_takeover: bool = False
    prefill_seconds: float | None = None
    prefill_tokens: int | None = None
    generated_tokens: int | None = None
    decode_seconds: float | None = None
    time_per_output_token_seconds: float | None = None
    overlap_seconds: float = 0.0
    contention: Contention | None = None
    # the largest prefill (prompt tokens computed) of another slot during its decoding: 0 for
    # none, None when unknown
    overlapping_prefill_tokens: int | None = None
    # (slot, task, start_us, seconds): the requests whose prefill overlapped its decoding, the
    # most first (at most 8), each named by its own record's key (its trace links to them)
    overlapped_prefills: tuple[tuple[int, int, int, float], ...] = ()
    conversation: str | None = None  # pseudonym: salted HMAC of the header id, or of a lineage root
    # "header" (its X-Conversation-Id), "lineage" (it sent none: cache lineage), "uncertain"
    # (the log cannot prove which request it was; conversation is None), None for child tasks
    conversation_source: JoinSource | None = None
    wasted_prompt_tokens: int | None = None  # offered by the slot or the RAM cache, computed again
    slowed_by_conversation: str | None = None  # whose prefill overlapped this decoding most
    cancelled: bool = False
    failed: bool = False
    truncated: bool = False  # the release line's truncated = 1: the context filled up
    # the context filled up and the server dropped part of the history after its first n_keep
    # tokens to go on (--context-shift): how many times, and the tokens dropped
    context_shifts: int = 0
    context_shift_discarded_tokens: int = 0
    # speculative decoding, where the build logs it at the task's end: the draft model's tokens
    # and those the target accepted, and their ratio. None: the log does not say (the task
    # drafted nothing, or the build does not log it), never 0
    draft_tokens_generated: int | None = None
    draft_tokens_accepted: int | None = None
    draft_acceptance: float | None = None
    # from its request's arrival (conv_id, -lv 4) to its launch, where the log pins the arrival
    # (see join.py): None when it cannot
    queue_seconds: float | None = None
    start_us: int | None = None
    end_us: int | None = None
    decode_end_us: int | None = None  # its timings line (the decoding's end), in server time

    def to_event(self) -> dict[str, Any]:
        """The events-file line."""
        return asdict(self)

    @property
    def key(self) -> RecordKey:
        return RecordKey(self.model, self.slot, self.task, self.start_us)


def _init_by_slots(cls: type) -> None:
    """Give a frozen slots dataclass an ``__init__`` that stores each field through its slot's
    own descriptor. The dataclass's frozen ``__init__`` calls ``object.__setattr__`` by name for
    every field: for the record's 57 fields that was 17 us of each record made (a tenth of the
    finisher's work on a busy log), the descriptors take 7. Same signature, same defaults, still
    frozen afterwards (tests/test_records.py holds it to the dataclass's own)."""
    params, body, scope = [], [], {}
    for f in fields(cls):
        assert f.default_factory is MISSING and f.init, f.name  # a plain default or none
        if f.default is MISSING:
            params.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        scope[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}) -> None:\n" + "\n".join(body), scope)  # noqa: S102 - our own field names
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[misc]


_init_by_slots(RequestRecord)


class RecordKey(NamedTuple):
    """A record's identity: the same task of the same server run (of the same model, behind a
    router) has the same slot, task id and start in server log time. Read and written by the
    pipeline (records not to write again), the events file and analyze."""

    model: str
    slot: int
    task: int
    start_us: int | None


@dataclass(frozen=True, slots=True)
class ConversationProof:
    """A conversation proven after its record went out (a later request of the conversation
    named it): the events file's proof line, which analyze applies to the record."""

    key: RecordKey
    epoch: int
    conversation: str
    source: JoinSource  # header or lineage: what the log proved

    def to_event(self) -> dict[str, Any]:
        """The events-file line."""
        return {
            "proof": "conversation",
            "model": self.key.model,
            "epoch": self.epoch,
            "slot": self.key.slot,
            "task": self.key.task,
            "start_us": self.key.start_us,
            "conversation": self.conversation,
            "conversation_source": self.source,
        }

    @staticmethod
    def from_event(obj: Any) -> ConversationProof | None:
        """A proof line read back; None for one that is not a whole, well-typed proof."""
        if not isinstance(obj, dict) or obj.get("proof") != "conversation":
            return None
        model, epoch = obj.get("model", ""), obj.get("epoch")
        slot, task, start_us = obj.get("slot"), obj.get("task"), obj.get("start_us")
        conversation, source = obj.get("conversation"), obj.get("conversation_source")
        if not (_is_int(slot) and _is_int(task) and _is_int(start_us) and _is_int(epoch)):
            return None
        if not isinstance(model, str) or not isinstance(conversation, str):
            return None
        if source == "header" or source == "lineage":
            return ConversationProof(RecordKey(model, slot, task, start_us), epoch, conversation, source)
        return None


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _accepts(tp: Any, v: Any) -> bool:
    """Whether an events-file value fits a record field's declared type. A fixed word set
    takes any string: a newer exporter's word is kept, not the line thrown away."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return isinstance(v, str)
    if origin in (Union, UnionType):
        return any(_accepts(a, v) for a in args)
    if tp is type(None):
        return v is None
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is str:
        return isinstance(v, str)
    if origin is tuple and isinstance(v, (list, tuple)):
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_accepts(args[0], x) for x in v)
        return len(v) == len(args) and all(_accepts(a, x) for a, x in zip(args, v, strict=True))
    return False


def _as_tuples(v: Any) -> Any:
    return tuple(_as_tuples(x) for x in v) if isinstance(v, list) else v


def record_from_event(obj: Any) -> RequestRecord | None:
    """An events-file line as a record: its known fields, each of the type the record declares
    (a field of another version is left out, a missing one takes its default; a wrong type
    rejects the line). The one reader of records written to disk (analyze, report)."""
    if not isinstance(obj, dict) or not {"epoch", "slot", "task"} <= obj.keys():
        return None
    known = {k: v for k, v in obj.items() if k in _RECORD_TYPES}
    if not all(_accepts(_RECORD_TYPES[k], v) for k, v in known.items()):
        return None
    return RequestRecord(**{k: _as_tuples(v) for k, v in known.items()})


@dataclass(frozen=True, slots=True)
class SlotState:
    """The numeric part of one element of ``/slots``. Nothing textual is kept."""

    id: int
    id_task: int | None
    is_processing: bool
    n_prompt_tokens: int | None
    n_prompt_tokens_processed: int | None
    n_prompt_tokens_cache: int | None
    n_decoded: int | None
    lora: tuple[tuple[int, float], ...] | None  # request's [{id, scale}], None if absent
    n_ctx: int | None = None


@dataclass(frozen=True, slots=True)
class SlotsSnapshot:
    slots: tuple[SlotState, ...]
    model: str = ""  # a router's: the model whose /slots this is


@dataclass(frozen=True, slots=True)
class LoraAdapters:
    """Global adapter scales from ``/lora-adapters``, by adapter id."""

    scales: tuple[tuple[int, float], ...]
    model: str = ""  # a router's: the model whose adapters these are


_RECORD_TYPES = get_type_hints(RequestRecord)
