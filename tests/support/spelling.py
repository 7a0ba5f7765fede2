"""Location names as users write them: masking matches them in any spelling (docs/masking.md)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


@st.composite
def spelled(draw: Any, name: str) -> str:
    """``name`` with each letter in either case and its words joined by ``_``, ``-`` or
    nothing (``extra_headers``: ``Extra-Headers``, ``eXtRaheaders``, ``EXTRA_HEADERS``)."""
    joiner = draw(st.sampled_from(["_", "-", ""]))
    return joiner.join("".join(c.upper() if draw(st.booleans()) else c for c in word) for word in name.split("_"))


#: Letters of other scripts that read as a Latin one (Cyrillic, Greek, dotless i), written
#: out here apart from the code's table: a name spelled with them reads as the Latin name.
LOOKALIKES = {"a": "аα", "c": "сϲ", "e": "еε", "i": "іιı", "j": "ј", "k": "кκ", "o": "оο", "p": "рρ", "s": "ѕ",
              "x": "хχ", "y": "уγ", "A": "АΑ", "B": "ВΒ", "C": "С", "E": "ЕΕ", "H": "НΗ", "I": "ІΙ", "K": "КΚ",
              "M": "МΜ", "O": "ОΟ", "P": "РΡ", "T": "ТΤ", "X": "ХΧ", "N": "Ν"}


@st.composite
def lookalike_spellings(draw: Any, names: list[str]) -> tuple[str, str]:
    """A name of ``names``, and the same name with some of its characters written another way:
    a lookalike letter, the full-width form (U+FF01 on: ``ｐａｓｓ``), a zero-width space after."""
    name = draw(st.sampled_from(names))
    spelled = []
    for char in name:
        way = draw(st.sampled_from(["as is", "lookalike", "full width", "zero width"]))
        if way == "lookalike" and char in LOOKALIKES:
            spelled.append(draw(st.sampled_from(LOOKALIKES[char])))
        elif way == "full width" and "!" <= char <= "~":
            spelled.append(chr(ord(char) + 0xFEE0))
        elif way == "zero width":
            spelled.append(char + "\u200b")
        else:
            spelled.append(char)
    return name, "".join(spelled)
