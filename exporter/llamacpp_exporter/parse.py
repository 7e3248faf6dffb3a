"""Pure parser: one llama-server log line in, one typed event out.

No I/O, no clock, no metrics. Formats handled: the default text lines
(``M.SS.mmm.uuu L tag func: msg``), lines with prefix or timestamps switched off,
ANSI colours, the router's ``[ 8081] `` prefix and ``--log-jsonl`` records.

Privacy: no event carries free text from the server. Every field is a number,
a flag or a fixed word, so prompt text that a DEBUG line may carry cannot
travel further than this module. The one exception is the client's
X-Conversation-Id header (ConversationArrived.raw_id), which the assembler
pseudonymises with a salt on receipt and never stores.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, ClassVar, Final, Union

if TYPE_CHECKING:  # compiled, a native 64-bit integer; in the interpreter only an annotation
    from mypy_extensions import i64

# llama.cpp builds whose recorded logs the parser is tested on: tests/fixtures/logs/builds/
# (tests/test_builds.py). Another build is read too, and warned about once.
TESTED_BUILDS: Final = (10950, 11200, 11434, 11549)

# ---------------------------------------------------------------- events
# Each event is a small slotted class, read-only by convention: not frozen, because freezing
# costs about 1 us a build and two objects are built for most lines (the event and its
# envelope). ``ts_us`` (on the envelope) is the server's own relative timestamp in
# microseconds, or None when timestamps are off.


class _EventBase:
    """What each event has of a dataclass: equality and repr by its fields. Events are plain
    classes, not dataclasses: one is built for most lines, and compiled (mypyc) a plain class
    is built in native code, a dataclass through the interpreter."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, f) == getattr(other, f) for f in self._fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self, f)!r}' for f in self._fields)})"


class ServerStarting(_EventBase):
    """``llama_server: initializing ...``: a new process, so a new epoch."""

    __slots__ = ()


class Verbosity(_EventBase):
    _fields = ("level",)
    __slots__ = _fields

    def __init__(self, level: int) -> None:
        self.level = level


class ServerBuild(_EventBase):
    """``build N (commit)`` at start: 0 and "unknown" when built without git metadata."""

    _fields = ("number", "commit")
    __slots__ = _fields

    def __init__(self, number: int, commit: str) -> None:
        self.number = number
        self.commit = commit


class ServerListening(_EventBase):
    """``llama_server: listening on http://HOST:PORT``: where the server answers."""

    _fields = ("url",)
    __slots__ = _fields

    def __init__(self, url: str) -> None:
        self.url = url


class SlotsInitialized(_EventBase):
    _fields = ("n_slots", "n_ctx_slot")
    __slots__ = _fields

    def __init__(self, n_slots: int, n_ctx_slot: int) -> None:
        self.n_slots = n_slots
        self.n_ctx_slot = n_ctx_slot


class CacheEnabled(_EventBase):
    _fields = ("limit_mib",)
    __slots__ = _fields

    def __init__(self, limit_mib: float) -> None:
        self.limit_mib = limit_mib


class ConversationArrived(_EventBase):
    """``conv_id=...``: a completion request arrived (its task does not exist yet), with the
    client's X-Conversation-Id header, "" when none was sent. Hashed by the assembler."""

    _fields = ("raw_id",)
    __slots__ = _fields

    def __init__(self, raw_id: str) -> None:
        self.raw_id = raw_id


class RequestParamsRead(_EventBase):
    """``chat format: ...``: a chat request's parameters are being read. llama-server logs it
    on the request's HTTP thread after the request took its task id (see join.py)."""

    __slots__ = ()


class AllSlotsIdle(_EventBase):
    """``update_slots: all slots are idle`` (TRACE): the main loop has just tried every queued
    task (server-context.cpp:3023, after the queue is processed) and none is running."""

    __slots__ = ()


class SlotBusy(_EventBase):
    """``- skipping, is_processing = 1``: slot selection for a queued task passed over a busy
    slot. A task that finds every slot it may use busy is deferred (see join.py)."""

    _fields = ("slot",)
    __slots__ = _fields

    def __init__(self, slot: int) -> None:
        self.slot = slot


class SlotSelected(_EventBase):
    _fields = ("slot", "method", "f_keep", "f_sim")
    __slots__ = _fields

    def __init__(self, slot: int, method: str, f_keep: float | None = None, f_sim: float | None = None) -> None:
        self.slot = slot
        self.method = method  # "id" | "lcp" | "lru"
        self.f_keep = f_keep
        self.f_sim = f_sim


class CacheUpdateStarted(_EventBase):
    __slots__ = ()


class PromptSaved(_EventBase):
    _fields = ("n_tokens", "size_mib")
    __slots__ = _fields

    def __init__(self, n_tokens: int, size_mib: float) -> None:
        self.n_tokens = n_tokens
        self.size_mib = size_mib


class PromptSaveSkipped(_EventBase):
    _fields = ("reason",)
    __slots__ = _fields

    def __init__(self, reason: str) -> None:
        self.reason = reason  # "already_cached" | "too_big"


class ObsoleteEntryRemoved(_EventBase):
    _fields = ("n_tokens",)
    __slots__ = _fields

    def __init__(self, n_tokens: int) -> None:
        self.n_tokens = n_tokens


class CacheLookup(_EventBase):
    _fields = ("base_f_keep", "base_f_sim")
    __slots__ = _fields

    def __init__(self, base_f_keep: float, base_f_sim: float) -> None:
        self.base_f_keep = base_f_keep
        self.base_f_sim = base_f_sim


class CacheCandidate(_EventBase):
    _fields = ("n_tokens", "lcp", "f_keep", "f_sim")
    __slots__ = _fields

    def __init__(self, n_tokens: int, lcp: int, f_keep: str, f_sim: str) -> None:
        self.n_tokens = n_tokens
        self.lcp = lcp
        self.f_keep = f_keep  # kept as printed: the winner is found by comparing the printed values
        self.f_sim = f_sim


class CacheRestored(_EventBase):
    _fields = ("f_keep", "f_sim")
    __slots__ = _fields

    def __init__(self, f_keep: str, f_sim: str) -> None:
        self.f_keep = f_keep
        self.f_sim = f_sim


class CacheState(_EventBase):
    _fields = ("n_prompts", "size_mib", "limit_mib", "limit_tokens", "limit_tokens_in_force")
    __slots__ = _fields

    def __init__(
        self,
        n_prompts: int,
        size_mib: float,
        limit_mib: float,
        limit_tokens: int | None = None,
        limit_tokens_in_force: int | None = None,
    ) -> None:
        self.n_prompts = n_prompts
        self.size_mib = size_mib
        self.limit_mib = limit_mib  # --cache-ram; 0: no byte limit (-1)
        # the token limit (the context size) and the one in force: with a byte limit the server
        # raises it to limit / bytes per token (server_prompt_cache::update), so only a cache
        # without a byte limit evicts by tokens. None on a line without them.
        self.limit_tokens = limit_tokens
        self.limit_tokens_in_force = limit_tokens_in_force


class CacheEntryListed(_EventBase):
    _fields = ("entry_id", "n_tokens", "size_mib", "checkpoints")
    __slots__ = _fields

    def __init__(self, entry_id: str, n_tokens: int, size_mib: float, checkpoints: int = 0) -> None:
        self.entry_id = entry_id  # the entry's address as printed, e.g. 0x5593369e7000
        self.n_tokens = n_tokens
        self.size_mib = size_mib
        self.checkpoints = checkpoints  # context checkpoints (SWA, hybrid models) stored with the entry


