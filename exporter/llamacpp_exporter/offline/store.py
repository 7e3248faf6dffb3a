"""analyze's records on disk: a month of logs is millions of requests, more than memory should
hold, so each record goes to an SQLite file as the pipeline makes it (Python's own sqlite3: no
server, no dependency) and the report reads them back one at a time, in the order it needs.

A record is stored pickled, as the tuple of its values (the file is a private temporary one that only this process writes and
reads, removed when analyze ends: the typed reading of an events line costs ten times more) with
the few columns the queries need beside it. `analyze --records FILE` writes the records out as
JSON lines in the events-file form (write_jsonl).
"""

from __future__ import annotations

import json
import operator
import os
import pickle
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import fields, replace
from typing import Any, cast

from ..export.report_types import Number
from ..records import ConversationProof, JoinSource, RequestRecord

BATCH = 2000  # records written per transaction
CACHE_KIB = 16 * 1024  # SQLite's page cache: the store's memory, whatever the number of records

_SCHEMA = """
CREATE TABLE records (
    seq INTEGER PRIMARY KEY,  -- the order the pipeline made them in
    model TEXT NOT NULL, slot INTEGER, task INTEGER, start_us INTEGER, epoch INTEGER,
    uncertain INTEGER NOT NULL,  -- conversation_source "uncertain": a later proof may name it
    from_events INTEGER NOT NULL,  -- an events-file record stands for the log's
    body BLOB NOT NULL
);
CREATE TABLE events (
    model TEXT NOT NULL, slot INTEGER, task INTEGER, start_us INTEGER, body BLOB NOT NULL,
    UNIQUE (model, slot, task, start_us)
);
CREATE TABLE proofs (
    model TEXT NOT NULL, slot INTEGER, task INTEGER, start_us INTEGER, conversation TEXT, source TEXT,
    UNIQUE (model, slot, task, start_us)
);
CREATE TABLE event_proofs (
    model TEXT NOT NULL, slot INTEGER, task INTEGER, start_us INTEGER, conversation TEXT, source TEXT,
    UNIQUE (model, slot, task, start_us)
);
"""


# a record as the tuple of its values in the order of its fields: pickled, rebuilt by position
# (a third of the time of pickling the frozen dataclass itself, whose state goes field by field)
_VALUES = operator.attrgetter(*(f.name for f in fields(RequestRecord)))


def _encode(rec: RequestRecord) -> bytes:
    return pickle.dumps(_VALUES(rec), protocol=pickle.HIGHEST_PROTOCOL)


def _decode(body: bytes) -> RequestRecord:
    return RequestRecord(*pickle.loads(body))  # noqa: S301 - our own scratch file, written by _encode


