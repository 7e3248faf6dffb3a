"""A build that rewords what the diagnosis reads, live: a real llama-server runs the LoRA
workload, and exporters follow its log as it is written, one as it is, the others through a
command that rewords the RAM-cache narrative or the timing lines (INVENTED wording, as an
upstream change would write them). A real Prometheus with the shipped rules scrapes them all:
LlamaCppServerLogChanged fires for the reworded ones, by the function that wrote the lines, and
for nothing else; every reworded line is counted, none is ignored."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from promql import RULE_FILES, Prometheus
from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files, wait_for
from support import samples
from workload import seed_scenario

pytestmark = pytest.mark.real_server

# sed expressions, the lines they change in the server's log, and the functions that wrote them
REWORDED = {
    "narrative": (
        [
            "s/ - found better prompt with/ - restoring prompt with/",
            "s/updating prompt cache/refreshing the prompt cache/",
        ],
        r" - found better prompt with|updating prompt cache",
        {("srv", "load"), ("srv", "get_availabl")},
    ),
    "timings": (
        ["s/prompt eval time =/prompt processing time =/"],
        r"prompt eval time =",
        {("slot", "print_timing")},
    ),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("log-changed")
    model, lora = model_files()
    server = LlamaServer(llama_server_binary(), model, lora, work / "server", n_parallel=1, ctx=4096, cache_ram=256)
    server.start()
    base = ["--llama.url", server.url, "--llama.poll-interval", "0.5"]
    exporters = {"as is": ExporterProcess([*base, "--llama.log-path", str(server.log_path)], work / "as-is").start()}
    for name, (seds, _, _) in REWORDED.items():
        cmd = f"tail -n +1 -F {shlex.quote(str(server.log_path))} | sed -u " + " ".join(f"-e '{e}'" for e in seds)
        exporters[name] = ExporterProcess([*base, "--llama.log-command", cmd], work / name).start()
    prom = Prometheus(
        work / "prometheus",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in RULE_FILES],
            "scrape_configs": [
                {
                    "job_name": "llamacpp",
                    "static_configs": [{"targets": [f"127.0.0.1:{e.port}" for e in exporters.values()]}],
                }
            ],
        },
    )
    try:
        prom.wait_scraped(len(exporters))
        sent = seed_scenario(server.url, seed=7) + seed_scenario(server.url, seed=8)
        wanted = len(sent)

        def recorded(e: ExporterProcess) -> float:
            return sum(samples(httpx.get(e.url + "/metrics", timeout=10).text, "llamacpp_requests_total").values())

        wait_for(lambda: recorded(exporters["as is"]) >= wanted, "the exporter holding every request", timeout=60)
        yield {"server": server, "exporters": exporters, "prom": prom}
    finally:
        prom.stop()
        for e in exporters.values():
            e.stop()
        server.stop()


def unrecognized(e: ExporterProcess) -> dict[tuple[str, str], float]:
    got = samples(httpx.get(e.url + "/metrics", timeout=10).text, "llamacpp_exporter_log_lines_unrecognized_total")
    return {(dict(k).get("logger", ""), dict(k).get("function", "")): v for k, v in got.items()}


def firing(prom: Prometheus) -> dict[str, set[tuple[str, str]]]:
    res = prom.query('ALERTS{alertname="LlamaCppServerLogChanged", alertstate="firing"}')["data"]["result"]
    out: dict[str, set[tuple[str, str]]] = {}
    for r in res:
        m = r["metric"]
        out.setdefault(m["instance"], set()).add((m["logger"], m["function"]))
    return out


def test_the_log_as_written_has_no_unrecognized_line_and_fires_nothing(run: dict[str, Any]) -> None:
    e = run["exporters"]["as is"]
    assert unrecognized(e) == {}
    assert f"127.0.0.1:{e.port}" not in firing(run["prom"])


@pytest.mark.parametrize("what", sorted(REWORDED))
def test_reworded_lines_are_counted_by_function_and_page(run: dict[str, Any], what: str) -> None:
    _, pattern, functions = REWORDED[what]
    e, prom = run["exporters"][what], run["prom"]
    changed = sum(
        1 for line in run["server"].log_path.read_text(errors="replace").splitlines() if re.search(pattern, line)
    )
    assert changed > 0
    wait_for(lambda: sum(unrecognized(e).values()) >= changed, f"{changed} unrecognized lines", timeout=30)
    by_function = unrecognized(e)
    print(f"{what} reworded, live: {changed} lines changed in the server's log, unrecognized {by_function}")
    assert set(by_function) == functions and sum(by_function.values()) == changed
    instance = f"127.0.0.1:{e.port}"
    wait_for(lambda: firing(prom).get(instance) == functions, f"LlamaCppServerLogChanged for {functions}", timeout=60)