class CacheUpdateTook(_EventBase):
    _fields = ("ms",)
    __slots__ = _fields

    def __init__(self, ms: float) -> None:
        self.ms = ms


class CacheEvicted(_EventBase):
    _fields = ("size_mib", "making_room", "by_token_limit")
    __slots__ = _fields

    def __init__(self, size_mib: float, making_room: bool, by_token_limit: bool = False) -> None:
        self.size_mib = size_mib
        self.making_room = making_room  # evicted by a save to make room for it, before the new entry is pushed
        self.by_token_limit = by_token_limit  # "cache token limit ... reached": the byte limit was not the cause


class CacheRestoreFailed(_EventBase):
    __slots__ = ()


class LoraCacheCleared(_EventBase):
    _fields = ("slot", "n_from", "n_to")
    __slots__ = _fields

    def __init__(self, slot: int, n_from: int, n_to: int) -> None:
        self.slot = slot
        self.n_from = n_from
        self.n_to = n_to


class TaskLaunched(_EventBase):
    _fields = ("slot", "task", "is_child")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, is_child: bool) -> None:
        self.slot = slot
        self.task = task
        self.is_child = is_child


class SamplerChainSet(_EventBase):
    """``sampler chain: ...`` (TRACE), just before a task's launch on this slot: the task
    samples tokens (a completion or infill). Embedding and rerank tasks launch without one."""

    _fields = ("slot",)
    __slots__ = _fields

    def __init__(self, slot: int) -> None:
        self.slot = slot


class GlobalLoraScale(_EventBase):
    """``set lora adapter idx=N scale=S`` (TRACE): POST /lora-adapters set adapter N's global
    scale, the one a request without a ``lora`` list runs with from its next launch on."""

    _fields = ("adapter", "scale")
    __slots__ = _fields

    def __init__(self, adapter: int, scale: float) -> None:
        self.adapter = adapter
        self.scale = scale


class ChildTasksLaunched(_EventBase):
    """``launching slots for parent task id_task = N with K child tasks``: an n > 1 request,
    one parent task and K children that copy its prompt state (one request, K + 1 choices)."""

    _fields = ("parent_task", "n_children")
    __slots__ = _fields

    def __init__(self, parent_task: int, n_children: int) -> None:
        self.parent_task = parent_task
        self.n_children = n_children


class IdleSlotSaving(_EventBase):
    _fields = ("slot",)
    __slots__ = _fields

    def __init__(self, slot: int) -> None:
        self.slot = slot


class SlotPromptCleared(_EventBase):
    _fields = ("slot", "n_tokens")
    __slots__ = _fields

    def __init__(self, slot: int, n_tokens: int) -> None:
        self.slot = slot
        self.n_tokens = n_tokens


class NewPrompt(_EventBase):
    _fields = ("slot", "task", "n_tokens")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, n_tokens: int) -> None:
        self.slot = slot
        self.task = task
        self.n_tokens = n_tokens


class CachedTokens(_EventBase):
    _fields = ("slot", "task", "n_tokens")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, n_tokens: int) -> None:
        self.slot = slot
        self.task = task
        self.n_tokens = n_tokens


class FullReprocessForced(_EventBase):
    _fields = ("slot", "task")
    __slots__ = _fields

    def __init__(self, slot: int, task: int) -> None:
        self.slot = slot
        self.task = task


class PrefillFinished(_EventBase):
    """TRACE ``init sampler``: the prompt is fully in the slot, sampling starts."""

    _fields = ("slot", "task")
    __slots__ = _fields

    def __init__(self, slot: int, task: int) -> None:
        self.slot = slot
        self.task = task


class PrefillProgress(_EventBase):
    _fields = ("slot", "task", "n_tokens")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, n_tokens: int) -> None:
        self.slot = slot
        self.task = task
        self.n_tokens = n_tokens


class PromptTiming(_EventBase):
    _fields = ("slot", "task", "ms", "n_tokens")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, ms: float, n_tokens: int) -> None:
        self.slot = slot
        self.task = task
        self.ms = ms
        self.n_tokens = n_tokens


class EvalTiming(_EventBase):
    _fields = ("slot", "task", "ms", "n_tokens", "ms_per_token")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, ms: float, n_tokens: int, ms_per_token: float) -> None:
        self.slot = slot
        self.task = task
        self.ms = ms
        self.n_tokens = n_tokens
        self.ms_per_token = ms_per_token


class DraftAcceptance(_EventBase):
    """INFO ``draft acceptance = R (A accepted / G generated)`` with a task's timings: of the draft
    model's G tokens, the target accepted A (speculative decoding; logged only when it drafted)."""

    _fields = ("slot", "task", "accepted", "generated")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, accepted: int, generated: int) -> None:
        self.slot = slot
        self.task = task
        self.accepted = accepted
        self.generated = generated


class ContextShift(_EventBase):
    """WARN ``slot context shift, n_keep, n_left, n_discard``: the context was full, the server
    dropped n_discard tokens of the slot's history after the first n_keep and went on."""

    _fields = ("slot", "task", "discarded")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, discarded: int) -> None:
        self.slot = slot
        self.task = task
        self.discarded = discarded


class TaskReleased(_EventBase):
    _fields = ("slot", "task", "n_tokens", "truncated")
    __slots__ = _fields

    def __init__(self, slot: int, task: int, n_tokens: int, truncated: bool) -> None:
        self.slot = slot
        self.task = task
        self.n_tokens = n_tokens
        self.truncated = truncated


class TaskCancelled(_EventBase):
    _fields = ("task",)
    __slots__ = _fields

    def __init__(self, task: int) -> None:
        self.task = task


class TaskFailed(_EventBase):
    _fields = ("task",)
    __slots__ = _fields

    def __init__(self, task: int) -> None:
        self.task = task


class TaskLaunchFailed(_EventBase):
    """``failed to launch slot with task, id_task = N``: the task was dropped before it ran."""

    _fields = ("task",)
    __slots__ = _fields

    def __init__(self, task: int) -> None:
        self.task = task


# ---- the router's own lines (llama-server --models-preset / --models-dir, server-models.cpp).
# Model names are the operator's presets or model files, never client text; the pipeline
# still takes a name as a label value only from a spawn line (bounded, see router.py).


class RouterStarted(_EventBase):
    """``starting server in router mode``: this log is a router's; its children's lines come
    prefixed with ``[port] ``."""

    __slots__ = ()


class ModelAvailable(_EventBase):
    """``  [    preset] M`` under ``Available models (N):``: a model the router can serve."""

    _fields = ("name",)
    __slots__ = _fields

    def __init__(self, name: str) -> None:
        self.name = name


class ChildSpawned(_EventBase):
    """``spawning server instance with name=M on port P``: the child on port P serves M."""

    _fields = ("name", "port")
    __slots__ = _fields

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port


class ChildExited(_EventBase):
    """``instance name=M exited with status S``."""

    _fields = ("name", "status")
    __slots__ = _fields

    def __init__(self, name: str, status: int) -> None:
        self.name = name
        self.status = status


class RequestProxied(_EventBase):
    """``proxying request to model M on port P``: a request (or a /slots, /metrics poll) went
    to the child."""

    _fields = ("name", "port")
    __slots__ = _fields

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port


class ModelRequestQueued(_EventBase):
    """``request for name=M queued at position N`` / ``joined the queue``: a request waits for
    its model to load."""

    _fields = ("name",)
    __slots__ = _fields

    def __init__(self, name: str) -> None:
        self.name = name


