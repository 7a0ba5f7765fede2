"""The compare page's config diff (``viewer/diff.py``): every setting of either manifest is
one line, a line is "same" exactly when both values are, and a diff of two manifests as the
viewer holds them (config masked again) never shows a credential, wherever it sits."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st
import pytest

from prime_runs_spool.viewer.diff import ABSENT, IDENTITY_KEYS, config_diff, flatten
from prime_runs_spool.viewer.index import masked_manifest

NAMES = st.text(st.characters(categories=("Ll", "Lu", "Nd"), include_characters="_-<>\"'&"), min_size=1,
                max_size=8).filter(lambda name: name not in IDENTITY_KEYS)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(NAMES, inner, max_size=3)), max_leaves=12)
MANIFESTS = st.dictionaries(NAMES, VALUES, max_size=5)


@settings(max_examples=80, deadline=None)
@given(MANIFESTS, MANIFESTS)
def test_every_key_of_either_side_is_one_line_same_exactly_when_equal(a, b):
    lines = config_diff(a, b)
    left, right = flatten(a), flatten(b)
    assert [line.key for line in lines] == list(dict.fromkeys([*left, *right]))
    for line in lines:
        assert (line.a, line.b) == (left.get(line.key, ABSENT), right.get(line.key, ABSENT))
        assert line.same == (line.a == line.b)
    assert all(line.same for line in config_diff(a, a))


SECRET_SEATS = [("client", "api_key"), ("client", "headers", "Authorization"), ("env", "solver", "harness", "env",
                                                                                  "HF_TOKEN"), ("judge", "password")]


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.sampled_from(SECRET_SEATS), st.text(st.characters(categories=("Ll", "Nd")), min_size=12, max_size=30),
       MANIFESTS)
def test_a_credential_in_either_config_never_shows_in_the_diff(seat, secret, other):
    # Generated apart, the other side or a key's name may hold the same text by chance, where
    # it is no credential: masking goes by location.
    assume(secret not in str(other) and secret not in ".".join(seat))
    config: dict = {}
    where = config
    for name in seat[:-1]:
        where = where.setdefault(name, {})
    where[seat[-1]] = secret
    a = masked_manifest({"config": config, "model": "m"})  # as the viewer holds every run's manifest
    b = masked_manifest({**other, "config": {}})
    shown = " ".join(f"{line.key} {line.a} {line.b}" for line in config_diff(a, b) + config_diff(b, a))
    assert secret not in shown
    assert "***" in shown
