"""Credentials inside one string of a config, and after a flag in an argument list.

Masking by location replaces a whole value; but a config also carries credentials *inside*
a string that is no credential location, and a schema cannot name them: a command line
(``vllm serve --api-key sk-...``), an argument list (``extra_args = ["--token", "..."]``,
``["-H", "Authorization: Bearer ..."]``), a URL whose query holds the key (``?token=``,
``?api_key=``, an Azure SAS ``&sig=``). So every string in a URL scope (the whole config,
every trace's resolved config: ``mask_locations``) goes through :func:`mask_text`, and every
list there through :func:`masked_arguments`; each replaces only the secret part by
:data:`MASK`, the rest of the string stays readable.

What marks a secret here is where it sits in the text (a URL's userinfo, a query parameter or
a flag named like a secret, a header's value after ``-H``, a password after ``-u`` or a tool's
own password flag; in another format written inside the string, a key named like a secret:
``content/mask_formats.py``), as masking by location, plus one
second net by shape: a value written the way a well-known provider writes its tokens
(:data:`_TOKEN_SHAPES`), wherever it sits in such a string. Why a shape rule at all, when the
design is by location: a token that a user pastes into a free-form string (a note, a
``git clone`` command, a JSON text) has no location and no name, yet these prefixes exist so
that scanners find them, and they are long and random enough that a false match in a config
is unlikely. It is a second net only: most credentials (a vLLM key, a password) have no shape.
docs/masking.md, "Inside strings", says what is covered and what is not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from prime_runs_spool.content import mask_formats
from prime_runs_spool.content.lookalikes import folded_text
from prime_runs_spool.content.mask_locations import MASK, is_secret_name, spelling

#: A URL: a scheme (a letter, then letters, digits, ``+``, ``.``, ``-``), ``://``, and
#: everything up to whitespace (:func:`_urls`).
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_BLANK = re.compile(r"\s")
#: One query (or fragment) parameter of a URL: ``name=value``, the value up to the next
#: separator or a quote.
_QUERY_PARAM = re.compile(r"([?&#;])([^=&#;?\s]+)=([^&#;\s'\"]*)")
#: Query parameter names that carry a credential though no name rule calls them secret
#: (compared in any spelling): Google's ``?key=``, Azure Functions' ``?code=``, Firebase's
#: ``?auth=``, a SAS or a signed URL's ``sig`` and ``signature``.
_QUERY_SECRET_NAMES = frozenset({"key", "code", "auth", "sig", "signature"})
#: A signed URL's signature under a longer name (``X-Amz-Signature``, ``X-Goog-Signature``).
_QUERY_SECRET_ENDINGS = ("signature",)

#: A flag, alone as a list's element or followed by its value in a command line.
_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_.\-]*\Z")
#: A flag in a text (at its start or after a blank: a space, a tab, a line break), and the word after it (a quoted part first, if any, then up to whitespace
#: or a quote), not consumed. Where a value ends, a value masked (``***``) ends again: masking
#: twice changes nothing.
_FLAG_IN_TEXT = re.compile(r"(?<![^ \t\n\r])(--?[A-Za-z][A-Za-z0-9_.\-]*)(?=(\s+)((?:\"[^\"]*\"|'[^']*')?[^\s'\"]*))")
#: ``name=value`` at the start of a token (``--token=...``, ``HF_TOKEN=...``) or after a colon
#: (an ``.npmrc``'s ``//registry/:_authToken=...``, PowerShell's ``$env:HF_TOKEN=...``): the
#: value is quoted or runs up to whitespace, a quote, ``&`` or ``;`` (a shell's separators).
_ASSIGNMENT = re.compile(r"(?<![^\s'\"(\[{,;:])(-{0,2})([A-Za-z_][A-Za-z0-9_.\-]*)=((?:\"[^\"]*\"|'[^']*')?[^\s'\"&;]*)")
#: Flags whose value is a header line (``curl -H``, ``--header``): the value after its colon
#: goes, as every value of a ``headers`` table does.
_HEADER_FLAGS = frozenset({"-H", "--header"})
#: Flags whose value is an environment assignment (``docker run -e HF_TOKEN=...``): the value
#: after ``=`` goes, as every value of an environment table does; ``-e NAME`` alone stays.
#: kubectl's ``--from-literal=NAME=value`` likewise (what ``kubectl create secret`` stores).
_ENV_FLAGS = frozenset({"-e", "--env", "--from-literal"})
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*=")
#: Flags whose value is ``user:password`` (curl's ``-u``, ``--user``): the part after the
#: first colon goes; a value without one is a user alone, and Docker's ``-u 1000:1000``
#: (a user and a group by number) stays.
_USER_FLAGS = frozenset({"-u", "--user"})
_UID_GID = re.compile(r"[0-9]+:[0-9]+\Z")
#: Flag names (any spelling, dashes dropped) that hold a secret though no key called so is one
#: (``sort_key``, ``pass_rate``): curl's ``--key`` and ``--pass``, httpie's ``--auth``, plink's
#: ``-pw``, ``--pwd``, openssl's ``-passin pass:...`` and ``-passout``.
_SECRET_FLAG_NAMES = frozenset({"key", "pass", "auth", "pw", "pwd", "passin", "passout"})
#: One of those flags given its value after ``=`` in the same word (``--env=HF_TOKEN=...``,
#: ``-e=...``, ``--header="X-Key: ..."``: Docker's and Go's flag parsers take that spelling),
#: and that value, a shell word (quoted parts and unquoted characters up to whitespace): the
#: value goes through the same rule as after a blank (:func:`_after_flag`).
_VALUE_FLAG_ASSIGNED = re.compile(
    r"(?<![^\s'\"])(-H|--header|-e|--env|--from-literal|-u|--user)=((?:\"[^\"]*\"|'[^']*'|[^\s'\"])*)")
#: A one-letter flag with its value stuck to it in the same word, as getopt reads it: Docker's
#: ``-eNAME=value`` (an upper-case name: ``-epochs=3`` is a Go flag) and curl's
#: ``-uuser:password``: the value after ``=`` or the first colon.
_STUCK = re.compile(r"(?<![^\s'\"])-(?:e[A-Z][A-Z0-9_]*=|u[^\s'\":=\-][^\s'\":]*:)((?:\"[^\"]*\"|'[^']*'|[^\s'\"])+)")
#: Tools whose password flag is a letter that means something else to other tools (``-p`` is a
#: port to Docker and ssh, a plugin to pytest, "parents" to mkdir), so it is masked only after
#: the tool's own name, in the same command: MySQL's and MariaDB's clients take ``-pPASSWORD``
#: stuck (``-p NAME`` apart is a prompt, then a database's name), sshpass ``-p PASSWORD`` either
#: way, redis-cli ``-a PASSWORD``, MongoDB's shell and tools (``mongosh``, ``mongodump``...)
#: ``-p PASSWORD`` either way, SQL Server's ``sqlcmd`` and ``bcp`` ``-P PASSWORD`` either way, a
#: registry's or a cluster's login (``docker login -p PASSWORD``, Podman's..., the Azure CLI's
#: ``az login``, OpenShift's ``oc login``, Cloud Foundry's ``cf login``, ``oras login``, ``helm
#: registry login``, ``crane auth login``) either way; ``wandb login KEY``, ``vault login TOKEN``
#: and ``ngrok authtoken TOKEN`` (``ngrok config add-authtoken``) take the key as a plain word
#: (every word after it goes).
_TOOL = re.compile(r"(?<![^\s'\"/])(mysql[a-z_]*|mariadb[a-z\-]*|sshpass|redis-cli|mongo[a-z]*|sqlcmd|bcp"
                   r"|(?:docker|podman|nerdctl|buildah|skopeo|az|wandb|vault|oc|cf|oras|(?:helm|regctl)[ \t]+registry"
                   r"|crane[ \t]+auth)[ \t]+login|ngrok[ \t]+(?:config[ \t]+add-)?authtoken)(?![^\s'\"])")
_KEY_AS_WORD_TOOLS = ("wandb", "vault", "ngrok")
#: What :func:`_tool_kind` calls a tool whose key is a plain word.
_KEY_AS_WORD = "word"
_WORD_IN_COMMAND = re.compile(r"(?<![^\s'\"])(\"[^\"]*\"|'[^']*'|[^\s'\"\-][^\s'\"]*)")
#: The last words of a tool's name in a list (``["helm", "registry", "login", ...]``), where
#: :data:`_TOOL` is asked of the words before them joined.
_TOOL_LAST_WORDS = frozenset({"login", "authtoken", "add-authtoken"})
#: A tool's password flag given stuck (``-pPASSWORD``), by the tool's kind (:func:`_tool_kind`).
_STUCK_PASSWORD_FLAGS = {"mysql": "-p", "mariadb": "-p", "sshpass": "-p", "login": "-p", "mongo": "-p",
                         "sqlcmd": "-P"}
_APART_PASSWORD_FLAGS = {"sshpass": "-p", "redis-cli": "-a", "login": "-p", "mongo": "-p", "sqlcmd": "-P"}
_APART_PASSWORD = {tool: re.compile(rf"(?<![^\s'\"]){flag}[ \t]+((?:\"[^\"]*\"|'[^']*')?[^\s'\"]*)")
                   for tool, flag in _APART_PASSWORD_FLAGS.items()}
#: A command's words, up to ``;``, ``&``, ``|`` or a line's end outside quotes.
_COMMAND = re.compile(r"(?:\"[^\"]*\"|'[^']*'|[^;&|\n'\"]|['\"])*")
#: A flag and its value as a list printed into a string (Python's ``['--token', '...']``,
#: JSON's ``["-H", "..."]``): each quoted, a comma between (the value looked ahead: it may be
#: a flag itself).
_QUOTED_FLAG = re.compile(r"([\"'])(--?[A-Za-z][A-Za-z0-9_.\-]*)\1(?=[ \t]*,[ \t]*([\"'])((?:(?!\3).)*)\3)")
#: A setting's value given to a tool's ``set`` or ``config`` command (``aws configure set
#: aws_secret_access_key VALUE``, ``npm config set //registry/:_authToken VALUE``, ``git
#: config --global github.token VALUE``): masked when the setting is named like a secret.
_SET_COMMAND = frozenset({"set", "config"})
_SETTING = re.compile(r"(?<![^\s'\"])(?:set|config)(?=(?:[ \t]+--?[A-Za-z][A-Za-z\-]*)*[ \t]+([^\s'\"=\-][^\s'\"=]*)"
                      r"[ \t]+((?:\"[^\"]*\"|'[^']*')?[^\s'\"]*))")  # looked ahead: ``config set`` is two
_STUCK_PASSWORD = {flag: re.compile(rf"(?<![^\s'\"]){flag}((?:\"[^\"]*\"|'[^']*'|[^\s'\"])+)")
                   for flag in set(_STUCK_PASSWORD_FLAGS.values())}

#: Values written the way a well-known provider writes its tokens: OpenAI and Anthropic
#: (``sk-``), Stripe (``sk_live_``), GitHub (``ghp_``, ``gho_``, ... and ``github_pat_``),
#: Hugging Face (``hf_``), Slack (``xoxb-``, ``xoxp-``, ...), an AWS access key id
#: (``AKIA``, ``ASIA``), GitLab (``glpat-``), Google (``AIza``), a JWT (three base64url
#: parts, the first two ``eyJ``), Groq (``gsk_``), Replicate (``r8_``), Perplexity
#: (``pplx-``), xAI (``xai-``), NVIDIA (``nvapi-``), npm (``npm_``), PyPI (``pypi-AgE``),
#: Docker Hub (``dckr_pat_``), DigitalOcean (``dop_v1_``), LangSmith (``lsv2_``), SendGrid
#: (``SG.``), Databricks (``dapi``), Linear (``lin_api_``) and Notion (``ntn_``). Each needs enough characters after its prefix that words,
#: ids and paths do not match (``hf_home``, ``sk-learn``, ``task-1``), and must not follow a
#: letter or a digit (:func:`_tokens`: a pattern that starts with its prefixes' letters is
#: searched several times faster than one that starts by looking behind).
_TOKEN_SHAPES = re.compile(
    r"(?:"
    r"sk-[A-Za-z0-9_\-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{22,}|hf_[A-Za-z0-9]{30,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])|glpat-[A-Za-z0-9_\-]{20,}|AIza[A-Za-z0-9_\-]{35}"
    r"|eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"
    r"|gsk_[A-Za-z0-9]{40,}|r8_[A-Za-z0-9]{30,}|pplx-[A-Za-z0-9]{40,}|xai-[A-Za-z0-9]{40,}|nvapi-[A-Za-z0-9_\-]{40,}"
    r"|npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_\-]{50,}|dckr_pat_[A-Za-z0-9_\-]{20,}|dop_v1_[a-f0-9]{64}"
    r"|lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}|SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}|dapi[a-f0-9]{32}"
    r"|lin_api_[A-Za-z0-9]{40}|ntn_[A-Za-z0-9]{40,})")
#: Short strings already masked, and what they mask to (:data:`_SAME`: nothing changes). A
#: config's strings repeat from one episode to the next even where its configs do not (a
#: per-episode seed), and the rules' tests cost several thousand instructions a string where
#: a lookup costs a few hundred. Bounded: cleared past :data:`_CACHE_ENTRIES`, and only
#: strings of at most :data:`_CACHED_CHARS` kept. A dict's lookups and inserts are safe
#: between threads.
_CACHE: dict[str, str] = {}
_CACHE_ENTRIES = 4096
_CACHED_CHARS = 256
_SAME = object()


def mask_text(text: str) -> str:
    """``text`` with what it holds of a credential replaced by :data:`MASK`: every URL's
    userinfo and secret query parameters, the value after a flag or in an assignment named
    like a secret (or ``--key``, ``--pass``...), a header's value after ``-H``, an environment
    value after ``-e`` (after a blank, after ``=``: ``--env=NAME=value``, or stuck), curl's
    ``-u user:password``'s password, a MySQL client's ``-pPASSWORD``, what
    ``content/mask_formats.py`` finds written in another format (JSON, a header line, a PEM
    key...), and every value shaped like a well-known token. The same object when nothing
    changes."""
    found = _CACHE.get(text)
    if found is not None:
        return text if found is _SAME else found
    masked = _masked(text)
    if len(text) <= _CACHED_CHARS and type(text) is str:
        if len(_CACHE) >= _CACHE_ENTRIES:
            _CACHE.clear()
        _CACHE[text] = _SAME if masked is text else masked  # type: ignore[assignment]
    return masked


def mask_new_text(text: str) -> str:
    """:func:`mask_text` of a value new every time (a box's id, one per rollout), without the
    cache: it would never be asked again, and would only push out strings that repeat. An id
    as runtimes write them is passed by one search (:data:`not_in_id`)."""
    return text if not_in_id(text) is None else _masked(text)


def _masked(text: str) -> str:
    """:func:`mask_text`, computed."""
    if not _maybe(text):
        return text
    masked = _masked_once(text)
    # The rules end a value at different marks (a query's at ``;``, a userinfo's at the last
    # ``@``), so a mask can join what one rule cut to what another reads as a value: masked
    # again until nothing changes, what sync and mirror do to a record changes nothing more.
    for _ in range(_MAX_PASSES):
        if masked is text:
            return text
        text, masked = masked, _masked_once(masked)
    return masked


#: Passes of :func:`_masked_once` at most (one changes something only where two rules meet).
_MAX_PASSES = 8


def _masked_once(text: str) -> str:
    """One pass of every rule of :func:`mask_text` over ``text``, and over ``text`` read as its
    letters look when it is not ASCII (:func:`_lookalike_spans`)."""
    spans = _spans(text)
    if not text.isascii():
        spans.extend(_lookalike_spans(text))
    return _replaced(text, spans)


def _lookalike_spans(text: str) -> list[tuple[int, int]]:
    """What the rules find in ``text`` read as its letters look (content/lookalikes.py): a flag
    or a name written in lookalike letters (``--аpi-key`` with a Cyrillic ``а``,
    ``ＨＦ＿ＴＯＫＥＮ=``, a zero-width space inside, ``—api-key`` after a word processor made
    an em dash of ``--``) reads as the one a person sees, as a key's name does; the spans are
    those of ``text`` as written, whose value is masked as it was, never folded."""
    folded, origin = folded_text(text)
    if folded == text:
        return []
    return [(origin[start], origin[end - 1] + 1) for start, end in _spans(folded) if end > start]


def _spans(text: str) -> list[tuple[int, int]]:
    """Where every rule of :func:`mask_text` finds a secret in ``text``."""
    spans: list[tuple[int, int]] = []
    if "://" in text:
        for start, end in _urls(text):
            spans.extend(_url_spans(text[start:end], start))
    for flag in _FLAG_IN_TEXT.finditer(text) if _may_hold_flag(text) else ():
        value = flag.group(3)
        quoted = value[:1] in ("'", '"') and len(value) >= 2 and value.find(value[0], 1) == len(value) - 1
        inner = value[1:-1] if quoted else value
        start = flag.end() + len(flag.group(2)) + (1 if quoted else 0)
        spans.extend((start + begin, start + end) for begin, end in _after_flag(flag.group(1), inner))
    for assignment in _ASSIGNMENT.finditer(text) if "=" in text else ():
        if is_secret_name(assignment.group(2)) or (assignment.group(1) and _is_secret_flag(assignment.group(2))):
            spans.append(assignment.span(3))
    for assigned in _VALUE_FLAG_ASSIGNED.finditer(text) if "=" in text and "-" in text else ():
        value = assigned.group(2)
        quoted = value[:1] in ("'", '"') and len(value) >= 2 and value.find(value[0], 1) == len(value) - 1
        start = assigned.start(2) + (1 if quoted else 0)
        spans.extend((start + begin, start + end)
                     for begin, end in _after_flag(assigned.group(1), value[1:-1] if quoted else value))
    if "'-" in text or '"-' in text:  # a list printed or written as JSON: ``['--token', '...']``
        for quoted in _QUOTED_FLAG.finditer(text):
            start = quoted.start(4)
            spans.extend((start + begin, start + end) for begin, end in _after_flag(quoted.group(2), quoted.group(4)))
    if "-" in text:
        spans.extend(match.span(1) for match in _STUCK.finditer(text) if not _UID_GID.match(match.group(0)[2:]))
        if "mysql" in text or "mariadb" in text or "sshpass" in text or "redis-cli" in text or "login" in text \
                or "mongo" in text or "sqlcmd" in text or "bcp" in text or "authtoken" in text:
            spans.extend(_tool_spans(text))
    elif "login" in text or "authtoken" in text:
        spans.extend(_tool_spans(text))  # ``wandb login KEY``, ``ngrok authtoken KEY``: no dash needed
    if "set" in text or "config" in text:
        spans.extend(match.span(2) for match in _SETTING.finditer(text) if is_secret_name(match.group(1)))
    if _may_hold_token(text):
        spans.extend(_tokens(text))
    if mask_formats.maybe(text):
        spans.extend(mask_formats.format_spans(text))
    return spans


def _tool_kind(name: str) -> str:
    """A tool of :data:`_TOOL` as :data:`_APART_PASSWORD_FLAGS` names it: a registry's or a
    cluster's ``login``, whichever program's; :data:`_KEY_AS_WORD` for ``wandb login``,
    ``vault login`` and ``ngrok authtoken``, whose key is a plain word; ``mongo`` for MongoDB's
    shell and tools, ``mysql`` and ``mariadb`` for theirs; the name itself for the others."""
    if name.startswith(_KEY_AS_WORD_TOOLS):
        return _KEY_AS_WORD
    if name.endswith("login"):
        return "login"
    for family in ("mysql", "mariadb", "mongo"):
        if name.startswith(family):
            return family
    return "sqlcmd" if name == "bcp" else name


def _tool_spans(text: str) -> list[tuple[int, int]]:
    """The passwords given to a tool of :data:`_TOOL` by its own flag, in the command (up to
    ``;``, ``&``, ``|`` or a line's end) that names it."""
    spans = []
    for tool in _TOOL.finditer(text):
        kind = _tool_kind(tool.group(1))
        command_end = _COMMAND.match(text, tool.end()).end()
        stuck = _STUCK_PASSWORD_FLAGS.get(kind)
        if stuck is not None:
            spans.extend(match.span(1) for match in _STUCK_PASSWORD[stuck].finditer(text, tool.end(), command_end))
        if kind == _KEY_AS_WORD:
            spans.extend(match.span(1) for match in _WORD_IN_COMMAND.finditer(text, tool.end(), command_end))
        apart = _APART_PASSWORD.get(kind)
        if apart is not None:
            spans.extend(match.span(1) for match in apart.finditer(text, tool.end(), command_end))
    return spans


#: The starts of :data:`_TOKEN_SHAPES`' tokens that a word of letters, digits and dashes can hold
#: (:func:`_maybe`): one search, where the substring tests cost several times more.
_WORD_TOKEN = re.compile(r"sk-|xox|glpat-|pplx-|xai-|nvapi-|pypi-|IA|AIza|dapi")
#: The characters of an id as runtimes write them (``vf-5c1e9a7b0d2f``, a container's hex): digits,
#: dashes and lower-case letters but k, p and x. No rule of :func:`mask_text` changes a text of
#: them: with a letter or digit it is a word :func:`_maybe` passes unless :data:`_WORD_TOKEN` finds
#: a token's start, and each of those holds a k, a p, an x or an upper-case letter; only dashes
#: (or nothing), it holds no name, value, URL or token at all.
ID_CHARACTERS = "0123456789abcdefghijlmnoqrstuvwyz-"
#: ``not_in_id(text) is None``: ``text`` is of :data:`ID_CHARACTERS` only. One search for a
#: character outside them (about 1.5k instructions; a match made, as a pattern of the id's
#: whole shape makes it, 3.4k), for a box's id, new in every rollout (content/mask_beside.py).
not_in_id = re.compile(f"[^{re.escape(ID_CHARACTERS)}]").search


def _maybe(text: str) -> bool:
    """Whether a rule of :func:`mask_text` can change ``text`` (true for every text one can,
    and for some others); most config strings (a model's name, an id, a number as text) are
    passed by a few substring tests: a regular expression's search costs several times more.
    One word of letters, digits and dashes (a box's id, new in every rollout: ``vf-5c1e9a7b``)
    can hold no flag's value, assignment, URL or format, only a token by its shape: a third of
    the tests."""
    if text.replace("-", "").isalnum():
        return _WORD_TOKEN.search(text) is not None
    return "=" in text or "://" in text or _may_hold_flag(text) or _may_hold_token(text) or mask_formats.maybe(text) \
        or "set" in text or "config" in text or "login" in text or "authtoken" in text or "'-" in text or '"-' in text \
        or not text.isascii()  # read as its letters look, it may hold any of them (_lookalike_spans)


def _may_hold_flag(text: str) -> bool:
    """Whether ``text`` has a ``-`` at its start or after a blank (:data:`_FLAG_IN_TEXT`)."""
    return "-" in text and (text[:1] == "-" or " -" in text or "\n-" in text or "\t-" in text or "\r-" in text)


def _may_hold_token(text: str) -> bool:
    """Whether ``text`` holds the start of a token :data:`_TOKEN_SHAPES` knows."""
    return (("-" in text and ("sk-" in text or "xox" in text or "glpat-" in text or "pplx-" in text or "xai-" in text
                              or "nvapi-" in text or "pypi-" in text))
            or ("_" in text and ("k_" in text or "gh" in text or "github_pat_" in text or "hf_" in text or "r8_" in text
                                 or "npm_" in text or "dckr_" in text or "dop_" in text or "lsv2_" in text
                                 or "lin_" in text or "ntn_" in text))
            or "IA" in text or "AIza" in text or "eyJ" in text or "SG." in text or "dapi" in text)  # AKIA, ASIA


def mask_url_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by :data:`MASK`, and nothing else:
    what a URL shown to the user gets (a proxy's, the platform's address)."""
    if "@" not in text or "://" not in text:
        return text
    spans: list[tuple[int, int]] = []
    for start, end in _urls(text):
        spans.extend(_url_spans(text[start:end], start, query=False))
    return _replaced(text, spans)


def mask_given_url(url: str) -> str:
    """``url``, one URL a user gave (a base URL, a proxy's), as a message may show it: any
    ``user:password@`` masked both where a parser ends the authority (at the first ``/``,
    which keeps a password holding white space from showing: :func:`mask_url_userinfo`
    reads a URL up to white space) and as masking finds userinfo (up to the last ``@``,
    which keeps a password holding ``/`` from showing)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = f"{MASK}@" + authority.rpartition("@")[2]
    return mask_url_userinfo(f"{scheme}://{authority}{slash}{path}")


def mask_url(text: str) -> str:
    """``text`` with the userinfo and the secret query parameters of every URL in it masked,
    and nothing else: what a key gets (a URL used as a key, ``{"https://...?token=": ...}``)."""
    if "://" not in text:
        return text
    spans: list[tuple[int, int]] = []
    for start, end in _urls(text):
        spans.extend(_url_spans(text[start:end], start))
    return _replaced(text, spans)


def masked_arguments(items: Sequence[Any] | dict[Any, Any]) -> dict[Any, Any] | None:
    """What an argument list (``["--api-key", "sk-..."]``) has masked after its flags: by
    position, the element's replacement; ``None`` when nothing is. An element that is a flag
    taking a secret has the next element (not ``None``) masked whole, whatever it is (a
    number, a table, a list: :data:`MASK`), one that is ``-H``/``--header`` the value of the
    header line after it, one that is ``-e``/``--env`` the value of the ``NAME=value`` after
    it, one that is ``-u``/``--user`` the password of the ``user:password`` after it; a table
    after ``-H`` or ``-e`` has every value masked (a plan of its keys, masking.py's), as a
    ``headers`` table's. After a tool of :data:`_TOOL` (an element naming it, a path's last
    part), its password flag's value too (``["mysql", "-pPASSWORD"]``); after ``set`` or
    ``config`` and a setting named like a secret, its value. A pair ``[name, value]`` whose
    name is named like a secret has its value masked; so does a mapping ``{name, value}``
    (:func:`_masked_pair`). What an element holds by itself (``--token=...``) is
    :func:`mask_text`'s."""
    if isinstance(items, dict):
        return _masked_pair(items)
    if len(items) < 2:  # most lists of a config: nothing can follow a flag
        return None
    if len(items) == 2 and type(items[0]) is str and items[0][:1] != "-" and is_secret_name(items[0]):
        # a header or a variable as a pair (``[["X-Api-Key", "..."]]``, a list of tuples)
        return None if items[1] is None or _is_mask(items[1]) else {1: MASK}
    found: dict[int, Any] | None = None
    flag = None
    tool = None
    for index, item in enumerate(items):
        replacement = None
        if flag is not None and item is not None and not (type(item) is str and item == MASK):
            if isinstance(item, str):
                spans = _after_flag(flag, item)
                if not spans and tool is not None and flag == _APART_PASSWORD_FLAGS.get(tool):
                    spans = [(0, len(item))]
                replacement = _replaced(item, spans) if spans else None
            elif isinstance(item, dict) and (flag in _HEADER_FLAGS or flag in _ENV_FLAGS):
                replacement = {key: MASK for key, value in item.items() if value is not None and not _is_mask(value)}
                replacement = replacement or None  # a plan: every value of the table masked
            elif _is_secret_flag(flag):
                replacement = MASK  # a key given as a number, a table or a list is a key too: whole
        if replacement is None and index >= 2 and item is not None and not _is_mask(item) \
                and type(items[index - 2]) is str and items[index - 2] in _SET_COMMAND \
                and type(items[index - 1]) is str and is_secret_name(items[index - 1]):
            replacement = MASK  # ["aws", "configure", "set", "aws_secret_access_key", "..."]
        if replacement is None and tool == _KEY_AS_WORD and type(item) is str and item[:1] != "-" and item != MASK:
            replacement = MASK  # ``["wandb", "login", KEY]``
        if replacement is None and tool is not None and type(item) is str and len(item) > 2 \
                and item[:2] == _STUCK_PASSWORD_FLAGS.get(tool) and item[2:] != MASK:
            replacement = item[:2] + MASK
        if replacement is not None and replacement is not item:
            if found is None:
                found = {}
            found[index] = replacement
            flag = None
            continue  # a value, not a flag
        if type(item) is str:
            as_flag = item if item.isascii() else folded_text(item)[0]  # ``--аpi-key``: the flag it looks like
            if as_flag[:1] == "-" and _FLAG.match(as_flag):
                flag = as_flag
                continue
            named = _TOOL.fullmatch(item.rsplit("/", 1)[-1])
            if named is not None:
                tool = _tool_kind(named.group(1))
            elif item in _TOOL_LAST_WORDS:
                tool = _tool_named_by(items, index) or tool
        flag = None
    return found


def _tool_named_by(items: Sequence[Any], index: int) -> str | None:
    """The kind of the tool whose name's words end at ``items[index]`` (``["oc", "login"]``,
    ``["helm", "registry", "login"]``, ``["ngrok", "config", "add-authtoken"]``; the first a
    path's last part), or ``None``."""
    for start in range(index - 1, max(index - 3, 0) - 1, -1):
        words = items[start:index + 1]
        if not all(type(word) is str for word in words):
            return None
        named = _TOOL.fullmatch(" ".join((words[0].rsplit("/", 1)[-1], *words[1:])))
        if named is not None:
            return _tool_kind(named.group(1))
    return None


#: The keys of a variable or a header given as a mapping of its name and its value
#: (Kubernetes' ``{name, value}``, ``{key, value}``) outside an environment table.
_PAIR_NAMES = ("name", "key")


def _masked_pair(pair: dict[Any, Any]) -> dict[str, Any] | None:
    """A ``{"name": "HF_TOKEN", "value": "..."}`` whose name is named like a secret: its value
    masked (a plan, masking.py's); ``None`` otherwise."""
    value = pair.get("value")
    if value is None or _is_mask(value):
        return None
    for key in _PAIR_NAMES:
        name = pair.get(key)
        if type(name) is str and is_secret_name(name):
            return {"value": MASK}
    return None


def _is_mask(value: Any) -> bool:
    return type(value) is str and value == MASK


def _after_flag(flag: str, value: str) -> list[tuple[int, int]]:
    """What of ``value`` (unquoted) following ``flag`` is a secret, as spans (none: nothing).
    A table written as text after ``-H`` or ``-e`` (``'{"X-Key": "..."}'``) has every value."""
    if not value or value == MASK:
        return []
    if flag in _HEADER_FLAGS or flag in _ENV_FLAGS:
        if value[:1] in ("{", "["):
            return mask_formats.table_spans(value, 0, len(value))
        if flag in _ENV_FLAGS:
            folded, origin = folded_text(value)  # ``ＨＦ＿ＴＯＫＥＮ=...``: the name it looks like
            assignment = _ENV_ASSIGNMENT.match(folded)
            end = origin[assignment.end() - 1] + 1 if assignment else len(value)
            return [(end, len(value))] if end < len(value) else []
        colon = value.find(":")
        if colon < 0:
            return [(0, len(value))]
        start = colon + 1
        while start < len(value) and value[start] == " ":
            start += 1
        return [(start, len(value))] if start < len(value) else []
    if flag in _USER_FLAGS:
        colon = value.find(":")
        return [(colon + 1, len(value))] if 0 <= colon < len(value) - 1 and not _UID_GID.match(value) else []
    return [(0, len(value))] if _is_secret_flag(flag) else []


def _is_secret_flag(flag: str) -> bool:
    """Whether ``flag`` (with or without its dashes) takes a secret: named like a secret, or
    one of :data:`_SECRET_FLAG_NAMES`."""
    name = flag.lstrip("-")
    return is_secret_name(name) or spelling(name) in _SECRET_FLAG_NAMES


def _urls(text: str) -> list[tuple[int, int]]:
    """Where the URLs of ``text`` are: each from the first letter of the scheme before a
    ``://`` to the next whitespace (or the end). Found from each ``://`` outwards: a search
    for the scheme's pattern tries every position of the text."""
    found = []
    at = text.find("://")
    while at >= 0:
        start = at
        while start > 0 and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < at and not text[start].isalpha():  # (the scheme's characters are ASCII)
            start += 1  # a scheme starts with a letter
        blank = _BLANK.search(text, at + 3)
        end = len(text) if blank is None else blank.start()
        if start < at:
            found.append((start, end))
        at = text.find("://", end if start < at else at + 3)
    return found


def _tokens(text: str) -> list[tuple[int, int]]:
    """Where the values shaped like a well-known token are (:data:`_TOKEN_SHAPES`), each at
    the start of a word: not after a letter or a digit."""
    found = []
    match = _TOKEN_SHAPES.search(text)
    while match is not None:
        start = match.start()
        if start and text[start - 1].isascii() and text[start - 1].isalnum():
            match = _TOKEN_SHAPES.search(text, start + 1)
            continue
        found.append(match.span())
        match = _TOKEN_SHAPES.search(text, match.end())
    return found


def _url_spans(url: str, offset: int, query: bool = True) -> list[tuple[int, int]]:
    """The spans of ``url`` (at ``offset`` in its text) that are secret: its userinfo (from
    ``://`` to the last ``@``, as docs/masking.md says) and each secret query parameter's value."""
    spans = []
    start = url.index("://") + 3
    at = url.rfind("@")
    if at >= start:
        spans.append((offset + start, offset + at))
        start = at + 1
    if not query:
        return spans
    begins = min((i for i in (url.find("?", start), url.find("#", start)) if i >= 0), default=-1)
    if begins >= 0:
        for param in _QUERY_PARAM.finditer(url, begins):
            if param.group(3) and _is_query_secret(param.group(2)):
                spans.append((offset + param.start(3), offset + param.end(3)))
    return spans


def _is_query_secret(name: str) -> bool:
    """Whether a query parameter called ``name`` (percent-encoded or not) holds a credential."""
    name = unquote(name)
    spelled = spelling(name)
    return spelled in _QUERY_SECRET_NAMES or spelled.endswith(_QUERY_SECRET_ENDINGS) or is_secret_name(name)


def _replaced(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each span (overlapping ones merged) replaced by :data:`MASK`; a span that
    already reads ``***`` is left, so masking twice changes nothing."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        elif start < end:
            merged.append([start, end])
    out = []
    position = 0
    for start, end in merged:
        if text[start:end] == MASK:
            continue
        out.append(text[position:start])
        out.append(MASK)
        position = end
    if not out:
        return text
    out.append(text[position:])
    return "".join(out)
