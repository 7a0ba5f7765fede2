"""``Secret.scrub`` takes the API key out of what a server answered, however the answer
quotes it: any letter case, and each character as itself or escaped the way JSON, a URL or
HTML escapes it (an encoder may escape only some characters), or the whole in base64.

The property: a random key, quoted in a random mix of those encodings inside a random
answer, is gone once the scrubbed answer is decoded back; text without the key is left as
it was.
"""

from __future__ import annotations

import html
import re
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_spool.platform_api.settings import Secret

#: What an API key may hold: what an ``Authorization`` header can carry (settings.py).
KEY_CHARS = st.characters(min_codepoint=ord("!"), max_codepoint=ord("~"))
#: The text around the quoted key: characters no encoding below writes.
AROUND = " \n\t:=,{}[]()<>\"'"


def _case(ch: str, upper: bool) -> str:
    return ch.upper() if upper else ch.lower()


#: Each way one character may be quoted: ``(name, encode(character, upper))``.
ENCODINGS = {
    "as is": lambda ch, upper: ch,
    "case": _case,
    "decimal entity": lambda ch, upper: f"&#{'0' * upper}{ord(ch)};",
    "hex entity": lambda ch, upper: f"&#X{ord(ch):X};" if upper else f"&#x{ord(ch):x};",
    "named entity": lambda ch, upper: html.escape(ch),
    "percent": lambda ch, upper: _case(f"%{ord(ch):02x}", upper),
    "json \\u": lambda ch, upper: f"\\u{ord(ch):04x}" if not upper else f"\\u{ord(ch):04X}",
    "json \\/": lambda ch, upper: "\\/" if ch == "/" else ch,
}


def decoded(text: str) -> str:
    """``text`` with every encoding above undone, as a person reading the answer would."""
    text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), text).replace("\\/", "/")
    return unquote(html.unescape(text))


def json_blanks(text: str) -> str:
    """``text`` with the white space JSON writes as escapes in a string (``\\n``, ``\\u000a``) as white space."""
    return re.sub(r"\\[nrtf]|\\u00(?:0[9a-dA-D]|20)", " ", text, flags=re.IGNORECASE)


