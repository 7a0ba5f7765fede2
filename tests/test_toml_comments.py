"""Dropping a TOML document's comments: no comment survives, every other byte does.

Hypothesis writes TOML documents whose strings (all four forms) are full of ``#``, quotes,
escapes and lines that look like comments, with real comments holding secret words on
their own lines, after values, after table headers and inside multi-line arrays. The
result must be exactly the document without its comments, and parse to the same data.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings, strategies as st

from prime_runs_spool.content.toml_comments import drop_comments

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SECRET = st.text("ABCDEFGHKLMNPQRSTUVWXYZ0123456789", min_size=4, max_size=8).map(lambda s: "SECRET" + s)
content = st.text("abc #'=[]{}\\\"\t", max_size=12)  # string contents that look like TOML
plain = st.text("abc #=[]{}\t", max_size=12)  # no quote: a literal string cannot escape one


def basic(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@st.composite
def values(draw) -> str:
    kind = draw(st.sampled_from(["basic", "literal", "ml_basic", "ml_literal", "int", "inline"]))
    if kind == "basic":
        return basic(draw(content))
    if kind == "literal":
        return "'" + draw(plain) + "'"
    if kind == "ml_basic":
        lines = draw(st.lists(content, min_size=1, max_size=3))
        body = "\n".join(line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)
        return '"""\n' + body + '"' * draw(st.integers(0, 2)) + '"""'
    if kind == "ml_literal":
        lines = draw(st.lists(plain, min_size=1, max_size=3))
        return "'''x" + "\n".join(lines) + "'" * draw(st.integers(0, 2)) + "'''"
    if kind == "int":
        return str(draw(st.integers(-1000, 1000)))
    return "{ k = " + basic(draw(content)) + " }"


@st.composite
def documents(draw) -> tuple[str, str, list[str]]:
    """A document, the same without its comments, and the secret words in the comments."""
    doc, expected, secrets = [], [], []

    def comment() -> str:
        word = draw(SECRET)
        secrets.append(word)
        return "#" + draw(st.sampled_from(["", " ", "#", " key = \"", " '''"])) + " " + word

    def maybe_trailing(line: str) -> None:
        if draw(st.booleans()):
            doc.append(line + draw(st.sampled_from([" ", "  ", "\t", ""])) + comment())
        else:
            doc.append(line)
        expected.append(line)

    for number in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["pair", "comment", "blank", "table", "array"]))
        if kind == "pair":
            maybe_trailing(f"k{number} = {draw(values())}")
        elif kind == "comment":
            doc.append(draw(st.sampled_from(["", "  ", "\t"])) + comment())
        elif kind == "blank":
            doc.append("")
            expected.append("")
        elif kind == "table":
            maybe_trailing(f"[t{number}]")
        else:  # a multi-line array, a comment allowed after each element
            doc.append(f"a{number} = [")
            expected.append(f"a{number} = [")
            for _ in range(draw(st.integers(0, 3))):
                maybe_trailing(f"  {draw(values())},")
            doc.append("]")
            expected.append("]")
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return "".join(line + newline for line in doc), "".join(line + newline for line in expected), secrets


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(documents())
def test_no_comment_survives_and_nothing_else_changes(case) -> None:
    doc, expected, secrets = case
    parsed = tomllib.loads(doc)
    out = drop_comments(doc)
    for word in secrets:
        assert word not in out
    assert out == expected
    assert tomllib.loads(out) == parsed
    if not secrets:
        assert out is doc


def test_a_document_without_comments_is_returned_as_is() -> None:
    text = 'a = "#x"\nb = \'#y\'\nc = """\n# z\n"""\n'
    assert drop_comments(text) is text
