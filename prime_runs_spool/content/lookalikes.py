"""A key's name as the letters it looks like, for the masking rules that judge names.

A config key is typed by a person or a producer, and a name the rules read as a secret's
(``password``, ``HF_TOKEN``, ``headers``) can be written in letters that only look like
those: a Cyrillic ``а`` (``pаssword``, pasted from a document or a keyboard layout left on),
full-width letters (``ＨＦ＿ＴＯＫＥＮ``, from an East Asian input method), a zero-width space
pasted along. Whoever reads the record takes the name for what it looks like, and so does a
script that reads it back by eye; the rules, which compare ASCII, let its value travel. So
a name is judged folded: the Cyrillic and Greek letters that read as one Latin letter (as
Unicode's confusables list, TR39, maps them) read as that letter, the invisible format
characters dropped, and NFKC (full-width and other compatibility forms to their letters,
``ﬁ`` to ``fi``; the lookalikes it makes of mathematical letters folded after it).

Only the *judgment* of a name is folded: the key is written as it was, and a value is
never folded (it is masked or kept byte for byte). The price: a key in Cyrillic or Greek
that reads as an English secret word once folded (``рass`` would not: only whole words
count) has its value masked, a record's cost only.
"""

from __future__ import annotations

import unicodedata

#: Cyrillic and Greek letters that read as one Latin letter (TR39's confusables.txt), lower
#: and upper case: those that can spell the names the rules look for.
_LATIN_LOOKALIKES = str.maketrans({
    # Cyrillic, lower case
    "а": "a", "г": "r", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "ӏ": "l",
    "п": "n", "о": "o", "р": "p", "с": "c", "ԛ": "q", "ѕ": "s", "у": "y", "ѵ": "v", "ԝ": "w", "х": "x",
    "ԁ": "d", "ь": "b",
    # Cyrillic, upper case
    "А": "A", "В": "B", "С": "C", "Е": "E", "Н": "H", "І": "I", "Ј": "J", "К": "K", "М": "M", "О": "O",
    "Р": "P", "Ԛ": "Q", "Ѕ": "S", "Т": "T", "Х": "X", "У": "Y", "Ү": "Y", "Ԝ": "W", "Ӏ": "I",
    # Greek, lower case
    "α": "a", "ϲ": "c", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "υ": "u",
    "γ": "y", "ω": "w", "χ": "x", "η": "n",
    # Greek, upper case
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X", "Ϲ": "C",
    # Latin letters that are not ASCII but read as one: dotless i, and kra
    "ı": "i", "ĸ": "k",
    # invisible: soft hyphen, zero-width space, non-joiner, joiner, word joiner, BOM
    "\u00ad": None, "\u200b": None, "\u200c": None, "\u200d": None, "\u2060": None, "\ufeff": None,
})


def folded_name(name: str) -> str:
    """``name`` as the letters it looks like (the module's docstring); an ASCII name, nearly
    every key, is returned as it is without a look at its letters."""
    if name.isascii():
        return name
    # Before NFKC too: it makes some lookalikes other letters (a lunate sigma ``ϲ`` a final ``ς``).
    return unicodedata.normalize("NFKC", name.translate(_LATIN_LOOKALIKES)).translate(_LATIN_LOOKALIKES)
