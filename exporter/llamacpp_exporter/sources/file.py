"""A log file followed like ``tail -F``: across rotations, truncations and holes, its read
position kept across restarts, woken by inotify where the system has it."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import select
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, cast

from .lines import LineSplitter, SourceStats

log = logging.getLogger(__name__)

HEAD_BYTES = 64  # compared on every idle poll to spot a file rewritten in place


@dataclass(frozen=True)
class LogPosition:
    """Where the exporter is in the log: the file (path and identity), the offset of the end of
    the last complete line, and a digest of the bytes before it (to tell the same file from a
    rewrite). A digest, not the bytes: at -lv 5 they could be prompt text, and this is saved."""

    path: str
    dev: int
    ino: int
    offset: int
    sig: str  # sha256 of the (up to HEAD_BYTES) bytes before offset

    def to_json(self) -> str:
        d = {"path": self.path, "dev": self.dev, "ino": self.ino, "offset": self.offset, "sig": self.sig}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> LogPosition:
        d = json.loads(text)
        return cls(str(d["path"]), int(d["dev"]), int(d["ino"]), int(d["offset"]), str(d["sig"]))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_position(path: str) -> LogPosition | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return LogPosition.from_json(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the saved log position %s: %s", path, e)
        return None


def save_position(path: str, pos: LogPosition) -> None:
    """Atomically: a crash leaves the old position or the new one, never half of one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(pos.to_json())
    os.replace(tmp, path)


CATCH_UP_BYTES = 64 << 20  # at most this much of the file is read again at start
_BANNER = b"llama_server: initializing ..."


def _banner_at(fh: IO[bytes], offset: int) -> bool:
    return _BANNER in os.pread(fh.fileno(), 256, offset).split(b"\n", 1)[0]


def run_start(fh: IO[bytes], end: int, limit: int) -> int:
    """Where the server run that was being written at ``end`` began: the line of its last start
    banner before ``end``, or, if none lies within ``limit`` bytes, the first line in them. A
    router's children print banners of their own, prefixed ``[port] ``: the run is the router's."""
    fd = fh.fileno()
    lowest = max(0, end - limit)
    hi = end
    stop = end  # banners must lie wholly before this
    while hi > lowest:
        lo = max(lowest, hi - (1 << 20))
        chunk = os.pread(fd, hi - lo + len(_BANNER), lo)  # overlap: a banner across two chunks
        at = chunk.rfind(_BANNER, 0, stop - lo)
        if at < 0:
            hi = stop = lo
            continue
        line = chunk.rfind(b"\n", 0, at)
        start = lo + line + 1 if line >= 0 else _line_start(fd, lo + at)
        if os.pread(fd, 1, start) != b"[":
            return start
        stop = start  # a child's banner: look further back, within this chunk first
        if start <= lo:
            hi = lo
    if lowest == 0:
        return 0
    nl = os.pread(fd, min(1 << 20, end - lowest), lowest).find(b"\n")
    return end if nl < 0 else lowest + nl + 1


def _not_a_file(path: str) -> str | None:
    """Why ``path`` cannot be followed as a log file, or None (a regular file, or missing)."""
    st = os.stat(path)  # FileNotFoundError: waited for
    if stat.S_ISDIR(st.st_mode):
        return "it is a directory: give the log file itself"
    if stat.S_ISFIFO(st.st_mode):
        return "it is a FIFO, which cannot be followed by name: pipe it in (--llama.log-path - ) instead"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    return None


def rotated_names(path: str) -> list[str]:
    """Files next to ``path`` named as rotations of it (X.1, X.1.gz, X-20261201, X_old), the
    most recently changed first."""
    directory, base = os.path.split(os.path.abspath(path))
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if name == base or not name.startswith(base) or name[len(base) : len(base) + 1] not in (".", "-", "_"):
            continue
        full = os.path.join(directory, name)
        try:
            st = os.stat(full)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((st.st_mtime, full))
    return [full for _, full in sorted(out, reverse=True)]


def _open_at(name: str, r: LogPosition) -> tuple[IO[bytes], int] | None:
    """The saved file under another name, positioned where the server run being read began
    (at most CATCH_UP_BYTES before the saved offset), or None if this is not it: the same
    file (renamed) or a copy of it (copytruncate, compressed or not), told by the digest of
    the bytes before the saved offset."""
    n = min(r.offset, HEAD_BYTES)
    if name.endswith(".gz"):
        start = _gz_run_start(name, r.offset, r.sig)
        if start is None:
            return None
        gz = cast(IO[bytes], gzip.open(name, "rb"))
        _skip(gz, start)
        return gz, start
    fh = open(name, "rb")
    st = os.fstat(fh.fileno())
    if st.st_size < r.offset or _digest(os.pread(fh.fileno(), n, r.offset - n) if n else b"") != r.sig:
        fh.close()
        return None
    start = run_start(fh, r.offset, CATCH_UP_BYTES)
    fh.seek(start)
    return fh, start


