"""Which conversation each task belongs to, and what a conversation's prefills cost the others.

A request with an X-Conversation-Id is named by the header join (join.py). One without is named
by cache lineage: a task that continues the state of an earlier task (the slot it kept, or the
RAM-cache entry it restored) continues that task's conversation. Here, too: which conversation
lost its RAM-cache entry to an eviction (a miss when it comes back is thrashing), and which
conversations' prefills overlapped another request's decoding.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from .. import parse as p
from ..records import JoinSource, RequestRecord
from .join import HEADER, NONE, UNCERTAIN, HeaderJoin, Holds
from .promptcache import CONTAINED_MIN_TOKENS, Selection
from .timeline import Overlap

TaskKey = tuple[int, int]  # (epoch, task)
Conversation = tuple[str | None, JoinSource]  # (pseudonym or None, source)

MAX_TASKS: Final = 4096
MAX_EVICTED: Final = 4096  # conversations whose RAM-cache entry was evicted, not yet back
# A record waits at most this long (log time after its end) for its conversation, then goes out
# "uncertain"; a conversation proven later still reaches the conversation series.
JOIN_WAIT_US: Final = 5_000_000
LATE_PROOF_US: Final = 300_000_000  # how long after its end a record's conversation may still be proven
EVICTION_WAIT_US: Final = 60_000_000  # how long an eviction waits to learn whose entry it was
MAX_LATE: Final = 1024
_CHECK_LATE = False  # tests: check each late proof's pass against a look at every waiting record
LATE_FAILURES: list[str] = []  # what those checks found (tests)
LATE_CHECKED: list[int] = []  # the records and costs waiting at each check (tests)
# A continuation keeps the whole state it continues (f_keep 1.000 in every recorded turn); two
# conversations that merely share a system prompt keep less of each other.
LINEAGE_MIN_F_KEEP: Final = 0.9
CONTINUATION_F_KEEP: Final = 0.9995  # printed as 1.000: the slot's whole state is a prefix of the prompt
MAX_ANSWERS: Final = 4096  # recent tasks whose answer's first moment is kept
# Past this many twins (the same prompt sent again and again: a benchmark, a health check) a held
# exchange limits no name: its owner could be any of them, and the union of their names costs each
# look as much as there are twins (9 at most in every recorded real run, 128 slots included)
MAX_TWINS: Final = 16


class LateIndex:
    """What a late proof looks at: the waiting records and costs whose conversation may have
    become known since the last pass, so that a pass costs what changed, not what waits.

    A waiting record's conversation becomes known when the join settles its task, when its task
    (settled, sent without an id) has a lineage parent whose conversation becomes known, when
    the parent is forgotten (it is a lineage root then), or when the verbosity changes; it gives
    up at its horizon. A cost is decided once its task is settled."""

    def __init__(self) -> None:
        self.seq: dict[TaskKey, int] = {}  # waiting record -> when it began to wait (its order)
        self.cost_seq: dict[TaskKey, int] = {}
        self._next = 0
        self.expiry: list[tuple[int, int, TaskKey]] = []  # (end, seq, key): a heap
        self.waiting: dict[TaskKey, list[TaskKey]] = {}  # task -> tasks whose lineage waits on it
        self.waits_on: dict[TaskKey, TaskKey] = {}  # the reverse, in the order they began
        self.touched: list[TaskKey] = []  # to look at in the next pass besides what the join settled
        self.look_at_all = False

    def began(self, key: TaskKey, end_us: int, pending: bool) -> None:
        """A record began to wait; ``pending``: the join has not settled its task yet."""
        self._next += 1
        self.seq[key] = self._next
        heapq.heappush(self.expiry, (end_us, self._next, key))
        if not pending:  # settled already: waiting on its lineage, looked at in the next pass
            self.touched.append(key)

    def cost_began(self, key: TaskKey, pending: bool) -> None:
        self._next += 1
        self.cost_seq[key] = self._next
        if not pending:
            self.touched.append(key)

    def forget_oldest(self) -> None:
        key, parent = next(iter(self.waits_on.items()))
        del self.waits_on[key]
        waiters = self.waiting.get(parent)
        if waiters is not None and key in waiters:
            waiters.remove(key)
            if not waiters:
                del self.waiting[parent]


class AnswerTimes:
    """When each recent task's answer existed, so that a prompt holding it was written later
    (tools/server/server-context.cpp of b11434 and b11549). A slot's state is its prompt and the
    tokens it sampled and fed back (server_slot::add_token_to_batch), all but the last sampled.
    A task that ended as it should prints its timings right before its final response
    (update_slots: print_timings, send_final_response, release): a client holds its whole state
    from that response, or from a stream before it only by sending a request before it knew
    the answer had ended. A task that did not end so (cancelled: its client went away) may have
    streamed its tokens: the first is sampled after the batch holding the prompt's last token,
    built right after the ``init sampler`` line. So a prompt that holds a task's state with at
    least one of its sampled tokens was written after the task's timings, or after that line.

    A request with the same prompt (a twin: as many prompt tokens, and an answer at least as
    long) may have produced the same tokens, as greedy decoding does: the bound is the earliest
    such line among the task's twins still kept, and each twin may be the one whose exchange the
    prompt holds. What is taken for granted: the client did not have the answer's tokens from
    elsewhere (a transcript of the same model replayed, or a twin older than the MAX_ANSWERS
    tasks kept)."""

    def __init__(self) -> None:
        self._sampled: OrderedDict[int, tuple[int, int]] = OrderedDict()  # task -> (prompt tokens, init sampler us)
        self._state: dict[int, int] = {}  # task -> its state's tokens when it ended
        self._by_prompt: dict[int, list[int]] = {}  # prompt tokens -> tasks, oldest first
        # task -> at most its ``init sampler`` time, never more than a later twin's (the log's
        # time may step back a little): no later twin's answer came before it
        self._low: dict[int, int] = {}

    def sampling(self, task: int, prompt_tokens: int, now_us: int) -> None:
        """The task's ``init sampler`` line: its first token is sampled after this."""
        if task in self._sampled:
            return
        self._sampled[task] = (prompt_tokens, now_us)
        same = self._by_prompt.setdefault(prompt_tokens, [])
        i = len(same)
        while i and self._low[same[i - 1]] > now_us:
            i -= 1
            self._low[same[i]] = now_us
        same.append(task)
        self._low[task] = now_us
        if len(self._sampled) > MAX_ANSWERS:
            old, (n, _) = self._sampled.popitem(last=False)
            self._state.pop(old, None)
            del self._low[old]
            same = self._by_prompt[n]
            same.remove(old)
            if not same:
                del self._by_prompt[n]

    def ended(self, task: int, state_tokens: int, answered_us: int | None) -> None:
        """The task released its slot; ``answered_us``: when its timings were printed, if it
        ended as it should (its final response followed)."""
        sampled = self._sampled.get(task)
        if sampled is not None:
            self._state[task] = state_tokens
            if answered_us is not None:
                self._sampled[task] = (sampled[0], max(sampled[1], answered_us))

    def holds(self, held: tuple[tuple[int, int], ...]) -> Holds | None:
        """What a prompt holding these states holds of answers: (task, tokens of its state the
        prompt holds at least). None where no answer's token is among them."""
        bound = None
        longest, owners, many = 0, set(), False
        states = self._state
        for task, tokens in held:
            sampled = self._sampled.get(task)
            state = states.get(task)
            if sampled is None or state is None or not sampled[0] < tokens <= state:
                continue
            same = self._by_prompt[sampled[0]]
            # the earliest answer among the twins (still running, or an answer as long): oldest
            # first, until no later twin can have answered earlier
            first = sampled[1]
            for t in same:
                if self._low[t] >= first:
                    break
                if states.get(t, tokens) >= tokens:
                    first = min(first, self._sampled[t][1])
            bound = first if bound is None else max(bound, first)
            # its twins, newest first, until there are too many to tell
            twins = []
            for t in reversed(same):
                if t == task or states.get(t, tokens) >= tokens:
                    twins.append(t)
                    if len(twins) > MAX_TWINS:
                        break
            if tokens > longest:
                longest, owners, many = tokens, set(twins), len(twins) > MAX_TWINS
            elif tokens == longest:
                owners.update(twins)
                many = many or len(twins) > MAX_TWINS
        if bound is None:
            return None
        return Holds(bound, () if many or len(owners) > MAX_TWINS else tuple(sorted(owners)))


