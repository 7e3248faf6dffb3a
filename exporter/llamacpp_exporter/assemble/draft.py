"""A task's working state: what the log and /slots have said of it so far, until the finisher
turns it into a RequestRecord (finish.py). Kept apart from records.py so that it is compiled
with the assembler (setup.py): it is read and written at almost every line."""

from __future__ import annotations

from dataclasses import dataclass

from ..records import JoinSource, ReuseSource, SelectionPath, SlotState, TaskKind


@dataclass(slots=True)
class TaskDraft:
    """What the log has said so far about one task (the assembler's working state). The
    finisher turns it into a RequestRecord: these facts, plus what is derived from them."""

    epoch: int
    slot: int
    task: int
    start_us: int
    is_child: bool = False  # a child task of an n > 1 request
    kind: TaskKind = "completion"
    choices: int = 1
    ram_unused: bool = False  # selected by LRU on a server whose RAM cache is in use, without consulting it
    path: SelectionPath = "unknown"
    prompt_tokens: int | None = None
    reused_tokens: int | None = None
    reuse_source: ReuseSource | None = None
    slot_tokens_before: int | None = None
    state_source_task: int | None = None
    compared_entries: tuple[tuple[int, int], ...] = ()
    ram_consulted: bool = False
    ram_candidates: int = 0
    ram_best_f_sim: float | None = None
    ram_restored: bool = False
    restored_tokens: int | None = None
    entry_source: tuple[int, int] | None = None  # (epoch, task) that computed the restored entry
    offered_tokens: int | None = None  # the restored entry's common prefix with the prompt
    offered_f_sim: float | None = None  # the slot's similarity to the prompt (LCP selection)
    lora_cache_cleared: bool = False
    forced_reprocess: bool = False
    lora_request: tuple[tuple[int, float], ...] | None = None  # from /slots
    prefill_seconds: float | None = None
    prefill_tokens: int | None = None
    generated_tokens: int | None = None
    decode_seconds: float | None = None
    time_per_output_token_seconds: float | None = None
    decode_start_us: int | None = None
    decode_end_us: int | None = None
    cancelled: bool = False
    failed: bool = False
    truncated: bool = False
    context_shifts: int = 0
    context_shift_discarded_tokens: int = 0
    draft_tokens_generated: int | None = None
    draft_tokens_accepted: int | None = None
    end_us: int | None = None
    released_seq: int | None = None  # /slots snapshots seen when it was released
    # its conversation as the record will say it: fixed at the first line that proves it (or
    # its overlaps' conversations), or once it waited JOIN_WAIT_US; then the same live and in
    # a replay, whenever /slots lets the record go out
    conversation: tuple[str | None, JoinSource | None] | None = None  # (None, None): outside the join
    conversation_proven: bool = False
    # what its conversation waits for, as last seen (finish.py): (task, slot, the slot's
    # timeline version then) of each task not proven yet, the slot -1 for its own task
    waiting_on: tuple[tuple[int, int, int], ...] | None = None

    @property
    def outside_join(self) -> bool:
        """No request of its own to join: a child task of an n > 1 request, or an embedding
        task (its request logs no conv_id line)."""
        return self.is_child or self.kind != "completion"

    def seen_in_slots(self, s: SlotState) -> None:
        """The task as /slots shows it while it runs: its LoRA list, and (below -lv 4) the
        prompt tokens it reused."""
        if s.lora is not None:
            self.lora_request = s.lora
        # n_prompt_tokens_cache is set when the prompt starts; trust it once the
        # slot has processed prompt tokens or decoded, else it may still be stale.
        if (
            s.is_processing
            and self.reuse_source is None
            and s.n_prompt_tokens_cache is not None
            and ((s.n_prompt_tokens_processed or 0) > 0 or (s.n_decoded or 0) > 0)
        ):
            self.reused_tokens = s.n_prompt_tokens_cache
            self.reuse_source = "slots"