class ModelRequestCancelled(_EventBase):
    """``request for conv_id=... cancelled while model name=M was loading``."""

    _fields = ("name",)
    __slots__ = _fields

    def __init__(self, name: str) -> None:
        self.name = name


class ChildStopping(_EventBase):
    """``stopping model instance name=M`` (unload, swap, shutdown)."""

    _fields = ("name",)
    __slots__ = _fields

    def __init__(self, name: str) -> None:
        self.name = name


class DebugLine(_EventBase):
    """A ``D`` line: llama-server runs at -lv 5 and logs prompt text. Content dropped here."""

    __slots__ = ()


class Ignored(_EventBase):
    """A line we know and do not need (model loading, sampler settings, continuation lines...)."""

    __slots__ = ()


class Unrecognized(_EventBase):
    """A line shaped like a server line whose message we do not know: a new build's log. Of
    the line only its logger (slot, srv, que, res, cmn, spec; "" when it has none) and the
    function column are kept: which part of the server changed, never message text."""

    __slots__ = ("logger", "function")
    _fields = ("logger", "function")

    def __init__(self, logger: str = "", function: str = "") -> None:
        self.logger = logger
        self.function = function


class Unreadable(_EventBase):
    """Not text: bytes that are not UTF-8, NUL, or control characters in a line without the
    server's prefix (a binary file, a corrupted log, a hole in the file)."""

    __slots__ = ()


Event = Union[  # noqa: UP007 - a runtime alias, readable on 3.10
    ServerStarting,
    Verbosity,
    ServerBuild,
    ServerListening,
    SlotsInitialized,
    CacheEnabled,
    ConversationArrived,
    RequestParamsRead,
    AllSlotsIdle,
    SlotBusy,
    SlotSelected,
    CacheUpdateStarted,
    PromptSaved,
    PromptSaveSkipped,
    ObsoleteEntryRemoved,
    CacheLookup,
    CacheCandidate,
    CacheRestored,
    CacheState,
    CacheEntryListed,
    CacheUpdateTook,
    CacheEvicted,
    CacheRestoreFailed,
    LoraCacheCleared,
    GlobalLoraScale,
    SamplerChainSet,
    ChildTasksLaunched,
    TaskLaunched,
    IdleSlotSaving,
    SlotPromptCleared,
    NewPrompt,
    CachedTokens,
    FullReprocessForced,
    PrefillFinished,
    PrefillProgress,
    PromptTiming,
    EvalTiming,
    DraftAcceptance,
    ContextShift,
    TaskReleased,
    TaskCancelled,
    TaskFailed,
    TaskLaunchFailed,
    RouterStarted,
    ModelAvailable,
    ChildSpawned,
    ChildExited,
    RequestProxied,
    ModelRequestQueued,
    ModelRequestCancelled,
    ChildStopping,
    DebugLine,
    Ignored,
    Unrecognized,
    Unreadable,
]


class ParsedLine:
    """A line's event and where it stands. A plain class rather than a dataclass: one is built
    for every line, and compiled (mypyc) a plain class is built in native code, a dataclass
    through the interpreter."""

    __slots__ = ("ts_us", "event", "child", "bare")

    def __init__(self, ts_us: int | None, event: Event, child: int | None = None, bare: bool = False) -> None:
        self.ts_us = ts_us
        self.event = event
        self.child = child  # the router's [port] prefix: the line is that child's
        # no timestamp and no level letter: --no-log-prefix, or a continuation line of a
        # multi-line message (a grammar or a prompt at -lv 5, client text): see Pipeline
        self.bare = bare

    def _fields(self) -> tuple[int | None, Event, int | None, bool]:
        return (self.ts_us, self.event, self.child, self.bare)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParsedLine) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return f"ParsedLine(ts_us={self.ts_us!r}, event={self.event!r}, child={self.child!r}, bare={self.bare!r})"


IGNORED: Final = Ignored()
UNRECOGNIZED: Final = Unrecognized()
UNREADABLE: Final = Unreadable()
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
DEBUG: Final = DebugLine()
REQUEST_PARAMS_READ: Final = RequestParamsRead()
ALL_SLOTS_IDLE: Final = AllSlotsIdle()

# ---------------------------------------------------------------- envelope

_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")
_ROUTER: Final = re.compile(r"^\[ *\d{1,5}\] ")
# timestamp + level letter, both optional (--no-log-timestamps / --no-log-prefix)
_PREFIX: Final = re.compile(r"^(?:(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) )?([IWED]) ")
# tag, function column (12 chars, right aligned) and, for slot lines, the ids
_TAGGED: Final = re.compile(r"^(slot|srv |que |res |cmn |spec) .{12}: (?:id +(\d+) \| task (-?\d+) \| )?")

_FLOAT: Final = r"(-?\d+(?:\.\d+)?)"

_RE_BUILD: Final = re.compile(r"common_params_print_info: build (\d{1,9}) \(([0-9A-Za-z]+)\)")
_RE_SELECTED_LCP: Final = re.compile(
    r"selected slot by LCP similarity, f_sim_best = ([\d.]+) \(> [\d.]+ thold\), f_keep = " + _FLOAT
)
_RE_NEW_PROMPT: Final = re.compile(r"new prompt, n_ctx_slot = \d+, n_keep = -?\d+, task\.n_tokens = (\d+)")
_RE_CACHED: Final = re.compile(r"cached n_tokens = (\d+),")
_RE_DRAFT_ACCEPTANCE: Final = re.compile(r"draft acceptance = \S+ \( *(\d+) accepted / +(\d+) generated\)")
_RE_CONTEXT_SHIFT: Final = re.compile(r"slot context shift, n_keep = -?\d+, n_left = -?\d+, n_discard = (\d+)$")
_RE_PROMPT_TIMING: Final = re.compile(r"prompt eval time = +" + _FLOAT + r" ms / +(\d+) tokens")
_RE_EVAL_TIMING: Final = re.compile(r"eval time = +" + _FLOAT + r" ms / +(\d+) tokens \( +" + _FLOAT + " ms per token")
_RE_RELEASE: Final = re.compile(r"stop processing: n_tokens = (\d+), truncated = (\d)")
_RE_PROCESSING: Final = re.compile(r"processing task, is_child = (\d)")
_RE_LORA_CLEAR: Final = re.compile(r"clearing cache for lora change\. (\d+) loras -> (\d+) loras")
_RE_CLEAR_PROMPT: Final = re.compile(r"clearing prompt with (\d+) tokens")
_RE_PROGRESS: Final = re.compile(r"prompt processing, n_tokens = +(\d+)")
_RE_SAVE: Final = re.compile(r" - saving prompt with length (\d+), total state size = " + _FLOAT + " MiB")
_RE_LOOKUP: Final = re.compile(r" - looking for better prompt, base f_keep = " + _FLOAT + ", f_sim = " + _FLOAT)
_CANDIDATE: Final = r"   - prompt with length +(\d+), lcp = +(-?\d+), f_keep = ([-\d.]+), f_sim = ([-\d.]+)"
_RE_CANDIDATE: Final = re.compile(_CANDIDATE)
_RE_FOUND: Final = re.compile(r" - found better prompt with f_keep = ([-\d.]+), f_sim = ([-\d.]+)")
_RE_STATE: Final = re.compile(
    r" - cache state: (\d+) prompts, " + _FLOAT + r" MiB \(limits: " + _FLOAT + r" MiB(?:, (\d+) tokens, (\d+) est)?"
)
_ENTRY: Final = r"   - prompt (0x[0-9a-f]+|\(nil\)|\w+): +(\d+) tokens, checkpoints: +(\d+), +" + _FLOAT + " MiB"
_RE_ENTRY: Final = re.compile(_ENTRY)
_RE_TOOK: Final = re.compile(r"prompt cache update took " + _FLOAT + " ms")
_RE_EVICT: Final = re.compile(r"removing oldest entry \(size = " + _FLOAT + r" MiB\)")
_RE_OBSOLETE: Final = re.compile(r" - removing obsolete cached prompt with length (\d+)")
_RE_VERBOSITY: Final = re.compile(r"verbosity = (\d+)")
_RE_LISTENING: Final = re.compile(r"listening on (https?://[^\s/]{1,300})/?$")
_RE_SLOTS_INIT: Final = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+)")
_RE_CACHE_LIMIT: Final = re.compile(r"prompt cache is enabled, size limit: (-?\d+) MiB")
_RE_CANCEL: Final = re.compile(r"cancel task, id_task = (\d+)")
_RE_SEND_ERROR: Final = re.compile(r"task id = (\d+), error: ")
_RE_LAUNCH_FAILED: Final = re.compile(r"failed to launch slot with (?:parent )?task, id_task = (\d+)")
_RE_SET_LORA: Final = re.compile(r"set lora adapter idx=(\d+) scale=(-?[0-9.]+(?:e[-+]?\d+)?)")
_RE_PARENT: Final = re.compile(r"launching slots for parent task id_task = (\d+) with (\d+) child tasks")
_MODEL_NAME: Final = r"(\S{1,256})"
_RE_SPAWNED: Final = re.compile(r"spawning server instance with name=" + _MODEL_NAME + r" on port (\d{1,5})$")
_RE_EXITED: Final = re.compile(r"instance name=" + _MODEL_NAME + r" exited with status (-?\d{1,6})$")
_RE_PROXIED: Final = re.compile(r"proxying request to model " + _MODEL_NAME + r" on port (\d{1,5})$")
_RE_QUEUED: Final = re.compile(r"request for name=" + _MODEL_NAME + r" (?:queued at position|joined the queue)")
_RE_LOAD_CANCELLED: Final = re.compile(r" cancelled while model name=" + _MODEL_NAME + r" was loading$")
_RE_AVAILABLE: Final = re.compile(r"  \[ *[a-z]{1,16}\] " + _MODEL_NAME)
_RE_STOPPING: Final = re.compile(r"stopping model instance name=" + _MODEL_NAME + "$")

