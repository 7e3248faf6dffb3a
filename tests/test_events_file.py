"""The events file under a full disk: a record is written whole or not at all, and counted
when it is not. The limit is a real one, the kernel's file-size limit (RLIMIT_FSIZE, EFBIG on
the write that crosses it), set in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration


def test_a_write_that_fails_part_way_leaves_no_partial_line(tmp_path):
    path = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        from prometheus_client import CollectorRegistry
        from llamacpp_exporter.pipeline import EventsFile
        from llamacpp_exporter.records import RequestRecord
        reg = CollectorRegistry()
        ev = EventsFile({str(path)!r}, reg)
        for i in range(100):
            ev.write(RequestRecord(epoch=0, slot=0, task=i, prompt_tokens=i))
        ev.close()
        print(reg.get_sample_value("llamacpp_exporter_events_written_total"),
              reg.get_sample_value("llamacpp_exporter_events_write_errors_total"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written, errors = map(float, out.stdout.split())
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode().splitlines()
    assert [json.loads(line)["task"] for line in lines] == list(range(len(lines)))  # every line whole
    assert len(lines) == written and written + errors == 100 and errors > 0
