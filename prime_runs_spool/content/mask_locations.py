"""The default credential rules: mask by *location*, and by a key's name where the config is free-form.

A verifiers config (and every trace's resolved seat config) can carry a credential in a
few kinds of places: a client's API key, a headers or query table (``headers``,
``extra_headers``, ``default_headers``, ...), an environment table handed to a harness or a
sandbox (``harness.env``, ``env_vars``), and the userinfo of a URL (``user:pass@``).
Whatever a key in such a table is called, its value may be a secret, and no key-name
heuristic can be trusted to spot one, so every value at those locations is replaced by
:data:`MASK`; keys stay, so a reader still sees that a header was set.

An environment's own arguments have no schema to name locations in: a ``judge_api_key``,
``hf_token`` or ``db_password`` there is a secret only by its name. So a key whose name is
secret-shaped (:func:`is_secret_name`) has its value masked too, at any depth of a config:
the name rule adds to the locations, it never replaces them. What is masked *inside* a
string (a URL's userinfo and query, a flag's value, a token by its shape) is
``mask_text``'s, in the subtrees the URL scopes below name.

These are the default rules as data, apart from the walk that applies them (``masking``):
raising :data:`MASKING_VERSION` when they change is the one thing to remember here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prime_runs_spool.content.lookalikes import folded_name


#: What a masked value becomes.
MASK = "***"

#: The version of the default locations below, recorded in every manifest
#: (``masking_version``). Raise it whenever a location is added: sync then masks the
#: records of spools written under an older version again before they travel
#: (content/remask.py). A manifest without the field predates it (version 0).
MASKING_VERSION = 21

#: A location: one segment per mapping key or list index, from the root (see masking.py).
Pattern = tuple[str, ...]

#: A pattern segment's prefix: ``~headers`` matches one key spelled ``headers`` in any case,
#: with or without ``_`` and ``-`` (``Headers``, ``HEADERS``, ``Extra-Headers`` for
#: ``~extra_headers``, ``extraHeaders``). A credential location is told by what its name
#: means, not how a user capitalized it: HTTP header tables, environment tables and key
#: names are written every way (``Headers`` in a hand-written TOML, ``defaultHeaders`` from
#: a JavaScript client's options), and a secret under any of them is still a secret.
ANY_SPELLING = "~"


def parse_pattern(pattern: str | Iterable[str]) -> Pattern:
    """A pattern from dotted text (``"env.*.harness.env.*"``) or a sequence of segments.

    Use the sequence form for a key that itself contains a dot.
    """
    segments = tuple(pattern.split(".")) if isinstance(pattern, str) else tuple(pattern)
    if not segments or any(not isinstance(s, str) or s in ("", ANY_SPELLING) for s in segments):
        raise ValueError(f"invalid mask pattern: {pattern!r}")
    if segments[-1] == "**":
        raise ValueError(f"a mask pattern cannot end in '**': {pattern!r}")
    return segments


def spelling(name: str) -> str:
    """``name`` as :data:`ANY_SPELLING` compares it: case folded, ``_`` and ``-`` dropped, its
    lookalike letters read as what they look like (content/lookalikes.py: ``hеaders`` with a
    Cyrillic ``е``)."""
    return folded_name(name).casefold().replace("_", "").replace("-", "")


def _any_spelling(*names: str) -> Pattern:
    """A location after ``**`` whose every name matches in any spelling."""
    return ("**", *(ANY_SPELLING + name for name in names))

#: Tables whose every entry may be a credential by their own name, wherever they sit in a
#: config: HTTP headers (a client's, a judge's, a request's ``sampling_args``), query
#: parameters (some providers take the key as ``?key=``) and environment tables. Also what
#: a table of that name written as text inside a string has masked (content/mask_formats.py).
_TABLE_NAMES = ("headers", "extra_headers", "default_headers", "default_query", "extra_query", "env_vars",
                "environment_variables")
TEXT_TABLE_NAMES = frozenset(spelling(name) for name in _TABLE_NAMES)
_TABLES: tuple[Pattern, ...] = (
    *((*_any_spelling(name), "*") for name in _TABLE_NAMES),
    (*_any_spelling("harness", "env"), "*"),
    (*_any_spelling("runtime", "env"), "*"),
)

#: A pattern segment matching one key shaped like an environment variable's name
#: (:func:`is_env_var_name`: ``HF_TOKEN``, ``WANDB_API_KEY``).
ENV_VAR_NAME = "{envvar}"
#: A pattern segment matching one list position (a key of digits only): an environment
#: table given as a list, Docker's ``["HF_TOKEN=..."]`` or Kubernetes' ``[{name, value}]``,
#: has every entry masked whole. Not under ``envs``, where a list is one of environment ids.
LIST_POSITION = "{index}"

#: Environment tables by their other common names: a sandbox's or a container's ``env``,
#: ``envs``, ``environment``. These names also hold what is no credential (a verifiers
#: config's ``env`` is the environment's own config, ``id``, ``taskset``...; an
#: ``environment`` may be an id string, ``envs`` a list of ids), so only the entries
#: whose keys are shaped like environment variables are masked there.
_ENV_TABLES: tuple[Pattern, ...] = (
    (*_any_spelling("env"), ENV_VAR_NAME),
    (*_any_spelling("envs"), ENV_VAR_NAME),
    (*_any_spelling("environment"), ENV_VAR_NAME),
    (*_any_spelling("env"), LIST_POSITION),
    (*_any_spelling("environment"), LIST_POSITION),
)
_ENV_VAR = re.compile(r"[A-Z][A-Z0-9]*(?:_+[A-Z0-9]+)*_*\Z")


def is_env_var_name(name: str) -> bool:
    """Whether ``name`` is written like an environment variable: upper case, digits and
    underscores, starting with a letter (``HF_TOKEN``, ``PIP_INDEX_URL``); never a
    config's own lower-case field (``id``, ``taskset``). Lookalike letters read as what they
    look like (``ＨＦ＿ＴＯＫＥＮ``)."""
    return _ENV_VAR.match(folded_name(name)) is not None

#: A pattern segment matching one key whose name is secret-shaped (:func:`is_secret_name`),
#: as ``*`` matches any one key.
SECRET_NAME = "{secret}"

#: Single values that are a credential, wherever they sit in a config: the API key and
#: bearer tokens OpenAI-compatible clients take as constructor arguments, and the value of
#: any key named like a secret (an environment's arguments, any free-form table).
_VALUES: tuple[Pattern, ...] = (
    _any_spelling("api_key"),
    _any_spelling("auth_token"),
    _any_spelling("azure_ad_token"),
    ("**", SECRET_NAME),
)

#: A name whose last word is one of these is secret-shaped: ``hf_token``, ``db_password``,
#: ``client_secret``, ``credentials``. Only the last word: ``token_budget``,
#: ``secret_name`` or ``password_file`` name something about a secret, not the secret.
#: Plurals too (a list of keys rotated, a ``secrets`` table), but never ``tokens``: that
#: last word counts something (``max_tokens``).
_SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "token", "credential", "credentials",
                           "apikey", "authorization", "bearer", "cookie", "passwords", "passwds", "passphrases",
                           "secrets", "apikeys", "cookies", "jwt", "webhook", "webhooks", "pgpass"})
#: ``key`` (or ``keys``) is a secret only after one of these: ``api_key``,
#: ``aws_secret_access_key``, ``private_keys``; never ``sort_key`` or ``answer_key``.
_KEY_WORDS = frozenset({"key", "keys"})
_KEY_KINDS = frozenset({"api", "access", "secret", "private", "auth", "signing", "encryption", "session",
                        "master", "client", "account", "service", "subscription", "license", "ssh", "hmac"})
#: ``tokens`` counts (``max_tokens``, ``special_tokens``), except after one of these:
#: ``access_tokens``, ``HF_TOKENS``, ``refresh_tokens`` hold credentials.
_TOKEN_KINDS = frozenset({"access", "auth", "api", "refresh", "bearer", "session", "oauth", "hf", "github", "gh",
                          "bot", "slack", "personal"})
#: ``pat`` (a personal access token) only after one of these: ``github_pat``, ``GH_PAT``,
#: ``AZURE_DEVOPS_PAT``; alone it may be a pattern (``file_pat``), so it is not a secret.
_PAT_KINDS = _TOKEN_KINDS | {"gitlab", "ado", "devops", "azure", "git", "bitbucket"}
#: A webhook's URL is its credential (Slack's and Discord's carry the secret in the path):
#: ``webhook``, ``slack_webhook_url``, ``webhookUrl``.
_WEBHOOK_URL = (["webhook", "url"], ["webhook", "urls"])
#: Run together without separators (``openaiapikey``, ``githubtoken``): the name ends in one.
_SECRET_ENDINGS = ("apikey", "accesskey", "secretkey", "privatekey", "password", "passwd", "secret", "token",
                   "apikeys", "accesskeys", "secretkeys", "privatekeys", "passwords", "secrets")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: A last word saying how a credential is written inline: a service account's JSON, a key
#: in PEM, either in base64 (``_B64``: the word ``b``, digits dropped; ``_base64``). Dropped,
#: the rest of the name is judged: ``private_key_pem``, ``GOOGLE_APPLICATION_CREDENTIALS_JSON``,
#: ``HF_TOKEN_B64``, ``gcp_credentials_base64``; ``dataset_json`` stays plain.
_INLINE_FORMATS = frozenset({"json", "pem", "b", "base", "encoded"})


def is_secret_name(name: str) -> bool:
    """Whether a key called ``name`` is named like a secret: its last word (split at
    ``_``, ``-``, ``.``, spaces, digits and camelCase) is ``token``, ``password``, ``secret``,
    ``credentials``... (:data:`_SECRET_WORDS`), or it is ``key`` after ``api``,
    ``access``, ``private``... (:data:`_KEY_KINDS`), or ``connection_string``, plurals
    included (``api_keys``, ``secrets``); or the name run together ends in ``apikey``,
    ``token``, ``password``... A name that says it holds
    the *name* of a secret (``api_key_var``, ``token_env``) or counts something
    (``max_tokens``) is not. Lookalike letters read as what they look like (content/lookalikes.py:
    ``pаssword`` with a Cyrillic ``а``, ``ｔｏｋｅｎ``), so the rules see the name a reader sees."""
    words = [word.lower() for word in _WORD.findall(folded_name(name)) if not word.isdigit()]  # ``password2``: a password
    if not words:
        return False
    inline = False
    while len(words) >= 2 and words[-1] in _INLINE_FORMATS and words[-1] != "pem":  # ``_JSON_B64``: each way
        words = words[:-1]  # the credential written inline: judged by what it is
        inline = True
    if words[-1] == "pem":  # a PEM block is a private key or a certificate
        return True
    if inline and words[-2:] == ["service", "account"]:  # a service account's key file, inline
        return True
    return _secret_words(words)


def _secret_words(words: list[str]) -> bool:
    last = words[-1]
    if last in _SECRET_WORDS:
        return True
    if len(words) >= 2 and ((last in _KEY_WORDS and words[-2] in _KEY_KINDS) or words[-2:] == ["connection", "string"]
                            or (last == "tokens" and words[-2] in _TOKEN_KINDS)
                            or (last in ("pat", "pats") and words[-2] in _PAT_KINDS) or words[-2:] in _WEBHOOK_URL):
        return True
    return len(words) == 1 and last.endswith(_SECRET_ENDINGS)

#: The credential locations of a verifiers eval config (docs/masking.md, "Where
#: credentials sit"): any seat, any nesting, no list of seat names.
CONFIG_PATTERNS: tuple[Pattern, ...] = _TABLES + _ENV_TABLES + _VALUES

#: Where a trace of an episode record keeps its seat's resolved config.
TRACE_CONFIG: Pattern = ("traces", "*", "agent", "config")
#: Where it keeps the resolved record of the runtime (the box) the rollout ran in, beside the
#: config: verifiers 0.4.0 writes its id, image, workdir and limits there, but a runtime's
#: record is where a producer puts its environment, command line, API base URL or headers.
TRACE_RUNTIME: Pattern = ("traces", "*", "agent", "runtime")
#: The subtrees of an episode the episode rules mask in: everything else is the eval's data.
TRACE_ROOTS: tuple[Pattern, ...] = (TRACE_CONFIG, TRACE_RUNTIME)
#: A key of such a subtree whose value is new in every episode: a runtime record's ``id``, the
#: box's, one per rollout. Masked as any other string there, but left out of what the writer's
#: memo knows the subtree by (content/mask_fragments.py): else no runtime record would repeat.
VOLATILE_KEYS: dict[Pattern, str] = {TRACE_RUNTIME: "id"}

#: The same locations inside every trace of an episode record, in its config and its runtime
#: record; the runtime record's own ``env`` is a runtime's environment (``**.runtime.env.*``).
EPISODE_PATTERNS: tuple[Pattern, ...] = (*((*root, *pattern) for root in TRACE_ROOTS for pattern in CONFIG_PATTERNS),
                                         (*TRACE_RUNTIME, ANY_SPELLING + "env", "*"))

#: The subtrees in which every string has its URLs' userinfo masked: the whole config,
#: and each trace's resolved config and runtime record (``()`` is the root).
CONFIG_URL_SCOPES: tuple[Pattern, ...] = ((),)
EPISODE_URL_SCOPES: tuple[Pattern, ...] = TRACE_ROOTS