# srv lines known and not needed, by how they begin (llama-server b10950 to b11549; the
# tools/server sources of b11434 and b11549 hold every one of them but the b10950 startup lines):
# startup, shutdown, sleeping, the router's bookkeeping, errors of other parts. Any other srv
# line the parsers above do not read is unrecognized (counted by function): a build that rewords
# a line is seen, never taken for one of these.
_SRV_IGNORED_STARTS: Final = (
    # startup and configuration
    "loading model '", "local path '", "model loaded", "using ", "chat template", "preserve_reasoning kwarg",
    "idle slots will be saved", "use `--cache-ram 0`", "for more info see", "context checkpoints ",
    "prompt cache is disabled", "prompt cache is enabled, size limit: ", "security: ", "embeddings enabled with",
    "setting n_batch", "setting address family", "speculative decoding", "synthetic acceptance requires",
    "capping per-slot context", "--kv-unified-per-slot", "--cache-idle-slots requires", "--port 0 is not",
    "loaded multimodal model", "[mtmd]", "running with SSL", "running without SSL", "the server is built without",
    "api_keys: ", "Google Cloud Platform compat", "AIP_PREDICT_ROUTE", "LLAMA_SERVER_SLOTS_", "LLAMA_TRACE",
    "The UI is disabled", "Use --ui", "SO_REUSEPORT", "n_parallel is set to auto", "notice: server default port",
    "cache_reuse is not supported", "ctx_shift is not supported", "swa_full is not supported", "the slot context (",
    "increase n_ubatch", "cap image_max_tokens", "decision model type", "Added ", "MCP", "NOTE: using preset.ini",
    "      please only use presets", "  no models found", "static assets path not found", "(CORS) ",
    # b10950's startup
    "CORS is set", "this can be a security risk", "more info: ", "-----------------", "binding port",
    # shutdown and sleeping
    "n_pre_decode", "avg t_", "EOF on stdin detected", "exit command received", "exiting due to",
    "child server monitoring thread", "server is entering sleeping state", "server is exiting sleeping state",
    # the router's bookkeeping (a child's own lines carry its port)
    "spawning server instance with args", "waiting until model name=", "slot available, loading queued model",
    "Loaded ", "Available models", "(startup) loading model", "(reload) ", "evicting idle LRU",
    "models_max limit reached", "removing model name=", "hiding cache model", "model ", "old process for model",
    "force-killing model", "starting download", "download", "cancelling download", "queued load of name=",
    "router stop for", "stop on unknown stream session", "proxying ", "DELETE /v1/stream", "done request: ",
    "purging slot ", "control ", "invalid stop-timeout", "failed to get stdout/stderr",
    "failed to parse child state update", "failed to initialize router models", "failed to load models on startup",
    # requests and errors the records learn otherwise (a task's failure: its missing timing lines)
    "http client error", "unauthorized: ", "ignoring client-provided stream field",
    "unsupported Responses tool type", "downloading image from", "loading image from local file", "got exception",
    "got another exception", "no tokens to decode", "decode() failed", "pre_decode() failed", "post_decode() failed",
    "failed to find free space in the KV cache", "failed to process speculative batch", "unsupported batch.",
    "failed to allocate memory for prompt cache state", "failed to create", "failed to load", "failed to init",
    "failed to fetch model metadata", "failed to stop HTTP server", "failed to initialize", "couldn't bind",
    "couldn't start HTTP listener", "listener on ", "tools setup failed", "unknown error while validating model",
)  # fmt: skip
# "<function>: cleaning up before exit..." (the server's main), and the router's listing of a
# child's arguments, one per line under "spawning server instance with args:"
_SRV_IGNORED: Final = re.compile(
    "|".join(re.escape(start) for start in _SRV_IGNORED_STARTS)
    + r"|\w+(?:\(\))?: (?:cleaning up before exit|chat template)|  \S"
)
_QUE_IGNORED: Final = ("entering sleeping state", "exiting sleeping state")

# slot-line messages that are known and carry nothing we need
_SLOT_IGNORED_PREFIXES: Final = (
    " - skipping",
    " - checking sim",
    "sampler chain",
    "sampler params",
    "created context checkpoint",
    "checking checkpoint",
    "restored context checkpoint",
    "erased invalidated context checkpoint",
    "erasing old context checkpoint",
    "erasing context checkpoint",
    "superseding context checkpoint",
    "graphs reused",
    "total time",
    "n_gen =",
    "acc per pos",
    "new slot",
    "n_past was set",
    "keeping cache for alora",
    "reusing chunk",
    "accepted ",
    "empty prompt",
    "cache reuse is not supported",
    "need to evaluate at least 1 token",
    "got exception",
    "failed to load prompt from cache",
    " - copying state to child",
    " - copying shared prompt",  # an n > 1 request's prompt, to its children's slots
    # slot files (POST /slots?action=save|restore; b11549 keeps context checkpoints in them)
    "appended ",
    "restored ",
    "failed to append context checkpoints",
    "invalid context checkpoint appendix",
    "truncated context checkpoint appendix",
    "draft context checkpoint data",
    "failed to load context checkpoint",
    # multimodal and embedding tasks, and their failures
    "encoding mtmd batch",
    "failed to encode mtmd",
    "failed to decode mtmd",
    "failed to process mtmd chunk",
    "failed to get embeddings",
    "slot is not processing",
    "n_past = ",
    # LLAMA_SERVER_SLOTS_DEBUG's dump of a prompt's differing tokens (their text too: never kept)
    "old: ... ",
    "new: ... ",
)


