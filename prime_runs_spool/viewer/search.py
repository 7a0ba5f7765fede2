"""Full-text search over a run's messages, tool calls and tool output (SQLite FTS5).

Why a second index: the row index keeps a few figures per episode, never its text, so that a
big run costs megabytes; searching every message needs the text, so it goes to disk, in an
FTS5 table, one SQLite file per run in this user's cache (``VIEWER_SEARCH_DIRNAME``),
never in the run's folder, which the viewer only reads. The file
is 0600 in a 0700 folder: it holds the runs' prompts and answers (masked as pages show them).

Built like the row index: incrementally, from where it stopped (the rows it holds are the
run's first ``count``, in spool order, so a growing spool costs only its new episodes), for
at most a time budget per request; a background thread does the rest. A search answers
from what is indexed so far, and the page says how far that is.

A query is words, each matched as a token (FTS5's own syntax is not exposed: a stray quote
or ``AND`` in a search box must not be an error); all words must occur. The words are cut by
the index's own tokenizer (:meth:`SearchIndex.terms`), never by a regular expression: a word
``\\w+`` keeps whole (``snake_case``, a tool's name) is two tokens to ``unicode61``, a phrase,
which an index without positions refuses (every search holding ``_`` was a 500).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prime_runs_spool.errors import MESSAGE_PREFIX, SpoolError
from prime_runs_spool.files import open_private
from prime_runs_spool.sync.user_cache import private_folder
from prime_runs_spool.viewer.transcript import episode_of, turns_of


#: In this user's cache: the viewer's full-text search indexes, one SQLite file per run;
#: never in a run's folder, which the viewer only reads.
VIEWER_SEARCH_DIRNAME = "viewer-search"

#: How long a page request may spend indexing before it answers (seconds).
SEARCH_BUDGET = 0.05
#: Rows read per step while indexing (one reader pass each when they follow each other).
CHUNK = 200
#: The longest text kept per episode (characters): a huge tool output is searched up to here.
MAX_TEXT = 1_000_000
#: The index's layout; a file of another layout is never opened (its name differs).
SCHEMA = 2
#: Episodes indexed empty because they could not be read (a segment unreadable then) are
#: read again at a search at most this often (seconds), up to :data:`CHUNK` of them a time:
#: one made readable since is found, and one that stays unreadable costs that much, not a
#: reading at every search.
RETRY_INTERVAL = 10.0
#: Characters of context on each side of the first hit in a table row's passage.
PASSAGE_CONTEXT = 80
_WORD = re.compile(r"\w+", re.UNICODE)
#: How the index cuts text into tokens, and a query into the same (:meth:`SearchIndex.terms`).
_TOKENIZER = "tokenize='unicode61'"
_log = logging.getLogger(__name__)


def episode_text(episode: Any) -> str:
    """Every message, reasoning, tool call (name and arguments) and tool output of ``episode``."""
    parts: list[str] = []
    traces = episode.get("traces") if isinstance(episode, Mapping) else None
    for trace in traces if isinstance(traces, list) else ():
        if not isinstance(trace, Mapping):
            continue
        for turn in turns_of(trace):
            parts += [turn.text, turn.reasoning or ""]
            for call in turn.tool_calls:
                parts += [call.name, call.arguments]
    return "\n".join(part for part in parts if part)[:MAX_TEXT]


def match_expression(terms: list[str]) -> str | None:
    """An FTS5 query that matches episodes holding every one of ``terms`` (tokens as the
    index's tokenizer cut them: :meth:`SearchIndex.terms`), each quoted as a string."""
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms) if terms else None


def query_words(text: str) -> list[str]:
    return _WORD.findall(text)


def index_path(place: str) -> Path:
    """The index file of the run ``place`` names, in this user's cache (its folder made)."""
    name = hashlib.sha256(f"{SCHEMA}|{place}".encode()).hexdigest()[:32]
    return private_folder(VIEWER_SEARCH_DIRNAME) / f"{name}.sqlite3"