class AttributionSink(Protocol):
    def conversation_cost(self, conversation: str, seconds: float) -> None: ...
    def join_cost(self, source: str, seconds: float) -> None: ...
    def conversation_arrival_dropped(self) -> None: ...
    def request_never_started(self) -> None: ...
    def conversation_proven(self, record: RequestRecord, conversation: str, source: JoinSource) -> None: ...


class Attribution:
    def __init__(
        self,
        sink: AttributionSink,
        pseudonymize: Callable[[str], str],
        now: Callable[[], int],
        all_idle: Callable[[], bool],
        model: str = "",
    ) -> None:
        self.sink = sink
        self.pseudonymize = pseudonymize
        # a router's children count tasks and epochs each on their own: a lineage root names its model
        self.lineage_scope = f"lineage:{model}:" if model else "lineage:"
        self.now = now  # server time of the line being read
        self.all_idle = all_idle  # no slot is running a task
        self.epoch = 0
        self.lineage_only = False  # below -lv 4 no request shows its id
        self._conv: OrderedDict[TaskKey, Conversation] = OrderedDict()  # once final
        self._lineage_parent: OrderedDict[TaskKey, TaskKey | None] = OrderedDict()
        # conversation -> server time its RAM-cache entry was evicted (pushed out to make room),
        # until its next request: a miss then is thrashing, not a full cache doing its job
        self._evicted: OrderedDict[str, tuple[int, TaskKey]] = OrderedDict()
        self._evicted_unresolved: list[tuple[TaskKey, int]] = []
        self.join = HeaderJoin()
        self.answers = AnswerTimes()
        self._dropped_seen = self._never_started_seen = 0
        # records that went out before their conversation was proven, and the decode time
        # their prefills overlapped on other slots since: waiting for a late proof
        self.late: OrderedDict[TaskKey, RequestRecord] = OrderedDict()
        self.late_costs: dict[TaskKey, float] = {}
        self.late_version = -1
        self._late_index = LateIndex()

    def server_changed(self, lineage_only: bool, n_slots: int | None) -> None:
        """What the server said of itself changed: its verbosity (below -lv 4 no request shows
        its id), or its slots."""
        if lineage_only != self.lineage_only:
            self._late_index.look_at_all = True  # every waiting record's conversation may change
        self.lineage_only = lineage_only
        self.join.n_slots = n_slots

    def new_epoch(self, epoch: int, n_slots: int | None) -> None:
        """A new server process: a new join, aligned at its start banner or an idle spell."""
        self.epoch = epoch
        self.join = HeaderJoin()
        self.join.n_slots = n_slots
        self.answers = AnswerTimes()
        self._dropped_seen = self._never_started_seen = 0
        self.late.clear()  # nothing of the old process can be proven any more
        for seconds in self.late_costs.values():
            self.sink.join_cost("uncertain", seconds)
        self.late_costs.clear()
        self._late_index = LateIndex()

    # ------------------------------------------------------------ the join's lines
    def arrival(self, ev: p.ConversationArrived) -> None:
        # pseudonymised at once: the raw header value is not kept
        name = self.pseudonymize("id:" + ev.raw_id) if ev.raw_id else ""
        self.join.arrival(name, self.now(), self.all_idle())
        self._count_dropped()

    def params_read(self, ev: p.RequestParamsRead) -> None:
        self.join.params_read(self.now())

    def all_slots_idle(self, ev: p.AllSlotsIdle) -> None:
        self.join.all_slots_idle(self.now())
        self._count_dropped()

    def slot_busy(self, ev: p.SlotBusy) -> None:
        self.join.slot_busy(ev.slot, self.now())

    def launch_failed(self, ev: p.TaskLaunchFailed) -> None:
        self.join.launched(ev.task, self.now(), self.all_idle())

    def launched(self, task: int, parent: TaskKey | None, holds: tuple[tuple[int, int], ...] = ()) -> None:
        """Called before the task occupies its slot (the join wants the idle state before).
        ``holds``: earlier tasks whose state its prompt holds, with how many of its tokens."""
        self.join.launched(task, self.now(), self.all_idle(), self.answers.holds(holds) if holds else None)
        self._count_dropped()
        self._lineage_parent[(self.epoch, task)] = parent
        if len(self._lineage_parent) > MAX_TASKS:
            # a task whose parent is forgotten is a lineage root from now on
            self._late_index.touched.append(self._lineage_parent.popitem(last=False)[0])

    def foreign_launched(self, task: int) -> None:
        """An embedding or rerank task launched: no arrival of the join is its request."""
        self.join.foreign_launch(task, self.now())

    def _count_dropped(self) -> None:
        while self._dropped_seen < self.join.dropped_arrivals:
            self._dropped_seen += 1
            self.sink.conversation_arrival_dropped()
        while self._never_started_seen < self.join.never_started:
            self._never_started_seen += 1
            self.sink.request_never_started()
        self.maybe_prove_late()

    def maybe_prove_late(self) -> None:
        if self.join.version != self.late_version:
            if self.late or self.late_costs:
                self._prove_late()
            else:
                self.late_version = self.join.version
                self.join.take_settled()  # nothing waits: what settled concerns no record
                self._late_index.touched.clear()

    def _prove_late(self) -> None:
        """The join settled something: hand on the conversations proven since their records
        went out. Only the records whose conversation can have changed are looked at (see
        LateIndex), in the order they began to wait, as a look at every one would."""
        self.late_version = self.join.version
        horizon = self.now() - LATE_PROOF_US
        index = self._late_index
        settled = [(self.epoch, t) for t in self.join.take_settled()]
        late, costs = self._late_candidates(settled, horizon)
        if _CHECK_LATE:
            LATE_CHECKED.append(len(self.late) + len(self.late_costs))
            self._check_late(late, costs, horizon)
        while late:
            seq, key = heapq.heappop(late)
            rec = self.late.get(key)
            if rec is None or index.seq.get(key) != seq:
                continue  # gone since, or a twin of this entry in the heap
            conv = self.conversation(*key)
            if conv is None:
                if (rec.end_us or 0) < horizon:
                    del self.late[key]
                    del index.seq[key]
                    self.join.give_up(key[1])
                    # a record after this one that its give-up decides is decided in this pass
                    for later in self._decided_by(key):
                        later_seq = index.seq.get(later)
                        if later_seq is not None and later_seq > seq:
                            heapq.heappush(late, (later_seq, later))
                continue
            del self.late[key]
            del index.seq[key]
            if conv[0] is not None:
                self.sink.conversation_proven(rec, conv[0], conv[1])
        # the costs: decided once their task is settled (the give-ups of this pass included)
        for key in (*costs, *((self.epoch, t) for t in self.join.settled)):
            if key in self.late_costs:
                costs.append(key)
        for _, key in sorted({(index.cost_seq[k], k) for k in costs if k in self.late_costs}):
            seconds = self.late_costs[key]
            conv = self.conversation(*key)
            if conv is not None:
                del self.late_costs[key]
                del index.cost_seq[key]
                if conv[0] is not None:
                    self.sink.conversation_cost(conv[0], seconds)
                self.sink.join_cost(conv[1], seconds)
            elif not self.join.pending(key[1]):
                del self.late_costs[key]
                del index.cost_seq[key]
                self.sink.join_cost("uncertain", seconds)

    def _late_candidates(self, settled: list[TaskKey], horizon: int) -> tuple[list[tuple[int, TaskKey]], list[TaskKey]]:
        """The waiting records (a heap by when each began to wait) and costs whose conversation
        may be known now or whose time is up: those whose task the join settled since the last
        pass, those waiting on the lineage of a task whose conversation is known now, those past
        the horizon; every one after a change of verbosity."""
        index = self._late_index
        touched = [*settled, *index.touched]
        index.touched = []
        if index.look_at_all:
            index.look_at_all = False
            touched.extend(self.late)
            touched.extend(self.late_costs)
        costs = [k for k in touched if k in self.late_costs]
        late: list[tuple[int, TaskKey]] = []
        for key in touched:
            if key in self.late or key in index.waiting:
                self._resolved_or_waits(key, late)
        expiry = index.expiry
        while expiry and expiry[0][0] < horizon:
            _, seq, key = heapq.heappop(expiry)
            if key in self.late and index.seq.get(key) == seq:
                late.append((seq, key))
        heapq.heapify(late)
        return late, costs

    def _resolved_or_waits(self, key: TaskKey, late: list[tuple[int, TaskKey]]) -> None:
        """A task whose conversation may be known now: if it is, it and every waiting record
        whose lineage waited on it are candidates; if not, it waits on its lineage parent."""
        index = self._late_index
        todo = [key]
        while todo:
            k = todo.pop()
            # kept as a look at every waiting record keeps it: for the records, not their lineage
            conv = self.conversation(*k, keep=k in self.late)
            if conv is None:
                self._wait_on_lineage(k)
                continue
            if k in self.late:
                late.append((index.seq[k], k))
            for waiter in index.waiting.pop(k, ()):
                index.waits_on.pop(waiter, None)
                todo.append(waiter)

    def _wait_on_lineage(self, key: TaskKey) -> None:
        """A task whose conversation is not known: if the join has settled it (no id: its
        conversation is its lineage parent's), it waits on that parent, up its chain to a task
        the join has not settled (which comes back through the join's settled tasks)."""
        index = self._late_index
        while key[0] == self.epoch and not self.join.pending(key[1]) and key not in index.waits_on:
            parent = self._lineage_parent.get(key)
            if parent is None:
                return
            index.waiting.setdefault(parent, []).append(key)
            index.waits_on[key] = parent
            if len(index.waits_on) > MAX_TASKS:
                index.forget_oldest()
            if self.conversation(*parent, keep=False) is not None:
                return
            key = parent

    def _decided_by(self, key: TaskKey) -> list[TaskKey]:
        """The waiting records whose conversation a give-up of ``key`` decides (its lineage
        descendants waiting on it), without taking them off the index."""
        out: list[TaskKey] = []
        todo = list(self._late_index.waiting.get(key, ()))
        while todo:
            k = todo.pop()
            if self.conversation(*k, keep=False) is None:  # asked only: the pass looks at it in turn
                continue
            out.append(k)
            todo.extend(self._late_index.waiting.get(k, ()))
        return out

    def _check_late(self, late: list[tuple[int, TaskKey]], costs: list[TaskKey], horizon: int) -> None:
        """For tests (_CHECK_LATE): every waiting record and cost left out of this pass is one a
        look at every one would leave waiting too."""
        chosen = {k for _, k in late}
        for key, rec in self.late.items():
            if key not in chosen and (self.conversation(*key) is not None or (rec.end_us or 0) < horizon):
                LATE_FAILURES.append(f"record {key} left out")
        for key in self.late_costs:
            if key not in costs and (self.conversation(*key) is not None or not self.join.pending(key[1])):
                LATE_FAILURES.append(f"cost {key} left out")

    # ------------------------------------------------------------ answers
    def conversation(self, epoch: int, task: int, now: bool = False, keep: bool = True) -> Conversation | None:
        """(pseudonym or None, source) of a task once the log proves it, else None; with
        ``now``, what the log proves so far ("uncertain" while the join still works on it,
        nothing stored: a later line may still prove it).

        header: the request's X-Conversation-Id. lineage: it sent none, so the conversation
        is that of the state it continued, if that state's conversation was itself found by
        lineage (an id-less request is never merged into a conversation that has an id), else
        a new one. uncertain: the log cannot tell which request the task was. ``keep``: a
        conversation found is kept (what the task's records say from then on); without it, only
        asked."""
        key = (epoch, task)
        known = self._conv.get(key)
        if known is not None:
            return known
        if self.lineage_only:
            res: tuple[str, str] | None = (NONE, "")
        else:
            res = self.join.result(task) if epoch == self.epoch else (UNCERTAIN, "")
            if res is None and not self.join.pending(task):
                res = (UNCERTAIN, "")  # a child task, or one the join never saw launch
        if res is None:
            return (None, "uncertain") if now else None
        source, name = res
        if source == HEADER:
            out: Conversation = (name, "header")
        elif source == UNCERTAIN:
            out = (None, "uncertain")
        else:
            conv = None
            parent = self._lineage_parent.get(key)
            if parent is not None:
                pc = self.conversation(*parent, keep=keep)
                if pc is None:
                    return (None, "uncertain") if now else None
                if pc[1] == "lineage":
                    conv = pc[0]
            out = (conv or self.pseudonymize(f"{self.lineage_scope}{epoch}:{task}"), "lineage")
        if keep:
            self._conv[key] = out
            if len(self._conv) > MAX_TASKS:
                self._conv.popitem(last=False)
        return out

    def conversation_now(self, epoch: int, task: int) -> Conversation:
        """The conversation as far as the log proves it now: the record waits no longer."""
        conv = self.conversation(epoch, task, now=True)
        assert conv is not None  # now always answers
        return conv

    def went_out(self, rec: RequestRecord, proven: bool) -> None:
        """A record went out; if its conversation was not proven yet, a late proof still
        counts its request in the conversation series."""
        key = (rec.epoch, rec.task)
        if proven or rec.epoch != self.epoch or rec.conversation_source != "uncertain":
            return
        conv = self.conversation(*key)
        if conv is not None:  # proven while the record waited for something else
            if conv[0] is not None:
                self.sink.conversation_proven(rec, conv[0], conv[1])
            return
        self.late[key] = rec
        self._late_index.began(key, rec.end_us or 0, self.join.pending(key[1]))
        if len(self.late) > MAX_LATE:
            self._late_index.seq.pop(self.late.popitem(last=False)[0], None)
        if len(self._late_index.expiry) > 4 * MAX_LATE:  # most of it gone since: only what waits
            self._late_index.expiry = [e for e in self._late_index.expiry if self._late_index.seq.get(e[2]) == e[1]]
            heapq.heapify(self._late_index.expiry)

    def entry_evicted(self, source: TaskKey) -> None:
        self._evicted_unresolved.append((source, self.now()))
        self._resolve_evicted()

    def _resolve_evicted(self) -> None:
        still = []
        for source, at in self._evicted_unresolved:
            conv = self.conversation(*source)
            if conv is None:
                if self.now() - at < EVICTION_WAIT_US:
                    still.append((source, at))
                continue
            if conv[0] is not None and conv[1] == "header":
                self._evicted[conv[0]] = (at, source)
                self._evicted.move_to_end(conv[0])
                if len(self._evicted) > MAX_EVICTED:
                    self._evicted.popitem(last=False)
        self._evicted_unresolved = still

    def came_back_after_eviction(self, conversation: str, start_us: int) -> TaskKey | None:
        """The conversation's RAM-cache entry was evicted before this request of it started:
        the task that computed the entry (consumed: one return per eviction), else None. Only
        a conversation id proves the two belong together; without one a miss stays
        no_cache_entry (evicted or never saved)."""
        if self._evicted_unresolved:
            self._resolve_evicted()
        evicted = self._evicted.get(conversation)
        if evicted is None or evicted[0] >= start_us:
            return None
        del self._evicted[conversation]
        return evicted[1]

    def charge(self, overlaps: Iterable[Overlap]) -> str | None:
        """Charge each prefilling conversation its share of another request's decoding, in the
        current epoch. Returns the conversation that overlapped most."""
        by_conv: dict[str, int] = {}
        for _, task, _, lo, hi in overlaps:
            known = self.conversation(self.epoch, task)
            if known is not None and known[0] is not None:
                by_conv[known[0]] = by_conv.get(known[0], 0) + hi - lo
                self.sink.join_cost(known[1], (hi - lo) / 1e6)
            elif known is None and len(self.late_costs) < MAX_LATE:  # charged once proven
                key = (self.epoch, task)
                if key not in self.late_costs:
                    self._late_index.cost_began(key, self.join.pending(task))
                self.late_costs[key] = self.late_costs.get(key, 0.0) + (hi - lo) / 1e6
            else:
                self.sink.join_cost("uncertain", (hi - lo) / 1e6)
        for conv, us in by_conv.items():
            self.sink.conversation_cost(conv, us / 1e6)
        return max(by_conv, key=lambda c: by_conv[c]) if by_conv else None