def _slot_event(slot: int, task: int, msg: str) -> Event:
    # the regex groups, typed: compiled, they are converted to numbers natively
    n: str
    ms: str
    per_token: str
    truncated: str
    generated: str
    f_keep: str
    f_sim: str
    c = msg[:1]
    if c == "c":
        if msg.startswith("cached n_tokens"):
            m = _RE_CACHED.match(msg)
            if m:
                n = m.group(1)
                return CachedTokens(slot, task, int(n))
        elif msg.startswith("clearing cache for lora change"):
            m = _RE_LORA_CLEAR.match(msg)
            if m:
                return LoraCacheCleared(slot, int(m.group(1)), int(m.group(2)))
        elif msg.startswith("clearing prompt with"):
            m = _RE_CLEAR_PROMPT.match(msg)
            if m:
                return SlotPromptCleared(slot, int(m.group(1)))
        elif msg.startswith(("created context checkpoint", "checking checkpoint")):
            return IGNORED  # SWA models log these at every prompt batch
    elif c == "p":
        if msg.startswith("prompt eval time"):
            m = _RE_PROMPT_TIMING.match(msg)
            if m:
                ms, n = m.group(1, 2)
                return PromptTiming(slot, task, float(ms), int(n))
        elif msg.startswith("processing task"):
            m = _RE_PROCESSING.match(msg)
            if m:
                return TaskLaunched(slot, task, m.group(1) == "1")
        elif msg.startswith("prompt processing"):
            m = _RE_PROGRESS.match(msg)
            if m:
                n = m.group(1)
                return PrefillProgress(slot, task, int(n))
    elif c == " ":
        s = msg.lstrip(" ")
        if s.startswith("- skipping, is_processing = 1"):  # every busy slot at each selection
            return SlotBusy(slot)
        if s.startswith("eval time"):
            m = _RE_EVAL_TIMING.match(s)
            if m:
                ms, n, per_token = m.group(1, 2, 3)
                return EvalTiming(slot, task, float(ms), int(n), float(per_token))
        if s.startswith(("total time", "graphs reused", "- skipping", "- checking sim", "acc per pos")):
            return IGNORED
        if s[:1].isdigit():  # the token ids of that dump, right-aligned
            return IGNORED
    elif c == "s":
        if msg.startswith("stop processing"):
            m = _RE_RELEASE.match(msg)
            if m:
                n, truncated = m.group(1, 2)
                return TaskReleased(slot, task, int(n), truncated == "1")
        elif msg.startswith("selected slot by LRU"):
            return SlotSelected(slot, "lru")
        elif msg.startswith("selected slot by LCP"):
            m = _RE_SELECTED_LCP.match(msg)
            if m:
                f_sim, f_keep = m.group(1, 2)
                return SlotSelected(slot, "lcp", float(f_keep), float(f_sim))
        elif msg.startswith("selected slot by id"):
            return SlotSelected(slot, "id")
        elif msg.startswith("saving idle slot to prompt cache"):
            return IdleSlotSaving(slot)
        elif msg.startswith("sampler chain"):
            return SamplerChainSet(slot)
        elif msg.startswith("slot context shift"):
            m = _RE_CONTEXT_SHIFT.match(msg)
            if m:
                n = m.group(1)
                return ContextShift(slot, task, int(n))
    elif c == "d":
        if msg.startswith("draft acceptance"):
            m = _RE_DRAFT_ACCEPTANCE.match(msg)
            if m:
                n, generated = m.group(1, 2)
                return DraftAcceptance(slot, task, int(n), int(generated))
    elif c == "n":
        if msg.startswith("new prompt"):
            m = _RE_NEW_PROMPT.match(msg)
            if m:
                n = m.group(1)
                return NewPrompt(slot, task, int(n))
    elif c == "i":
        if msg.startswith("init sampler"):
            return PrefillFinished(slot, task)
    elif c == "f":
        if msg.startswith("forcing full prompt re-processing"):
            return FullReprocessForced(slot, task)
    if msg.startswith(_SLOT_IGNORED_PREFIXES):
        return IGNORED
    return UNRECOGNIZED


# Compiled (mypyc), a line's prefix and a listing line read by character cost a fraction of the
# regular expressions' match; in the interpreter, more: read so only where this module is compiled
# (_usual_line and the listings), by regular expressions in the interpreter (_usual_line_by_regex);
# the same events either way (tests/test_parse.py, tests/test_fuzz.py)
BY_CHARACTER: Final = __file__.endswith(".so")


def _spaces(msg: str, k: i64) -> i64:
    """Where the spaces from k on end."""
    n: i64 = len(msg)
    while k < n and ord(msg[k]) == 32:
        k += 1
    return k


def _spaced_number(msg: str, k: i64, then: str, signed: bool = False) -> tuple[i64, i64]:
    """At k: one space or more, ASCII digits (with a sign where ``signed``), then ``then``: the
    number and where ``then`` ends; -1 for where when the line is not so (or k is -1)."""
    first = _spaces(msg, k) if k >= 0 else k
    if first == k:
        return 0, -1
    negative = signed and first < len(msg) and ord(msg[first]) == 45  # -
    digits = first + 1 if negative else first
    value, e = _ascii_number(msg, digits)
    if e == digits or msg[e : e + len(then)] != then:
        return 0, -1
    return (-value if negative else value), e + len(then)


def _entry_line(msg: str) -> CacheEntryListed | None:
    """What _RE_ENTRY makes of a cache entry's line, read by character in its usual shape (an
    entry of ASCII letters, digits and underscores, or (nil); ASCII digits), None for any other
    (the regular expression then decides): at -lv 4 the RAM cache lists every entry at each
    update, most of the lines of a server with many slots. tests/test_parse.py holds the two
    together."""
    n: i64 = len(msg)
    k: i64 = 12
    while k < n:  # the entry: \w+ of ASCII, up to its colon
        c: i64 = ord(msg[k])
        if not (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c == 95):
            break
        k += 1
    if k == 12 and k < n and ord(msg[k]) == 40 and msg[k : k + 6] == "(nil):":
        k += 5
    if k == 12 or k >= n or ord(msg[k]) != 58:  # :
        return None
    colon = k
    tokens, k = _spaced_number(msg, colon + 1, " tokens, checkpoints:")
    first = _spaces(msg, k) if k >= 0 else k
    if first == k:
        return None
    checkpoints, e = _ascii_number(msg, first)  # then ",": by character, no slice
    if e == first or e >= n or ord(msg[e]) != 44:
        return None
    start = _spaces(msg, e + 1)
    if start == e + 1:
        return None
    mib, end = _ascii_float(msg, start)
    if end < 0 or end + 4 > n or not _mib_at(msg, end):
        return None
    return CacheEntryListed(msg[12:colon], tokens, mib, checkpoints)


def _mib_at(msg: str, k: i64) -> bool:
    """msg[k:k + 4] == " MiB", by character (a slice costs more: it is made, then compared)."""
    return ord(msg[k]) == 32 and ord(msg[k + 1]) == 77 and ord(msg[k + 2]) == 105 and ord(msg[k + 3]) == 66


