"""Incremental Server-Sent Events parsing for streamed responses (chapter 02): bytes arrive split
anywhere, even inside a UTF-8 character or between ``\\r`` and ``\\n``. :class:`LineSplitter` cuts
lines, :class:`SSEParser` assembles events (what OpenAI-compatible servers stream) and keeps each
event's type, so an error a server reports mid-stream is never mistaken for data. Ollama's NDJSON
is parsed by the official ``ollama`` client (:mod:`labkit.serving.ollama_api`)."""

from __future__ import annotations

import re
from typing import NamedTuple

_EOL = re.compile(rb"\r\n|\n|\r")


class LineSplitter:
    """Bytes in, complete lines out (str, without terminators), splitting on CRLF, LF or a lone CR
    (the SSE rules). A line is decoded only once complete, so a UTF-8 character split across
    network reads decodes correctly."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        lines, start = [], 0
        for m in _EOL.finditer(self._buf):
            if m.group() == b"\r" and m.end() == len(self._buf):
                break  # may be the first half of CRLF: wait for the next read
            lines.append(self._buf[start:m.start()].decode("utf-8", errors="replace"))
            start = m.end()
        self._buf = self._buf[start:]
        return lines

    def close(self) -> list[str]:
        """Flush at end of stream: a trailing lone CR ends a line; an unterminated last line is
        returned as is."""
        rest, self._buf = self._buf, b""
        parts = _EOL.split(rest) if rest else []
        if parts and parts[-1] == b"":
            parts.pop()
        return [p.decode("utf-8", errors="replace") for p in parts]


class SSEEvent(NamedTuple):
    """One dispatched event: ``event`` is its type (``"message"`` unless the server set ``event:``;
    ``"error"`` also for a non-standard ``error:`` field) and ``data`` its data lines joined by
    newlines (for an ``error:`` field, the field's value, else the data)."""

    event: str
    data: str


class SSEParser:
    """Server-Sent Events (WHATWG HTML spec, section 9.2): ``feed(bytes)`` returns the
    :class:`SSEEvent` s completed by those bytes; ``close()`` also dispatches an event the server
    did not end with a blank line. Comments (``: keep-alive``), ``id:`` and ``retry:`` are skipped.

    Two departures from the spec, both so that errors are never lost: llama.cpp's server reports an
    error as an ``error:`` field (unknown to the spec, which would drop it), kept here as an
    ``"error"`` event; and an ``event: error`` with no data is still dispatched (empty data).
    Other events with empty data are dropped, as the spec says."""

    def __init__(self) -> None:
        self._lines = LineSplitter()
        self._data: list[str] = []
        self._error: list[str] = []
        self._event = ""
        self._first = True

    def feed(self, data: bytes) -> list[SSEEvent]:
        return self._handle(self._lines.feed(data))

    def close(self) -> list[SSEEvent]:
        events = self._handle(self._lines.close())
        self._dispatch(events)
        return events

    def _dispatch(self, events: list[SSEEvent]) -> None:
        data, error, event = "\n".join(self._data), "\n".join(self._error), self._event
        had_error = bool(self._error)
        self._data, self._error, self._event = [], [], ""
        if had_error or event == "error":
            events.append(SSEEvent("error", error or data))
        elif data:  # the spec drops events whose data is empty
            events.append(SSEEvent(event or "message", data))

    def _handle(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for line in lines:
            if self._first:
                line, self._first = line.removeprefix("\ufeff"), False
            if line == "":
                self._dispatch(events)
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                self._data.append(value)
            elif field == "event":
                self._event = value
            elif field == "error":
                self._error.append(value)
        return events
