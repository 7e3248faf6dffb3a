"""Demo: a real local llama-server (-lv 4, 2 slots, a LoRA adapter), the exporter following
its log, a short concurrent chat workload (half the conversations with the adapter), then
what the exporter reports: one line per request and the key metrics.

Run it with tests/demo.sh (which does the set-up). --keep leaves both running.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files
from support import wait_records
from workload import chat_workload

KEY_METRICS = (
    "llamacpp_requests_total",
    "llamacpp_prompt_cache_restores_total",
    "llamacpp_prompt_cache_outcomes_total",
    "llamacpp_prompt_cache_lora_mismatch_reuse_total",
    "llamacpp_prompt_cache_entries",
    "llamacpp_prompt_cache_bytes",
    "llamacpp_exporter_cache_diagnostics_available",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keep", action="store_true", help="keep llama-server and the exporter running afterwards")
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llamacpp-exporter-demo-"))
    binary = llama_server_binary()
    model, lora = model_files()
    srv = LlamaServer(binary, model, lora, work).start()
    exp = ExporterProcess(
        [
            "--llama.url",
            srv.url,
            "--llama.log-path",
            str(srv.log_path),
            "--llama.log-from-start",
            "--events.path",
            str(work / "events.jsonl"),
        ],
        work,
    ).start()
    print(f"llama-server {srv.url} (log {srv.log_path}), exporter {exp.url}/metrics")
    try:
        print("running 6 concurrent conversations, even ones with the LoRA adapter ...")
        truths = chat_workload(srv.url, turns=args.turns)
        events = work / "events.jsonl"
        recs = wait_records(events, len(truths), 30)
        print(
            f"\n{'task':>5} {'slot':>4} {'path':>6} {'lora':>7} {'prompt':>6} {'reused':>6} "
            f"{'restore':>24} {'prefill s':>9} {'ms/token':>8} {'overlap s':>9}"
        )
        for r in recs:
            tpot = r["time_per_output_token_seconds"]
            print(
                f"{r['task']:>5} {r['slot']:>4} {r['path']:>6} {r['lora']:>7} {r['prompt_tokens']!s:>6} "
                f"{r['reused_tokens']!s:>6} {r['restore_result'] or '-':>24} {r['prefill_seconds'] or 0:>9.3f} "
                f"{(tpot or 0) * 1000:>8.1f} {r['overlap_seconds']:>9.3f}"
            )
        print("\nkey metrics (non-zero):")
        for line in exp.metrics_text().splitlines():
            if line.startswith(KEY_METRICS) and not line.endswith(" 0.0"):
                print("  " + line)
        if args.keep:
            print(f"\nrunning; press Ctrl-C to stop. Work directory: {work}")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        exp.stop()
        srv.stop()


if __name__ == "__main__":
    main()