def _ascii_float(msg: str, k: i64) -> tuple[float, i64]:
    r"""An ASCII -?\d+(\.\d+)? from k on as float() reads it, and where it ends (-1: none).
    Of at most 15 digits, the digits as one integer over a power of ten: both exact as doubles,
    so the one division rounds the decimal as float() does (correctly rounded, both)."""
    n: i64 = len(msg)
    start = k
    negative = k < n and ord(msg[k]) == 45  # -
    if negative:
        k += 1
    scaled, e = _ascii_number(msg, k)
    if e == k:
        return 0.0, -1
    digits = e - k
    if e < n and ord(msg[e]) == 46:  # .
        f = e + 1
        while f < n:  # the fraction's digits carry on the same integer (used only up to 15 digits)
            c: i64 = ord(msg[f])
            if c < 48 or c > 57:
                break
            scaled = scaled * 10 + c - 48
            f += 1
        if f == e + 1:
            return 0.0, -1
        digits += f - e - 1
        if digits <= 15:
            value = float(scaled) / _POW10[f - e - 1]
            return (-value if negative else value), f
        return float(msg[start:f]), f
    if digits > 15:
        return float(msg[start:e]), e
    value = float(scaled)
    return (-value if negative else value), e


_POW10: Final = tuple(float(10**i) for i in range(16))  # exact as doubles


def _candidate_line(msg: str) -> CacheCandidate | None:
    """What _RE_CANDIDATE makes of a lookup's candidate line, by character in its usual shape
    (ASCII digits), None for any other (the regular expression then decides)."""
    n_tokens, k = _spaced_number(msg, 23, ", lcp =")
    lcp, e = _spaced_number(msg, k, ", f_keep = ", signed=True)
    if e < 0:
        return None
    keep_start = e
    keep_end = _printed_end(msg, keep_start)
    if keep_end == keep_start or msg[keep_end : keep_end + 10] != ", f_sim = ":
        return None
    sim_start = keep_end + 10
    sim_end = _printed_end(msg, sim_start)
    if sim_end == sim_start or (sim_end < len(msg) and ord(msg[sim_end]) > 127):
        return None  # a digit of another script may follow: the regular expression's
    return CacheCandidate(n_tokens, lcp, msg[keep_start:keep_end], msg[sim_start:sim_end])


def _printed_end(msg: str, k: i64) -> i64:
    """Where a run of ASCII digits, "-" and "." from k on ends."""
    n: i64 = len(msg)
    while k < n:
        c: i64 = ord(msg[k])
        if not (48 <= c <= 57 or c == 45 or c == 46):
            break
        k += 1
    return k


def _srv_event(msg: str) -> Event:
    n: str  # the regex groups, typed (see _slot_event)
    lcp: str
    f_keep: str
    f_sim: str
    entry: str
    checkpoints: str
    mib: str
    ms: str
    entries: str
    size: str
    limit: str
    # The prompt-cache narrative carries no ids; the assembler attaches it to the
    # slot whose selection (or idle save) started it.
    if msg.startswith("   - prompt "):  # the listings: most lines of a server with many slots
        if len(msg) > 12 and ord(msg[12]) == 119 and msg.startswith("   - prompt with length"):  # w
            candidate = _candidate_line(msg) if BY_CHARACTER else None
            if candidate is not None:
                return candidate
            m = _RE_CANDIDATE.match(msg)
            if m:
                n, lcp, f_keep, f_sim = m.groups()
                return CacheCandidate(int(n), int(lcp), f_keep, f_sim)
            return UNRECOGNIZED
        entry_listed = _entry_line(msg) if BY_CHARACTER else None
        if entry_listed is not None:
            return entry_listed
        m = _RE_ENTRY.match(msg)
        if m:
            entry, n, checkpoints, mib = m.groups()
            return CacheEntryListed(entry, int(n), float(mib), int(checkpoints))
        return UNRECOGNIZED
    if msg[:1] == " " and (msg.startswith(" - ") or msg.startswith("   - ")):
        # the RAM cache's state at each update, its lookup at each selection: the most frequent first
        if msg.startswith(" - cache state"):
            m = _RE_STATE.match(msg)
            if m:
                entries, size, limit, tokens, est = m.groups()
                return CacheState(
                    int(entries),
                    float(size),
                    float(limit),
                    int(tokens) if tokens else None,
                    int(est) if est else None,
                )
        elif msg.startswith(" - looking for better prompt"):
            m = _RE_LOOKUP.match(msg)
            if m:
                f_keep, f_sim = m.groups()
                return CacheLookup(float(f_keep), float(f_sim))
        elif msg.startswith(" - saving prompt"):
            m = _RE_SAVE.match(msg)
            if m:
                n, mib = m.groups()
                return PromptSaved(int(n), float(mib))
        elif msg.startswith(" - found better prompt"):
            m = _RE_FOUND.match(msg)
            if m:
                return CacheRestored(m.group(1), m.group(2))
        elif "removing oldest entry" in msg:
            m = _RE_EVICT.search(msg)
            if m:
                return CacheEvicted(float(m.group(1)), "making room" in msg, "token limit" in msg)
        elif msg.startswith(" - prompt is already in the cache"):
            return PromptSaveSkipped("already_cached")
        elif msg.startswith(" - prompt state size"):
            return PromptSaveSkipped("too_big")
        elif msg.startswith(" - removing obsolete cached prompt"):
            m = _RE_OBSOLETE.match(msg)
            if m:
                return ObsoleteEntryRemoved(int(m.group(1)))
        elif msg.startswith(" - cache size limit reduced"):
            return IGNORED
        return UNRECOGNIZED
    if msg.startswith("updating prompt cache"):
        return CacheUpdateStarted()
    if msg.startswith("prompt cache update took"):
        m = _RE_TOOK.match(msg)
        if m:
            ms = m.group(1)
            return CacheUpdateTook(float(ms))
    if msg.startswith("conv_id="):
        end = msg.rfind(" (empty=")
        return ConversationArrived(msg[8:end] if end >= 8 else "")
    if msg.startswith("initializing ..."):
        return ServerStarting()
    if msg.startswith("initializing, n_slots"):
        m = _RE_SLOTS_INIT.match(msg)
        if m:
            return SlotsInitialized(int(m.group(1)), int(m.group(2)))
    if msg.startswith("prompt cache is enabled"):
        m = _RE_CACHE_LIMIT.match(msg)
        if m:
            return CacheEnabled(float(m.group(1)))
    if msg.startswith("cancel task"):
        m = _RE_CANCEL.match(msg)
        if m:
            return TaskCancelled(int(m.group(1)))
    if msg.startswith("task id = "):
        m = _RE_SEND_ERROR.match(msg)
        if m:
            return TaskFailed(int(m.group(1)))
    if msg.startswith("failed to restore state"):
        return CacheRestoreFailed()
    if msg.startswith("chat format: "):
        return REQUEST_PARAMS_READ
    if msg.startswith("all slots are idle"):
        return ALL_SLOTS_IDLE
    if msg.startswith("failed to launch slot with"):
        m = _RE_LAUNCH_FAILED.match(msg)
        if m:
            return TaskLaunchFailed(int(m.group(1)))
    if msg.startswith("set lora adapter"):
        m = _RE_SET_LORA.match(msg)
        if m:
            return GlobalLoraScale(int(m.group(1)), float(m.group(2)))
    if msg.startswith("launching slots for parent"):
        m = _RE_PARENT.match(msg)
        if m:
            return ChildTasksLaunched(int(m.group(1)), int(m.group(2)))
    if msg.startswith("listening on "):
        m = _RE_LISTENING.match(msg)
        if m:
            return ServerListening(m.group(1))
    return _router_event(msg)