def _skip(stream: IO[bytes], n: int) -> None:
    while n > 0:
        data = stream.read(min(n, 1 << 20))
        if not data:
            raise EOFError("shorter than the saved position")
        n -= len(data)


def _gz_run_start(name: str, offset: int, sig: str) -> int | None:
    """Read a compressed file up to ``offset``: None unless the bytes before it are the saved
    ones; else where its last start banner before offset (not a router child's) begins, or the
    first line within CATCH_UP_BYTES of offset."""
    n = min(offset, HEAD_BYTES)
    last_banner, window_start, at, carry = -1, None, 0, b""
    with gzip.open(name, "rb") as gz:
        while at < offset:
            data = gz.read(min(1 << 20, offset - at))
            if not data:
                return None  # shorter than the saved position: not the saved file
            buf, base = carry + data, at - len(carry)
            i = buf.find(_BANNER)
            while i >= 0:
                line = buf.rfind(b"\n", 0, i) + 1
                if buf[line : line + 1] != b"[":
                    last_banner = base + line
                i = buf.find(_BANNER, i + 1)
            if window_start is None and at + len(data) > offset - CATCH_UP_BYTES:
                lo = offset - CATCH_UP_BYTES - base
                if lo <= 0:
                    window_start = 0
                else:
                    nl = buf.find(b"\n", lo)
                    window_start = base + nl + 1 if nl >= 0 else None
            at += len(data)
            carry = buf[-max(len(_BANNER) + 256, HEAD_BYTES) :]
    if _digest(carry[len(carry) - n :] if n else b"") != sig:
        return None
    if last_banner >= 0 and offset - last_banner <= CATCH_UP_BYTES:
        return last_banner
    return window_start if window_start is not None else offset


def _line_start(fd: int, offset: int) -> int:
    while offset > 0:
        lo = max(0, offset - 4096)
        nl = os.pread(fd, offset - lo, lo).rfind(b"\n")
        if nl >= 0:
            return lo + nl + 1
        offset = lo
    return 0