class SearchIndex:
    """The full-text index of one run (``run``: its :class:`~.index.RunIndex`)."""

    def __init__(self, run: Any, key: str, place: str | None = None) -> None:
        """``key`` names what is indexed: an index file holding another key is emptied.
        ``place`` (default: the key) names the file, so a run whose key changes with its
        content (eval outputs rewritten by a resume) keeps one file, emptied, not many."""
        self.run = run
        self.path = index_path(place or key)
        # made 0600 here (SQLite would create it with the umask's mode), never through a link
        os.close(open_private(self.path, os.O_WRONLY | os.O_NOFOLLOW))
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._catcher: threading.Thread | None = None
        self._read_again_at = 0.0  # when the episodes indexed empty may be read again
        with self._lock:
            # Contentless, without positions: a search needs only which episodes hold a word
            # (the passage shown is cut from the record the page reads), so the index keeps
            # neither the text nor where in it each word is.
            self._db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS episodes USING fts5(body, content='', "
                             f"detail=none, {_TOKENIZER})")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value)")
            #: The numbers of the episodes indexed empty, to be read again (:meth:`_read_again`).
            self._db.execute("CREATE TABLE IF NOT EXISTS unread (number INTEGER PRIMARY KEY)")
            found = self._db.execute("SELECT value FROM meta WHERE name = 'key'").fetchone()
            unread = self._db.execute("SELECT value FROM meta WHERE name = 'unread'").fetchone()
            if found is not None and found[0] != key:  # another run (or content) once had this file
                self._empty(key)
            elif unread and unread[0] and self._db.execute("SELECT 1 FROM unread LIMIT 1").fetchone() is None:
                self._empty(key)  # counted by an index that kept no numbers: which to read again is not known
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('key', ?)", (key,))
            row = self._db.execute("SELECT value FROM meta WHERE name = 'count'").fetchone()
            #: How many of the run's first episodes are indexed.
            self.count = int(row[0]) if row else 0
            row = self._db.execute("SELECT value FROM meta WHERE name = 'unread'").fetchone()
            #: How many of those could not be read (indexed empty: a search cannot find them),
            #: and why the first could not: the page says so.
            self.unread = int(row[0]) if row else 0
            row = self._db.execute("SELECT value FROM meta WHERE name = 'unread_error'").fetchone()
            self.unread_error: str | None = row[0] if row else None

    def _empty(self, key: str) -> None:
        self._db.execute("INSERT INTO episodes (episodes) VALUES ('delete-all')")
        self._db.execute("DELETE FROM meta")
        self._db.execute("DELETE FROM unread")
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('key', ?)", (key,))
        self.count = 0
        self.unread, self.unread_error = 0, None

    def reset(self, key: str) -> None:
        """Forget every episode indexed: the run was rewritten, and is now ``key``."""
        with self._lock:
            self._empty(key)

    @property
    def read_again_every(self) -> float:
        """How often episodes indexed empty are read again, at most (:data:`RETRY_INTERVAL`):
        the page says so beside their count."""
        return RETRY_INTERVAL

    @property
    def behind(self) -> bool:
        return self.count < len(self.run.rows) or self.run.behind

    def refresh(self, budget: float = SEARCH_BUDGET) -> None:
        """Index the rows read since, for at most about ``budget`` seconds."""
        deadline = time.monotonic() + budget
        with self._lock:
            while self.count < len(self.run.rows):
                rows = self.run.rows[self.count:self.count + CHUNK]
                entries, unread, error = [], self.unread, self.unread_error
                for row, record in self.run.records(rows):
                    if isinstance(record, SpoolError):  # indexed empty, counted: the page says so
                        unread, error = unread + 1, error or str(record)
                        entries.append((row.number, ""))
                    else:
                        entries.append((row.number, episode_text(episode_of(record))))
                self._db.execute("BEGIN")
                self._db.executemany("INSERT INTO episodes (rowid, body) VALUES (?, ?)", entries)
                self._db.executemany("INSERT INTO unread VALUES (?)", [(n,) for n, text in entries if not text])
                self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                     [("count", self.count + len(entries)), ("unread", unread),
                                      ("unread_error", error)])
                self._db.execute("COMMIT")
                self.count += len(entries)
                self.unread, self.unread_error = unread, error
                if time.monotonic() > deadline:
                    break
            if self.unread and time.monotonic() >= self._read_again_at:
                self._read_again()

    def _read_again(self) -> None:
        """Read again up to :data:`CHUNK` of the episodes indexed empty (the lock held): each
        one read now is indexed and counted no more. Not before :data:`RETRY_INTERVAL` has
        passed again."""
        self._read_again_at = time.monotonic() + RETRY_INTERVAL
        numbers = [n for (n,) in self._db.execute("SELECT number FROM unread ORDER BY number LIMIT ?", (CHUNK,))]
        rows = self.run.rows
        wanted = [rows[n - 1] for n in numbers if 0 < n <= len(rows) and rows[n - 1].number == n]
        read, error = [], None
        for row, record in self.run.records(wanted):
            if isinstance(record, SpoolError):
                error = error or str(record)
            else:
                read.append((row.number, episode_text(episode_of(record))))
        unread = self.unread - len(read)
        error = None if not unread else error or self.unread_error
        self._db.execute("BEGIN")
        # Contentless: an entry is taken out by the text it was indexed with, here none.
        self._db.executemany("INSERT INTO episodes (episodes, rowid, body) VALUES ('delete', ?, '')",
                             [(n,) for n, _ in read])
        self._db.executemany("INSERT INTO episodes (rowid, body) VALUES (?, ?)", read)
        self._db.executemany("DELETE FROM unread WHERE number = ?", [(n,) for n, _ in read])
        self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [("unread", unread), ("unread_error", error)])
        self._db.execute("COMMIT")
        self.unread, self.unread_error = unread, error

    def catch_up_in_background(self) -> None:
        if not self.behind or (self._catcher is not None and self._catcher.is_alive()):
            return

        def run() -> None:
            try:
                while self.behind:
                    before = self.count
                    self.refresh(0.25)
                    if self.count == before:
                        time.sleep(0.25)  # the row index is still reading: wait for its rows
            except Exception as exc:  # one line, not a traceback: the next search tries again
                _log.warning("%sthe search index of %s stopped at episode %d: %s", MESSAGE_PREFIX,
                             self.run.key, self.count, exc)

        self._catcher = threading.Thread(target=run, name=f"viewer-search-{self.run.key}", daemon=True)
        self._catcher.start()

    def hits(self, text: str) -> set[int]:
        """The numbers of the indexed episodes holding every word of ``text``."""
        self.refresh()
        self.catch_up_in_background()
        with self._lock:
            expression = match_expression(self._terms(text))
            if expression is None:
                return set()
            return {row[0] for row in self._db.execute("SELECT rowid FROM episodes WHERE episodes MATCH ?",
                                                       (expression,))}

    def terms(self, text: str) -> list[str]:
        """The tokens the index's tokenizer cuts ``text`` into (folded as the index holds them)."""
        with self._lock:
            return self._terms(text)

    def _terms(self, text: str) -> list[str]:
        """:meth:`terms`, the lock held: ``text`` put in a table of this connection's own
        (``temp``, gone with it) tokenized as ``episodes`` is, its terms read back."""
        self._db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.asked USING fts5(body, detail=none, "
                         f"{_TOKENIZER})")
        self._db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.asked_terms USING fts5vocab(temp, asked, row)")
        self._db.execute("DELETE FROM temp.asked")
        self._db.execute("INSERT INTO temp.asked (body) VALUES (?)", (text,))
        return [row[0] for row in self._db.execute("SELECT term FROM temp.asked_terms")]