def _router_event(msg: str) -> Event:
    """The router's own srv lines; the names they carry are models the router knows."""
    c = msg[:1]
    m: re.Match[str] | None = None
    if c == " " and msg.startswith("  ["):
        m = _RE_AVAILABLE.match(msg)
        if m:
            return ModelAvailable(m.group(1))
    elif c == "p" and msg.startswith("proxying request to model "):
        m = _RE_PROXIED.match(msg.rstrip())
        if m:
            return RequestProxied(m.group(1), int(m.group(2)))
    elif c == "s":
        if msg.startswith("spawning server instance with name="):
            m = _RE_SPAWNED.match(msg.rstrip())
            if m:
                return ChildSpawned(m.group(1), int(m.group(2)))
        elif msg.startswith("starting server in router mode"):
            return RouterStarted()
        elif msg.startswith("stopping model instance name="):
            m = _RE_STOPPING.match(msg.rstrip())
            if m:
                return ChildStopping(m.group(1))
    elif c == "i" and msg.startswith("instance name="):
        m = _RE_EXITED.match(msg.rstrip())
        if m:
            return ChildExited(m.group(1), int(m.group(2)))
    elif c == "r" and msg.startswith("request for "):
        if msg.startswith("request for name="):
            m = _RE_QUEUED.match(msg)
            if m:
                return ModelRequestQueued(m.group(1))
        elif msg.startswith("request for conv_id="):
            m = _RE_LOAD_CANCELLED.search(msg.rstrip())
            if m:
                return ModelRequestCancelled(m.group(1))
    if _SRV_IGNORED.match(msg):
        return IGNORED
    return UNRECOGNIZED


_HEX_COMMIT: Final = re.compile(r"[0-9a-f]{4,40}")


def _commit(text: str) -> str:
    """A git commit is hex: anything else (a build without git metadata, or text that is no
    commit) is "unknown", never copied into a label."""
    return text if _HEX_COMMIT.fullmatch(text) else "unknown"


def parse_message(text: str, ts_us: int | None, level: str | None) -> ParsedLine:
    """Classify one line whose timestamp/level prefix has been removed."""
    if level == "D":
        return ParsedLine(ts_us, DEBUG)
    m = _TAGGED.match(text)
    if m is None:
        if text.startswith("cmn  ") or "verbosity = " in text[:80]:
            v = _RE_VERBOSITY.search(text)
            if v and "common_params_print_info" in text:
                return ParsedLine(ts_us, Verbosity(int(v.group(1))))
            b = _RE_BUILD.search(text)
            if b:
                return ParsedLine(ts_us, ServerBuild(int(b.group(1)), _commit(b.group(2))))
        return ParsedLine(ts_us, IGNORED)
    tag, slot, task = m.groups()
    if slot is None or task is None:
        event = _tagged_event(tag, -1, 0, text[m.end() :])
    else:
        event = _tagged_event(tag, int(slot), int(task), text[m.end() :])
    if event is UNRECOGNIZED:
        event = unrecognized(tag, text[5:17])
    return ParsedLine(ts_us, event)


_FUNCTION_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_()~")


def unrecognized(tag: str, column: str) -> Unrecognized:
    """An unrecognized line's event: its logger and function column (a C++ function name,
    truncated to 12 characters by the server's logger), "other" for a column that is no name."""
    function = column.strip()
    if not function or len(function) > 12 or not all(c in _FUNCTION_CHARS for c in function):
        function = "other"
    return Unrecognized(tag.strip(), function)


def _tagged_event(tag: str, slot: int, task: int, msg: str) -> Event:
    """slot -1: the line carries no ids."""
    if tag == "slot":
        if slot < 0:
            return UNRECOGNIZED
        return _slot_event(slot, task, msg)
    if tag == "srv ":
        return _srv_event(msg)
    if tag == "cmn ":
        if "verbosity = " in msg:
            v = _RE_VERBOSITY.search(msg)
            if v:
                return Verbosity(int(v.group(1)))
        elif "print_info: build " in msg:
            b = _RE_BUILD.search(msg)
            if b:
                return ServerBuild(int(b.group(1)), _commit(b.group(2)))
        return IGNORED  # the common library's lines (model, devices, threads): none carries what we read
    if tag == "que ":
        return IGNORED if msg.startswith(_QUE_IGNORED) else UNRECOGNIZED
    if tag == "spec":
        return IGNORED  # speculative decoding's setup; what a task accepted is on its slot lines
    return UNRECOGNIZED  # res: nothing of it is logged below DEBUG in any build we know


_JSONL_LEVELS: Final = {"info": "I", "warn": "W", "error": "E", "debug": "D", "cont": None, "none": None}


def parse_line(line: str) -> ParsedLine:
    """Parse one raw line (newline already stripped). Never raises."""
    try:
        return _parse_line(line)
    except Exception:  # a parser bug must cost one line, never the exporter
        return ParsedLine(None, UNRECOGNIZED)


def _parse_line(line: str) -> ParsedLine:
    if "\ufffd" not in line and "\x00" not in line and "\x1b" not in line:
        parsed = _usual_line(line) if BY_CHARACTER else _usual_line_by_regex(line)
        if parsed is not None:
            return parsed
        if line[:1] == "\t" and (line[1:].isprintable() or _CONTROL.search(line) is None):
            # a continuation line (the sampler settings under each request's "sampler params"):
            # what the general path makes of it, without its other checks (a printable line has
            # no control character: the search only where it may find one)
            return ParsedLine(None, IGNORED, bare=True)
    return _parse_general(line)


def _usual_line(line: str) -> ParsedLine | None:
    """The usual text line, read a character at a time, or None for the general path: what
    _PREFIX and then _TAGGED match, for a timestamp of ASCII digits and a level other than D

        M.SS.mmm.uuu L tag  function____: id  S | task T | message

    (the ids on slot lines only). Its prefix makes it the server's own line: the general path's
    check for control characters is left to lines without one, as are colours, holes (NUL) and
    bytes that were not UTF-8. By character, not by a regular expression: this runs for every
    line, and compiled (setup.py) a character costs a few machine instructions where a match
    costs thousands. tests/test_parse.py holds it to the general path, line for line."""
    n: i64 = len(line)
    minutes, i = _ascii_number(line, 0)
    # ".SS.mmm.uuu L tag  " and the function column (12 characters), then ": "; minutes of up
    # to 9 digits (1,900 years), so that the microseconds fit a native 64-bit integer
    if i == 0 or i > 9 or i + 33 > n:
        return None
    s1: i64 = ord(line[i + 1])
    s2: i64 = ord(line[i + 2])
    m1: i64 = ord(line[i + 4])
    m2: i64 = ord(line[i + 5])
    m3: i64 = ord(line[i + 6])
    u1: i64 = ord(line[i + 8])
    u2: i64 = ord(line[i + 9])
    u3: i64 = ord(line[i + 10])
    if not (
        ord(line[i]) == 46  # .
        and ord(line[i + 3]) == 46
        and ord(line[i + 7]) == 46
        and ord(line[i + 11]) == 32
        and 48 <= s1 <= 57
        and 48 <= s2 <= 57
        and 48 <= m1 <= 57
        and 48 <= m2 <= 57
        and 48 <= m3 <= 57
        and 48 <= u1 <= 57
        and 48 <= u2 <= 57
        and 48 <= u3 <= 57
    ):
        return None
    # the microseconds of the minute: the digits' weights sum to 11,111,111, each digit less 48
    ts = (
        minutes * 60_000_000
        + (s1 * 10 + s2) * 1_000_000
        + (m1 * 100 + m2 * 10 + m3) * 1000
        + u1 * 100
        + u2 * 10
        + u3
        - 533_333_328
    )
    i += 12
    level: i64 = ord(line[i])
    if (level != 73 and level != 87 and level != 69) or ord(line[i + 1]) != 32 or ord(line[i + 6]) != 32:  # I W E
        return None
    tag = _tag_at(line, i + 2)
    if not tag:
        return None
    j: i64 = i + 19
    if ord(line[j]) != 58 or ord(line[j + 1]) != 32:  # ": "
        return None
    if "\n" in line and line.find("\n", i + 7, j) >= 0:  # "." is no newline (a memchr first)
        return None
    j += 2
    if j + 3 <= n and ord(line[j]) == 105 and ord(line[j + 1]) == 100 and ord(line[j + 2]) == 32:  # "id "
        # "id +(\d+) \| task (-?\d+) \| ", or no ids at all
        k: i64 = j + 3
        while k < n and ord(line[k]) == 32:
            k += 1
        first = k
        slot, k = _ascii_number(line, k)
        if k > first and _bar_at(line, k) and line[k + 3 : k + 8] == "task ":
            k += 8
            negative = k < n and ord(line[k]) == 45  # -
            if negative:
                k += 1
            first = k
            task, k = _ascii_number(line, k)
            if k > first and _bar_at(line, k):
                event = _tagged_event(tag, slot, -task if negative else task, line[k + 3 :])
                if event is UNRECOGNIZED:
                    event = unrecognized(tag, line[i + 7 : i + 19])
                return ParsedLine(ts, event)
        return None  # not the usual ids (other digits than ASCII ones, say): the general path's
    event = _tagged_event(tag, -1, 0, line[j:])
    if event is UNRECOGNIZED:
        event = unrecognized(tag, line[i + 7 : i + 19])
    return ParsedLine(ts, event)