class RecordStore:
    """Records in an SQLite file, in the order they were added; at most BATCH of them in memory."""

    def __init__(self, directory: str | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="llamacpp-exporter-analyze-", dir=directory)
        self.path = os.path.join(self._dir.name, "records.sqlite")
        self.db = sqlite3.connect(self.path)
        # a scratch file: nothing to recover after a crash, so no journal and no fsync
        self.db.executescript(
            f"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-{CACHE_KIB}; "
            "PRAGMA temp_store=FILE;" + _SCHEMA
        )
        self._pending: list[tuple[Any, ...]] = []
        self._pending_events: list[tuple[Any, ...]] = []
        self._pending_proofs: list[tuple[str, tuple[Any, ...]]] = []
        self._events = 0
        self.count = 0
        self.matched_to_events = 0

    # ------------------------------------------------------------ writing
    def add(self, rec: RequestRecord) -> None:
        """A record of the log; an events-file record of the same task stands for it (it knows
        the LoRA state a bare log lacks), with this reading's run number."""
        from_events = 0
        if self._events:
            row = self.db.execute(
                "SELECT body FROM events WHERE model = ? AND slot = ? AND task = ? AND start_us IS ? "
                "ORDER BY rowid DESC LIMIT 1",
                rec.key,
            ).fetchone()
            if row is not None:
                rec = replace(_decode(row[0]), epoch=rec.epoch)
                from_events = 1
                self.matched_to_events += 1
        self._append(rec, from_events)

    def add_as_is(self, rec: RequestRecord) -> None:
        """A record that is the analysis's own (an events file read without a log)."""
        self._append(rec, 0)

    def _append(self, rec: RequestRecord, from_events: int) -> None:
        self._pending.append(
            (*rec.key, rec.epoch, int(rec.conversation_source == "uncertain"), from_events, _encode(rec))
        )
        self.count += 1
        if len(self._pending) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            with self.db:
                self.db.executemany(
                    "INSERT INTO records (model, slot, task, start_us, epoch, uncertain, from_events, body) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    self._pending,
                )
            self._pending.clear()

    def add_event(self, rec: RequestRecord) -> None:
        """An events-file record, for the log's records to be matched with (the last one of a
        task wins). Written in batches: apply_event_proofs ends them."""
        self._pending_events.append((*rec.key, _encode(rec)))
        self._events += 1
        if len(self._pending_events) >= BATCH:
            self._flush_side()

    def add_proof(self, proof: ConversationProof, events: bool = False) -> None:
        """A conversation proven after the record of its task went out: the log's (the
        pipeline's), or an events file's proof line (the last one of a task wins). Written in
        batches."""
        row = (*proof.key, proof.conversation, proof.source)
        self._pending_proofs.append(("event_proofs" if events else "proofs", row))
        if len(self._pending_proofs) >= BATCH:
            self._flush_side()

    def _flush_side(self) -> None:
        """The pending events records and proofs, in the order they came (the last one wins)."""
        with self.db:
            if self._pending_events:
                self.db.executemany(
                    "INSERT OR REPLACE INTO events (model, slot, task, start_us, body) VALUES (?, ?, ?, ?, ?)",
                    self._pending_events,
                )
            for table, row in self._pending_proofs:
                self.db.execute(
                    f"INSERT OR REPLACE INTO {table} (model, slot, task, start_us, conversation, source) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    row,
                )
        self._pending_events.clear()
        self._pending_proofs.clear()

    def apply_event_proofs(self, to_records: bool) -> None:
        """The events files' proofs applied to their records: those of the analysis (no log), or
        those that stand for the log's, before any log record meets them."""
        self._flush_side()
        if to_records:
            self._apply("event_proofs")
            return
        rows = self.db.execute(
            "SELECT e.rowid, e.body, p.conversation, p.source FROM events e JOIN event_proofs p "
            "ON e.model = p.model AND e.slot = p.slot AND e.task = p.task AND e.start_us IS p.start_us"
        ).fetchall()
        with self.db:
            for rowid, body, conv, source in rows:
                rec = _decode(body)
                if rec.conversation_source == "uncertain":
                    rec = replace(rec, conversation=conv, conversation_source=cast(JoinSource, source))
                    self.db.execute("UPDATE events SET body = ? WHERE rowid = ?", (_encode(rec), rowid))

    def apply_proofs(self) -> None:
        """The log's proofs applied to its records still uncertain (an events record that stands
        for one keeps its own state)."""
        self._apply("proofs")

    def _apply(self, table: str) -> None:
        self._flush()
        self._flush_side()
        last = -1
        while True:  # a batch at a time: the proven records may be many
            rows = self.db.execute(
                f"SELECT r.seq, r.body, p.conversation, p.source FROM records r JOIN {table} p "
                "ON r.model = p.model AND r.slot = p.slot AND r.task = p.task AND r.start_us IS p.start_us "
                "WHERE r.uncertain = 1 AND r.from_events = 0 AND r.seq > ? ORDER BY r.seq LIMIT ?",
                (last, BATCH),
            ).fetchall()
            if not rows:
                return
            updates = []
            for seq, body, conv, source in rows:
                rec = replace(_decode(body), conversation=conv, conversation_source=cast(JoinSource, source))
                updates.append((_encode(rec), seq))
            self._update(updates)
            last = rows[-1][0]

    def _update(self, updates: list[tuple[bytes, int]]) -> None:
        if updates:
            with self.db:
                self.db.executemany("UPDATE records SET body = ?, uncertain = 0 WHERE seq = ?", updates)
            updates.clear()

    # ------------------------------------------------------------ reading
    def records(self) -> Iterator[RequestRecord]:
        """In the order they were added."""
        self._flush()
        for (body,) in self.db.execute("SELECT body FROM records ORDER BY seq"):
            yield _decode(body)

    def by_start(self) -> Iterator[RequestRecord]:
        """By server run, then start (log time), then the order they were added: the order the
        report follows conversations in (a stable sort of the added order, as sorted() is)."""
        self._flush()
        # only the keys are sorted (SQLite's sorter holds them, not the records), each record
        # then read by its row id
        order = self.db.execute("SELECT seq FROM records ORDER BY epoch, COALESCE(start_us, 0), seq")
        lookup = self.db.cursor()
        for (seq,) in order:
            (body,) = lookup.execute("SELECT body FROM records WHERE seq = ?", (seq,)).fetchone()
            yield _decode(body)

    def close(self) -> None:
        self.db.close()
        self._dir.cleanup()


class StoredValues:
    """Values to take percentiles of, by group, in a scratch table of the store's file: sorted
    by SQLite (on disk when large), so their number costs no memory."""

    def __init__(self, store: RecordStore) -> None:
        # v without a declared type: an integer stays one, a float one (as in a list)
        self.db = store.db
        self.db.execute("CREATE TEMP TABLE IF NOT EXISTS vals (grp TEXT NOT NULL, v NOT NULL)")
        self.db.execute("DELETE FROM vals")
        self._pending: list[tuple[str, Number]] = []

    def add(self, group: str, value: Number) -> None:
        self._pending.append((group, value))
        if len(self._pending) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            with self.db:
                self.db.executemany("INSERT INTO vals (grp, v) VALUES (?, ?)", self._pending)
            self._pending.clear()

    def ranked(self, group: str, ranks: Iterable[int]) -> tuple[int, dict[int, Number]]:
        """How many values the group has, and the value at each rank (0-based, ascending)."""
        self._flush()
        (n,) = self.db.execute("SELECT COUNT(*) FROM vals WHERE grp = ?", (group,)).fetchone()
        wanted = {k for k in ranks if 0 <= k < n}
        out: dict[int, Number] = {}
        if wanted:
            last = max(wanted)
            for i, (v,) in enumerate(self.db.execute("SELECT v FROM vals WHERE grp = ? ORDER BY v", (group,))):
                if i in wanted:
                    out[i] = v
                if i >= last:
                    break
        return n, out


def write_jsonl(records: Iterable[RequestRecord], path: str) -> int:
    """The records as JSON lines, one per request, in the exporter's events-file form (so that
    `analyze --events FILE`, jq or DuckDB read them). Returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_event(), separators=(",", ":")) + "\n")
            n += 1
    return n