def lineage_parent(sel: Selection | None, epoch: int, last_task: int | None) -> TaskKey | None:
    """The state a task continues, for when its request turns out to carry no id: the slot's
    previous task (selected by LCP, f_keep >= LINEAGE_MIN_F_KEEP) or the task that computed the
    RAM-cache entry it restored. A pinned request (id_slot) is not a continuation by itself:
    the log does not say how much of the slot it kept."""
    if sel is None:
        return None
    if sel.method == "lcp" and (sel.f_keep or 0.0) >= LINEAGE_MIN_F_KEEP and last_task is not None:
        return (epoch, last_task)
    if sel.restored_source is not None and (sel.restored_f_keep or 0.0) >= LINEAGE_MIN_F_KEEP:
        return sel.restored_source
    return None


def held_states(sel: Selection | None, epoch: int, last_task: int | None) -> tuple[tuple[int, int], ...]:
    """Earlier tasks of this process whose state the prompt holds, with how many tokens of it at
    least: the slot's previous task when the slot was chosen for keeping all of it (f_keep
    printed 1.000: all but 0.05% of it), and the tasks behind RAM-cache entries the prompt holds
    whole (lcp = the entry's length)."""
    if sel is None:
        return ()
    held = [(src[1], n) for src, n in zip(sel.contained, sel.contained_tokens, strict=True) if src[0] == epoch]
    state = sel.slot_tokens_before or 0
    if sel.method == "lcp" and (sel.f_keep or 0.0) >= CONTINUATION_F_KEEP and last_task is not None:
        if state >= CONTAINED_MIN_TOKENS:
            held.append((last_task, state - int(state * (1 - CONTINUATION_F_KEEP)) - 1))
    return tuple(held)