# _usual_line's shape as one regular expression, for the interpreter (faster there than a
# character at a time), with a RAM-cache listing's message (at -lv 4 most lines of a server
# with many slots) read in the same match, as _srv_event reads it
_USUAL: Final = re.compile(
    r"([0-9]{1,9})\.([0-9][0-9])\.([0-9]{3})\.([0-9]{3}) [IWE] (slot|srv |que |res |cmn |spec) [^\n]{12}: "
    r"(?:id +([0-9]{1,18}) \| task (-?)([0-9]{1,18}) \| )?"
    r"(?:" + _CANDIDATE + "|" + _ENTRY + ")?"
)


def _usual_line_by_regex(line: str) -> ParsedLine | None:
    """_usual_line by one regular expression, for the interpreter: the same lines read, the same
    left to the general path (tests/test_fuzz.py holds both to it)."""
    m = _USUAL.match(line)
    if m is None:
        return None
    minutes, sec, ms, us, tag, slot, sign, task, n, lcp, f_keep, f_sim, entry, tokens, checkpoints, mib = m.groups()
    ts = int(minutes) * 60_000_000 + int(sec) * 1_000_000 + int(ms) * 1000 + int(us)
    event: Event
    if slot is None:
        if n is not None and tag == "srv ":
            return ParsedLine(ts, CacheCandidate(int(n), int(lcp), f_keep, f_sim))
        if entry is not None and tag == "srv ":
            return ParsedLine(ts, CacheEntryListed(entry, int(tokens), float(mib), int(checkpoints)))
        msg = line[m.end(5) + 15 :]  # after the tag, " ", the function column and ": "
        if msg.startswith("id "):
            return None  # not the usual ids: the general path's
        event = _tagged_event(tag, -1, 0, msg)
    else:
        event = _tagged_event(tag, int(slot), -int(task) if sign else int(task), line[m.end(8) + 3 :])
    if event is UNRECOGNIZED:
        at = m.start(5) + 5
        event = unrecognized(tag, line[at : at + 12])
    return ParsedLine(ts, event)


def _bar_at(line: str, k: i64) -> bool:
    """line[k:k + 3] == " | ", by character."""
    return k + 3 <= len(line) and ord(line[k]) == 32 and ord(line[k + 1]) == 124 and ord(line[k + 2]) == 32


def _tag_at(line: str, k: i64) -> str:
    """The logger's tag at k as one of the constants _TAGGED knows, "" for none: read by
    character, no slice made."""
    c0: i64 = ord(line[k])
    c1: i64 = ord(line[k + 1])
    c2: i64 = ord(line[k + 2])
    c3: i64 = ord(line[k + 3])
    if c0 == 115:  # s
        if c1 == 108 and c2 == 111 and c3 == 116:
            return "slot"
        if c1 == 114 and c2 == 118 and c3 == 32:
            return "srv "
        if c1 == 112 and c2 == 101 and c3 == 99:
            return "spec"
    elif c0 == 99 and c1 == 109 and c2 == 110 and c3 == 32:
        return "cmn "
    elif c0 == 113 and c1 == 117 and c2 == 101 and c3 == 32:
        return "que "
    elif c0 == 114 and c1 == 101 and c2 == 115 and c3 == 32:
        return "res "
    return ""


def _ascii_number(line: str, k: i64) -> tuple[i64, i64]:
    """The ASCII digits from k on as a number, and where they end (k itself: no digit there,
    or more than 18: a native 64-bit integer holds 18 digits; the general path reads longer)."""
    n: i64 = len(line)
    start = k
    value: i64 = 0
    while k < n:
        c: i64 = ord(line[k])
        if c < 48 or c > 57:
            break
        value = value * 10 + c - 48
        k += 1
    if k - start > 18:
        return 0, start
    return value, k


def _parse_general(line: str) -> ParsedLine:
    """Any line: colours, a router prefix, JSONL, no timestamp or no prefix, unreadable bytes."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "\ufffd" in line or (not line.isprintable() and _CONTROL.search(line)):
        return ParsedLine(None, UNREADABLE)  # not UTF-8 (decoded with replacement), or binary
    if line.startswith("["):
        m = _ROUTER.match(line)
        if m:
            # a router's child: its own line, with its own clock and task ids
            parsed = _parse_line(line[m.end() :])
            parsed.child = int(line[1 : m.end() - 2])
            return parsed
    if line.startswith("{"):
        return _parse_jsonl(line)
    m = _PREFIX.match(line)
    if m is None:
        # No prefix: --no-log-prefix, or a continuation line of a multi-line message.
        if line.startswith(("\t", " ")) or not line:
            return ParsedLine(None, IGNORED, bare=True)
        parsed = parse_message(line, None, None)
        parsed.bare = True
        return parsed
    ts = None
    if m.group(1) is not None:
        ts = int(m.group(1)) * 60_000_000 + int(m.group(2)) * 1_000_000 + int(m.group(3)) * 1_000 + int(m.group(4))
    return parse_message(line[m.end() :], ts, m.group(5))


def _parse_jsonl(line: str) -> ParsedLine:
    try:
        obj = json.loads(line)
    except ValueError:
        return ParsedLine(None, UNRECOGNIZED)
    if not isinstance(obj, dict):
        return ParsedLine(None, UNRECOGNIZED)
    if obj.get("type") != "log":
        return ParsedLine(None, IGNORED)  # e.g. fit_memory_breakdown records
    msg = obj.get("msg")
    if not isinstance(msg, str):
        return ParsedLine(None, UNRECOGNIZED)
    t = obj.get("time")
    ts = t if isinstance(t, int) and t > 0 else None
    level = _JSONL_LEVELS.get(obj.get("level", ""), None)
    nl = msg.find("\n")
    if nl >= 0:
        msg = msg[:nl]
    return parse_message(msg, ts, level)
