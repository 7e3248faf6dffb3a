"""What a finished request's facts mean: pure functions, no state.

restore result (what became of a restored RAM-cache entry), outcome (hit, partial, miss for
long prompts), miss cause, and the prompt tokens offered but computed again. The assembler
gathers the facts; the table in tests/test_classify.py lists every case.
"""

from __future__ import annotations

from ..records import MissCause, Outcome, RestoreResult


def restore_result(
    *,
    lora_cache_cleared: bool,
    forced_reprocess: bool,
    reused_tokens: int | None,
    reuse_known: bool,
    lora_config: str | None,
    entry_lora_config: str | None,
) -> tuple[RestoreResult, bool]:
    """(result, lora_mismatch_reuse) for a request whose slot selection restored an entry.

    Cleared for a LoRA change: wrongful when the entry was computed under the request's own
    effective configuration (the server compared with the previous request on the slot),
    correct under another, unknown when /slots did not show one of the two. Reprocessed: kept
    but computed again from scratch. Kept under another configuration: KV of another adapter
    reused (mismatch)."""
    same = None if lora_config is None or entry_lora_config is None else lora_config == entry_lora_config
    if lora_cache_cleared:
        if same is None:
            return "discarded_lora_unknown", False
        return ("discarded_lora_wrongful" if same else "discarded_lora_correct"), False
    if forced_reprocess or (reuse_known and reused_tokens == 0):
        return "reprocessed", False
    return "kept", same is False


def offered_tokens(offered_by_entry: int | None, slot_f_sim: float | None, prompt_tokens: int | None) -> int | None:
    """Prompt tokens the restored entry (its LCP) or the slot (f_sim of the prompt) held."""
    offered = offered_by_entry
    if slot_f_sim is not None and prompt_tokens is not None:
        offered = max(offered or 0, round(slot_f_sim * prompt_tokens))
    return offered


def outcome(
    prompt_tokens: int, reused_tokens: int, min_prompt_tokens: int, hit_ratio: float, miss_ratio: float
) -> Outcome | None:
    """hit / partial / miss for prompts of at least min_prompt_tokens, else None."""
    if prompt_tokens < min_prompt_tokens or prompt_tokens <= 0:
        return None
    ratio = reused_tokens / prompt_tokens
    return "hit" if ratio >= hit_ratio else "miss" if ratio < miss_ratio else "partial"


def is_miss(prompt_tokens: int, reused_tokens: int, miss_ratio: float) -> bool:
    """Reused less than miss_ratio of a prompt of more than one token (any length)."""
    return prompt_tokens > 1 and reused_tokens / prompt_tokens < miss_ratio


def miss_cause(
    *,
    restore_result: RestoreResult | None,
    lora_cache_cleared: bool,
    forced_reprocess: bool,
    offered_enough: bool,
    ram_consulted: bool,
    ram_restored: bool,
    path: str | None,
    conversation_evicted: bool = False,
) -> MissCause:
    """Why a miss missed. offered_enough: the slot or a restored entry held at least
    miss_ratio of the prompt; a reprocess forced on a prefix that was a miss anyway (a chat
    template's first tokens on an SWA model) is not the cause. conversation_evicted: the
    request's conversation (by its id) had a RAM-cache entry that was evicted before it came
    (the cache mirror knows): a lookup that then finds nothing is an eviction's miss."""
    if restore_result is not None and restore_result.startswith("discarded_lora"):
        return "lora_discard"
    if lora_cache_cleared:
        return "lora_discard"
    if forced_reprocess and offered_enough:
        return "forced_reprocess"
    if ram_consulted and not ram_restored:
        return "evicted" if conversation_evicted else "no_cache_entry"
    if path == "slot":
        return "slot_prefix_mismatch"
    return "unknown"


def small_task_takeover(prompt_tokens: int, slot_tokens_before: int | None, small: int, big: int) -> bool:
    """A small prompt placed on a slot that held a big conversation (e.g. a health probe)."""
    return prompt_tokens < small and (slot_tokens_before or 0) >= big
