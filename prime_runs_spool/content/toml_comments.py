"""Drop the comments of a TOML document, keeping every other byte.

A launch file travels as ``config_source`` (docs/manifest.md). Masking checks what the
file *parses to*; a comment is not in the parse, so a credential written in one
(``# api_key = "sk-..."``, a token pasted as a note) would travel verbatim. The upload
therefore carries the document with its comments removed: everything else (keys, values,
layout, blank lines) stays byte for byte, so the dashboard still shows the file as written.

This is a lexer for valid TOML only (the caller has already parsed the text): it tracks
the four string forms, in which ``#`` is not a comment, and nothing else. The caller
re-parses the result and checks it equals the original's parse.
"""

from __future__ import annotations

_SPACE = " \t"


def comment_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every comment: from its ``#`` to its line's end (exclusive)."""
    spans = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "#":
            end = i
            while end < n and text[end] not in "\r\n":
                end += 1
            spans.append((i, end))
            i = end
        elif char in "\"'":
            i = _skip_string(text, i)
        else:
            i += 1
    return spans


def _skip_string(text: str, i: int) -> int:
    """The index just past the string that opens at ``i``."""
    quote = text[i]
    escapes = quote == '"'
    n = len(text)
    if text.startswith(quote * 3, i):  # multi-line: ends at the last 3 of a run of 3 to 5 quotes
        i += 3
        while i < n:
            if escapes and text[i] == "\\":
                i += 2
            elif text.startswith(quote * 3, i):
                run = 3
                while run < 5 and i + run < n and text[i + run] == quote:
                    run += 1
                return i + run
            else:
                i += 1
        return n
    i += 1
    while i < n:
        if escapes and text[i] == "\\":
            i += 2
        elif text[i] == quote or text[i] == "\n":
            return i + 1
        else:
            i += 1
    return n


def drop_comments(text: str) -> str:
    """``text`` without its comments, nor the blanks before them; a line that was only a
    comment disappears with its line ending. A document without comments is returned as is."""
    spans = comment_spans(text)
    if not spans:
        return text
    out = []
    cursor = 0
    for start, end in spans:
        cut = start
        while cut > cursor and text[cut - 1] in _SPACE:
            cut -= 1
        whole_line = cut == 0 or text[cut - 1] == "\n"
        out.append(text[cursor:cut])
        cursor = end
        if whole_line:  # take the line ending with it
            if text.startswith("\r\n", cursor):
                cursor += 2
            elif text.startswith("\n", cursor):
                cursor += 1
    out.append(text[cursor:])
    return "".join(out)
