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
never folded (it is masked or kept byte for byte). A name inside a string (a flag of a
command line, ``NAME=value``) is judged the same way: the string is read folded
(:func:`folded_text`, where a hyphen or a dash a word processor made of ``--`` also reads
as ``-``), and what is found there is masked in the string as it was written. The price: a key in Cyrillic or Greek
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


#: Hyphens and dashes that read as ``-`` before a flag's name (``—api-key``: a word
#: processor or a chat makes an em or en dash of a command line's ``--``; U+2010, U+2011,
#: U+2012, the minus sign, the small hyphen-minus; the full-width one NFKC folds).
_DASHES = str.maketrans({"\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-",
                         "\u2212": "-", "\ufe63": "-"})


def folded_text(text: str) -> tuple[str, list[int]]:
    """``text`` read as its letters look (each character folded as :func:`folded_name` folds
    a name's, and the dashes of :data:`_DASHES` as ``-``), and, for each character of the
    folded text, the index in ``text`` of the character it comes from: what is found in the
    folded text is masked where it was written. An ASCII text is its own fold."""
    if text.isascii():
        return text, list(range(len(text)))
    folded: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        reads = char if char.isascii() else folded_name(char.translate(_DASHES))
        folded.append(reads)
        origin.extend([index] * len(reads))
    return "".join(folded), origin