class FileFollower:
    """Follows a file by name: rotation (rename + new file), copytruncate, truncation in
    place (llama-server's --log-file at every restart), a file that does not exist yet,
    and partial last lines. Polling, like ``tail -F`` on filesystems without inotify."""

    def __init__(
        self,
        path: str,
        splitter: LineSplitter,
        stats: SourceStats,
        from_start: bool = False,
        chunk_bytes: int = 1 << 20,
        resume: LogPosition | None = None,
        on_position: Callable[[LogPosition], None] | None = None,
        on_catch_up: Callable[[bool], None] | None = None,
        catch_up_bytes: int = CATCH_UP_BYTES,
    ) -> None:
        self.path = path
        self.on_catch_up = on_catch_up  # True: the lines that follow are read again, False: caught up
        self.catch_up_bytes = catch_up_bytes
        self.live_from: int | None = None  # catching up until this offset
        self.resume = resume
        self.on_position = on_position
        self.splitter = splitter
        self.stats = stats
        self.from_start = from_start
        self.chunk = chunk_bytes
        self.fh: IO[bytes] | None = None
        self.ino: tuple[int, int] | None = None
        self.pos = 0
        self.head = b""
        self.tail_sig = b""  # the last bytes read, ending at pos: a rewrite past pos changes them
        self._first_open = True
        self._missing_logged = False
        self.open_error: str | None = None  # why the log cannot be opened now (for /-/ready)

    def _open(self) -> bool:
        try:
            kind = _not_a_file(self.path)
            if kind is not None:
                self._cannot_open(kind)
                return False
            fh = open(self.path, "rb")
        except FileNotFoundError:
            if not self._missing_logged:
                log.warning("log file %s does not exist yet; waiting for it", self.path)
                self._missing_logged = True
            self._first_open = False  # a file created later is read from its start
            return False
        except OSError as e:
            self._cannot_open(e.strerror or str(e))
            return False
        self.open_error = None
        st = os.fstat(fh.fileno())
        self.fh = fh
        self.ino = (st.st_dev, st.st_ino)
        how = "its start"
        if self._first_open and self.resume is not None and self.resume.path == self.path:
            self.pos, how = self._resumed(fh, st)
            if self.pos == 0 and self.resume.offset > 0:
                old = self._rest_of_rotated(self.resume)
                if old is not None:
                    how = f"its start, after the rest of {old} (rotated while the exporter was down)"
        elif self._first_open and not self.from_start:
            self.pos = fh.seek(0, os.SEEK_END)
            how = "its end (no saved position: lines written while the exporter was down are not read)"
        else:
            self.pos = 0
        if self._first_open and self.pos > 0 and self.on_catch_up is not None:
            try:
                start = run_start(fh, self.pos, self.catch_up_bytes)
                banner = start == 0 or _banner_at(fh, start)
            except OSError as e:  # read on from where we are: the state is then partial, as before
                self.stats.read_error()
                log.warning("cannot read %s again to catch up: %s", self.path, e.strerror)
                start, banner = self.pos, False
            if start < self.pos:
                log.info(
                    "reading %s from offset %d to %d again first (the server run's %s), so that what the "
                    "exporter knows of its slots, cache and requests is what a replay of the run knows; "
                    "requests that ended before are not counted again",
                    self.path,
                    start,
                    self.pos,
                    "start" if banner else f"last {self.catch_up_bytes >> 20} MiB",
                )
                self.live_from, self.pos = self.pos, start
                self.on_catch_up(True)
        fh.seek(self.pos)
        self._first_open = False
        self._missing_logged = False
        self.head = os.pread(fh.fileno(), HEAD_BYTES, 0)
        self.tail_sig = os.pread(fh.fileno(), min(self.pos, HEAD_BYTES), self.pos - min(self.pos, HEAD_BYTES))
        log.info("following %s from offset %d: %s", self.path, self.pos, how)
        return True

    def _resumed(self, fh: IO[bytes], st: os.stat_result) -> tuple[int, str]:
        r = self.resume
        assert r is not None
        if (st.st_dev, st.st_ino) != (r.dev, r.ino):
            return 0, "its start (the file was replaced while the exporter was down: all of it is new)"
        n = min(r.offset, HEAD_BYTES)
        same = st.st_size >= r.offset and _digest(os.pread(fh.fileno(), n, r.offset - n) if n else b"") == r.sig
        if same:
            return r.offset, "the saved position (nothing read twice, nothing skipped)"
        return 0, "its start (the file was truncated while the exporter was down)"

    def _cannot_open(self, why: str) -> None:
        """Said once per reason, counted each time; /-/ready shows it while it lasts."""
        self.stats.read_error()
        if why != self.open_error:
            log.warning("cannot open log file %s: %s", self.path, why)
        self.open_error = why

    def _rest_of_rotated(self, r: LogPosition) -> str | None:
        """The file was rotated while the exporter was stopped: find the saved file among the
        rotated names (X.1, X-20261201, compressed since or not) and read it from the saved
        position to its end first, so that no request of it is lost. None when not found."""
        for name in rotated_names(self.path):
            try:
                found = _open_at(name, r)
            except (OSError, EOFError, gzip.BadGzipFile, ValueError) as e:
                log.warning("cannot read rotated log %s: %s", name, getattr(e, "strerror", None) or e)
                continue
            if found is None:
                continue
            stream, start = found
            with stream:
                self._read_rest(name, stream, start, r.offset)
            return name
        log.warning(
            "log file %s was replaced while the exporter was down and the saved one is not among its rotated "
            "names: requests written to it after offset %d are not counted",
            self.path,
            r.offset,
        )
        return None

    def _read_rest(self, name: str, stream: IO[bytes], start: int, offset: int) -> None:
        """From ``start`` (the run's banner) to ``offset`` again to catch up, then the rest."""
        catching = start < offset and self.on_catch_up is not None
        if catching:
            assert self.on_catch_up is not None
            self.on_catch_up(True)
        at = start
        while True:
            want = self.chunk if not catching else min(self.chunk, offset - at)
            try:
                data = stream.read(want)
            except (OSError, EOFError, gzip.BadGzipFile) as e:  # a cut .gz: what it holds is read
                self.stats.read_error()
                log.warning("error reading rotated log %s: %s", name, e)
                data = b""
            if not data:
                break
            at += len(data)
            self.splitter.feed(data)
            if catching and at >= offset:
                catching = False
                assert self.on_catch_up is not None
                self.on_catch_up(False)
        if catching:
            assert self.on_catch_up is not None
            self.on_catch_up(False)
        self.splitter.flush()  # the rotated file ends there: its last line is whole
        log.info("read the rest of rotated log %s (offset %d to %d)", name, offset, at)

    def position(self) -> LogPosition | None:
        """After the last complete line handed on (a partial last line is read again)."""
        if self.fh is None or self.ino is None:
            return None
        offset = self.pos - len(self.splitter.buf)
        n = min(offset, HEAD_BYTES)
        sig = _digest(os.pread(self.fh.fileno(), n, offset - n) if n else b"")
        return LogPosition(self.path, self.ino[0], self.ino[1], offset, sig)

    def poll_once(self) -> int:
        """Read what is new. Returns the number of bytes read."""
        if self.fh is None and not self._open():
            return 0
        assert self.fh is not None
        self._check_truncated()
        n = self._read_available()
        if n:
            if self.on_position is not None:
                pos = self.position()
                if pos is not None:
                    self.on_position(pos)
            return n
        try:
            pst = os.stat(self.path)
        except FileNotFoundError:
            return 0  # renamed away, new file not there yet: keep the old one open
        except OSError:
            return 0
        if (pst.st_dev, pst.st_ino) != self.ino:
            self._read_available()  # whatever was appended to the old file before the rename
            self.splitter.flush()
            self.fh.close()
            self.fh = None
            self.stats.rotation()
            log.info("log file %s was rotated; reopening", self.path)
            if self._open():
                return self._read_available()
        return 0

    def _check_truncated(self) -> None:
        """Shorter than what we read (copytruncate), or rewritten from the start past our
        offset (llama-server's --log-file after a restart): read it again from 0."""
        assert self.fh is not None
        fd = self.fh.fileno()
        try:
            size = os.fstat(fd).st_size
        except OSError:
            return
        if size < self.pos:
            self._truncated()
        elif self.head and size >= len(self.head) and os.pread(fd, len(self.head), 0) != self.head:
            self._truncated()
        elif self.tail_sig and os.pread(fd, len(self.tail_sig), self.pos - len(self.tail_sig)) != self.tail_sig:
            # truncated and written again past our offset while we were not looking: without
            # timestamps its start can read exactly like the old run's
            self._truncated()

    def _truncated(self) -> None:
        assert self.fh is not None
        self.stats.truncation()
        log.info("log file %s was truncated; reading it from the start", self.path)
        self.splitter.drop()
        self.fh.seek(0)
        self.pos = 0
        self.tail_sig = b""
        self.head = os.pread(self.fh.fileno(), HEAD_BYTES, 0)

    def _skip_hole(self) -> None:
        """Jump over a hole at the read position (see LineSplitter.feed) instead of reading
        what may be gigabytes of zeros. Filesystems without SEEK_DATA read it; feed drops it."""
        assert self.fh is not None
        try:
            data_at = os.lseek(self.fh.fileno(), self.pos, os.SEEK_DATA)
        except (OSError, AttributeError):  # ENXIO: only a hole (or nothing) past pos yet
            return
        if data_at > self.pos:
            self.fh.seek(data_at)
            self.pos = data_at
            self.tail_sig = b""

    def _read_available(self) -> int:
        assert self.fh is not None
        self._skip_hole()
        total = 0
        while True:
            want = self.chunk if self.live_from is None else min(self.chunk, self.live_from - self.pos)
            try:
                data = self.fh.read(want)
            except OSError as e:
                self.stats.read_error()
                log.warning("error reading %s: %s", self.path, e.strerror)
                return total
            if not data:
                break
            if len(self.head) < HEAD_BYTES and self.pos < HEAD_BYTES:
                self.head = os.pread(self.fh.fileno(), HEAD_BYTES, 0)
            self.pos += len(data)
            total += len(data)
            self.tail_sig = (self.tail_sig + data[-HEAD_BYTES:])[-HEAD_BYTES:]
            self.splitter.feed(data)
            if self.live_from is not None and self.pos >= self.live_from:
                self.live_from = None
                assert self.on_catch_up is not None
                self.on_catch_up(False)
        return total

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class DirectoryWatch:
    """Wakes the follower as soon as anything in the log's directory changes (Linux inotify,
    through libc). Lines reach the exporter within milliseconds, which matters: /slots must
    be polled while a short task still holds its slot. Without inotify, polling alone."""

    _MASK = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800  # MODIFY ATTRIB MOVED_* CREATE DELETE*

    def __init__(self, path: str) -> None:
        self.fd = -1
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            directory = os.path.dirname(os.path.abspath(path)) or "/"
            if libc.inotify_add_watch(fd, directory.encode(), self._MASK) < 0:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = -1

    def wait(self, timeout: float, stop: threading.Event) -> None:
        if self.fd < 0:
            stop.wait(timeout)
            return

        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                while os.read(self.fd, 65536):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def follow_file(follower: FileFollower, stop: threading.Event, interval: float) -> None:
    watch = DirectoryWatch(follower.path)
    try:
        while not stop.is_set():
            if follower.poll_once() == 0:
                watch.wait(interval, stop)
    finally:
        watch.close()
        follower.close()


@dataclass
class FileSource:
    """A log file followed across rotations, truncations and holes. ``follower`` is there once
    it runs (its open error is part of the exporter's readiness)."""

    make_follower: Callable[[LineSplitter], FileFollower]
    interval: float
    follower: FileFollower | None = None

    def run(self, splitter: LineSplitter, stop: threading.Event) -> None:
        self.follower = self.make_follower(splitter)
        follow_file(self.follower, stop, self.interval)