def marked(text: str, words: list[str]) -> list[tuple[str, bool]]:
    """``text`` cut into ``(piece, is_hit)`` where each of ``words`` occurs (case-insensitive),
    for the episode page's highlights."""
    if not words or not text:
        return [(text, False)]
    pattern = re.compile("|".join(re.escape(word) for word in sorted(words, key=len, reverse=True)), re.I)
    out, at = [], 0
    for match in pattern.finditer(text):
        if match.start() > at:
            out.append((text[at:match.start()], False))
        out.append((match.group(0), True))
        at = match.end()
    if at < len(text):
        out.append((text[at:], False))
    return out


def passage(text: str, words: list[str], context: int = PASSAGE_CONTEXT) -> list[tuple[str, bool]]:
    """The first place in ``text`` where one of ``words`` occurs as a word, with ``context``
    characters around it, cut into ``(piece, is_hit)``; empty when none occurs. Taken from
    the record the table page reads anyway: FTS5's own snippet re-reads every hit's text."""
    if not words:
        return []
    found = re.search(r"\b(?:" + "|".join(re.escape(word) for word in words) + r")\b", text, re.I)
    if found is None:
        return []
    start, end = max(0, found.start() - context), min(len(text), found.end() + context)
    pieces = marked(re.sub(r"\s+", " ", text[start:end]), words)
    if start > 0:
        pieces.insert(0, ("…", False))
    if end < len(text):
        pieces.append(("…", False))
    return pieces