@st.composite
def quoted_keys(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A key and its characters quoted: every one in one encoding, or each in its own."""
    key = draw(st.text(KEY_CHARS, min_size=8, max_size=48))
    names = sorted(ENCODINGS)
    if draw(st.booleans()):
        per_char = [draw(st.sampled_from(names))] * len(key)
    else:
        per_char = draw(st.lists(st.sampled_from(names), min_size=len(key), max_size=len(key)))
    upper = draw(st.booleans())
    return key, [ENCODINGS[name](ch, upper) for ch, name in zip(key, per_char)]


@settings(max_examples=250, deadline=None)
@given(quoted_keys(), st.data())
def test_a_key_quoted_in_any_encoding_and_case_is_scrubbed(quoted: tuple[str, list[str]],
                                                           data: st.DataObject) -> None:
    key, form = quoted[0], "".join(quoted[1])
    around = "".join(ch for ch in AROUND if ch not in key)
    before, after = (data.draw(st.text(st.sampled_from(around), max_size=20)) if around else "" for _ in range(2))
    answer = f"{before}Bearer {form}{after}"
    scrubbed = Secret(key).scrub(answer)
    assert scrubbed == f"{before}Bearer ***{after}", (key, answer, scrubbed)
    # however it is read back: the key is gone (a window as long as the key, of its
    # characters only, would have to fit in "***", and the key is longer)
    assert key.lower() not in decoded(scrubbed).lower()


@settings(max_examples=150, deadline=None)
@given(st.text(KEY_CHARS, min_size=8, max_size=48), st.text(max_size=200))
def test_text_without_the_key_is_left_as_it_was(key: str, text: str) -> None:
    if any(key.lower() in "".join(seen.split()).lower() for seen in (text, decoded(text), json_blanks(text))):
        return  # the text holds the key after all (broken by white space, maybe): the properties here cover it
    assert Secret(key).scrub(text) == text


def test_the_key_less_a_character_is_not_the_key() -> None:
    """The pattern matches the whole key, never less."""
    secret = Secret("sk-live/SECRET+0123")
    for text in ("Bearer sk-live/SECRET+012", "Bearer k-live/SECRET+0123", "&#115;k-live\\/SECRET%2B012"):
        assert secret.scrub(text) == text


def test_an_empty_key_scrubs_nothing() -> None:
    assert Secret("").scrub("&#112;%70p") == "&#112;%70p"


@settings(max_examples=250, deadline=None)
@given(quoted_keys(), st.data())
def test_a_key_broken_by_white_space_anywhere_is_scrubbed(quoted: tuple[str, list[str]], data: st.DataObject) -> None:
    """A page wrapped at a column, a header echoed over two lines: the key with white space
    between its characters. The error line joins its words with one space, which printed
    the key whole ("sk-EchoKey ZZ9911abcdef")."""
    key, pieces = quoted
    breaks = [data.draw(st.sampled_from(["", "", " ", "\n", "\r\n", "\n    ", "\t"])) for _ in pieces[1:]]
    form = pieces[0] + "".join(gap + piece for gap, piece in zip(breaks, pieces[1:]))
    scrubbed = Secret(key).scrub(f"you sent: Bearer {form}.")
    assert scrubbed == "you sent: Bearer ***.", (key, form, scrubbed)


@settings(max_examples=100, deadline=None)
@given(st.text(KEY_CHARS, min_size=8, max_size=48), st.integers(1, 76), st.sampled_from(["\n", "\r\n"]))
def test_a_key_in_base64_cut_into_lines_is_scrubbed(key: str, width: int, newline: str) -> None:
    """Base64 as MIME writes it, a line every so many characters: no whole base64 group of
    the key's bytes is left on the page, however the lines fall."""
    import base64

    encoded = base64.b64encode(f"Bearer {key}".encode()).decode()
    lines = newline.join(encoded[at:at + width] for at in range(0, len(encoded), width))
    scrubbed = "".join(Secret(key).scrub(lines).split())
    assert scrubbed.count("***") >= 1
    for start in range(3):
        whole = key.encode()[start:start + (len(key) - start) // 3 * 3]
        middle = base64.b64encode(whole).decode()[4:-4] if len(whole) >= 6 else ""
        assert not middle or middle not in scrubbed, (key, width, scrubbed)


@settings(max_examples=150, deadline=None)
@given(st.text(KEY_CHARS, min_size=8, max_size=48), st.data())
def test_a_key_broken_by_white_space_inside_a_json_answer_is_scrubbed_from_the_error_line(
        key: str, data: st.DataObject) -> None:
    """A JSON answer echoing the header wrapped (``{"detail": "... sk-EchoKey\\nZZ99..."}``,
    the line break written as JSON writes it, ``\\n`` or ``\\u000a``) or base64 cut into lines:
    the key is scrubbed from the raw body, which the error line then reads as JSON for its
    words, turning the escape into white space; it printed 'sk-EchoKey ZZ9911abcdef'."""
    import base64
    import json

    from prime_runs_spool.platform_api.answers import error_words

    breaks = [data.draw(st.sampled_from(["", "", "", "\n", "\r\n", "\t"])) for _ in key[1:]]
    wrapped = key[0] + "".join(gap + ch for gap, ch in zip(breaks, key[1:]))
    encoded = base64.b64encode(f"Bearer {key}".encode()).decode()
    width = data.draw(st.integers(4, 76))
    lines = "\n".join(encoded[at:at + width] for at in range(0, len(encoded), width))
    body = json.dumps({"detail": f"you sent: Bearer {wrapped} ({lines})"}, ensure_ascii=data.draw(st.booleans()))
    if data.draw(st.booleans()):
        body = body.replace("\\n", "\\u000a").replace("\\t", "\\u0009")
    said = "".join(error_words(Secret(key).scrub(body)).split())
    assert key not in said, (key, body, said)
    for start in range(3):
        whole = key.encode()[start:start + (len(key) - start) // 3 * 3]
        middle = base64.b64encode(whole).decode()[4:-4] if len(whole) >= 6 else ""
        assert not middle or middle not in said, (key, body, said)


#: Every character ``str.split()`` cuts at, which the error line's words are joined over.
WHITE_SPACE = [chr(code) for code in range(0x3001) if chr(code).isspace()]


@pytest.mark.parametrize("blank", WHITE_SPACE, ids=[f"U+{ord(ch):04X}" for ch in WHITE_SPACE])
def test_a_key_broken_by_any_white_space_json_escapes_is_scrubbed_from_the_error_line(blank: str) -> None:
    """JSON written ASCII-only (Python's json.dumps as it is, Flask's) escapes a no-break
    space, a line separator or an information separator as ``\\u00a0``, ``\\u2028``,
    ``\\u001f``; the error line's words are read from the parsed JSON and joined over any
    white space, so a key broken by one of them printed whole ('sk-EchoKey ZZ9911abcdef'):
    only ``\\u0009``-``\\u000d`` and ``\\u0020`` were known for white space."""
    import base64
    import json

    from prime_runs_spool.platform_api.answers import error_words

    key = "sk-EchoKeyZZ9911abcdef"
    bodies = [json.dumps({"detail": f"you sent: Bearer {key[:10]}{blank}{key[10:]}"}),
              json.dumps({"detail": f"you sent: Bearer {blank.join(key)}"}),
              json.dumps({"detail": f"you sent: {base64.b64encode(key.encode()).decode()[:8]}{blank}"
                                    f"{base64.b64encode(key.encode()).decode()[8:]}"})]
    for body in [*bodies, *(re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(), b) for b in bodies)]:
        said = error_words(Secret(key).scrub(body))
        joined = "".join(said.split())
        assert key not in joined and base64.b64encode(key.encode()).decode()[4:-4] not in joined, (body, said)
