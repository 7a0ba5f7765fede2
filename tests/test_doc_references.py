"""Every pointer into docs/ leads somewhere: a page that exists, and the section it names.

Code and docs point at a section as ``docs/sync.md, "State"`` (a quoted name, which opens
a heading, a table row's first cell or a bold label of that page, or is a sentence quoted
from it) or ``docs/spool-format.md, section 4.1`` (a numbered heading). A page rewritten without the section leaves the
pointer leading nowhere, and the figure it promised only in git history; this test reads
every such pointer and fails on the first that names a page or a section that is not
there. Static: the text of the files, nothing imported.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.env import REPO_ROOT

DOCS = REPO_ROOT / "docs"

#: Where pointers are written: the package, the command line, tests, benchmarks, fixtures,
#: the docs and the README.
SOURCES = sorted(
    [path for folder in ("prime_runs_spool", "commands", "tests", "benchmarks", "fixtures")
     for path in (REPO_ROOT / folder).rglob("*") if path.suffix in (".py", ".md", ".html", ".sh")]
    + sorted(DOCS.glob("*.md")) + [REPO_ROOT / "README.md", REPO_ROOT / "setup.py"])
#: This file's own examples name missing sections on purpose.
SOURCES = [path for path in SOURCES if path.name != "test_doc_references.py"]

#: ``docs/NAME.md`` anywhere; a bare ``NAME.md`` only in docs/ itself, where pages name
#: each other that way.
_PAGE = re.compile(r"(?<![\w./-])(docs/)?([a-z][a-z0-9-]*\.md)\b")
#: What may follow a page: a quoted name, a name in backticks (a script, a command the page
#: names), or "section(s)" and numbers.
_QUOTED = re.compile(r"[,:]?\s*\(?\s*\"([^\"]+)\"")
_TICKED = re.compile(r",\s*`([^`]+)`")
_NUMBERED = re.compile(r"[,:]?\s*sections?\s+((?:\d+(?:\.\d+)*(?:,\s*|\s+and\s+)?)+)")
#: Line breaks inside a pointer, with the comment or docstring marks they carry.
_BREAK = re.compile(r"\s*\n\s*(?:#:?\s*)?")


def _sections(page: Path) -> list[str]:
    """What a quoted name may open: headings, table rows' first cells, bold labels."""
    text = page.read_text()
    found = re.findall(r"\*\*([^*]+)\*\*", text)
    for line in text.splitlines():
        if line.startswith("#"):
            found.append(line.lstrip("#").strip())
        elif line.startswith("| "):
            found.append(line[2:].split(" | ")[0].strip())
    return [" ".join(name.replace("`", "").split()).lower() for name in found]


def _quotes(page: Path, quoted: str) -> bool:
    """Whether ``quoted`` is a sentence of the page, line breaks aside."""
    return " ".join(quoted.split()) in " ".join(page.read_text().split())


def _numbers(page: Path) -> set[str]:
    return {match.group(1) for match in re.finditer(r"^#+ (\d+(?:\.\d+)*)[. ]", page.read_text(), re.M)}


def references(sources: list[Path], root: Path = REPO_ROOT) -> list[tuple[str, str, str]]:
    """(where, page, what it names) for every pointer in ``sources``: "" for a bare page."""
    found = []
    for source in sources:
        text = source.read_text(errors="replace")
        in_docs = source.parent == DOCS
        for match in _PAGE.finditer(text):
            if not match.group(1) and not in_docs:
                continue
            where = f"{source.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
            after = _BREAK.sub(" ", text[match.end():match.end() + 200])
            quoted, numbered, ticked = _QUOTED.match(after), _NUMBERED.match(after), _TICKED.match(after)
            if quoted:
                found.append((where, match.group(2), quoted.group(1)))
            elif ticked:
                found.append((where, match.group(2), f"`{ticked.group(1)}`"))
            elif numbered:
                for number in re.findall(r"\d+(?:\.\d+)*", numbered.group(1)):
                    found.append((where, match.group(2), f"section {number}"))
            else:
                found.append((where, match.group(2), ""))
    return found


def missing(refs: list[tuple[str, str, str]]) -> list[str]:
    """The pointers that lead nowhere, each said as where it is and what it lacks."""
    wrong = []
    for where, name, section in refs:
        page = DOCS / name
        if not page.is_file():
            if name != "README.md":
                wrong.append(f"{where}: docs/{name} does not exist")
            continue
        if section.startswith("section "):
            if section.split()[1] not in _numbers(page):
                wrong.append(f"{where}: docs/{name} has no {section}")
        elif section.startswith("`"):
            if section.strip("`") not in page.read_text():
                wrong.append(f"{where}: docs/{name} does not name {section}")
        elif section and not _quotes(page, section) and not any(
                heading.startswith(" ".join(section.replace("`", "").split()).lower()) for heading in _sections(page)):
            wrong.append(f'{where}: docs/{name} has no section "{section}"')
    return wrong


def test_every_pointer_into_docs_names_a_page_and_section_that_exist() -> None:
    refs = references(SOURCES)
    assert len(refs) > 100, "the pointer pattern found almost nothing: it is broken"
    assert missing(refs) == []


@pytest.mark.parametrize("pointer, wrong", [
    ('see docs/sync.md, "State" for why', None),
    ('see docs/sync.md, "No such section"', 'has no section "No such section"'),
    ('docs/benchmarks.md, "Start-up."', None),
    ('docs/benchmarks.md, "A sync\'s peak memory', None),
    ('(docs/spool-format.md, section 4.1)', None),
    ('(docs/spool-format.md, sections 4 and 9)', "has no section 9"),
    ("docs/nowhere.md", "docs/nowhere.md does not exist"),
    ('docs/sync.md, "Resumed\n    #: runs"', None),
    ('docs/sync.md, "a spool cut short"', None),
    ('docs/viewer.md: "After 5 wrong tokens from one client address"', None),
    ('docs/viewer.md: "After 6 wrong tokens from one client address"', 'has no section'),
    ("(docs/benchmarks.md, `sync_throughput.py`)", None),
    ("(docs/benchmarks.md, `no_such_benchmark.py`)", "does not name `no_such_benchmark.py`"),
])
def test_the_check_reads_each_form_of_pointer(tmp_path: Path, pointer: str, wrong: str | None) -> None:
    """Each form a pointer is written in is found, across a comment's line break, and
    judged against the real docs/."""
    example = tmp_path / "example.py"
    example.write_text(f"# {pointer}\n")
    found = missing(references([example], tmp_path))
    if wrong is None:
        assert found == []
    else:
        assert len(found) == 1 and wrong in found[0]
