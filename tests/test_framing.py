"""Properties of the line format and the reader's verdicts, over generated spools."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from crc32c import crc32c

from prime_runs_spool.errors import CorruptSpoolError, RecordNotSerializableError
from prime_runs_spool.spool.format import _DATA_OPEN, _DATA_OPEN_CRC, encode_line, episode_rest, framing_rest, parse_line, prepare
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.scan import read_run
from support.segments import as_tuples, build_segment, write_segment

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
small_episodes = st.lists(
    st.dictionaries(st.text(max_size=4), st.integers(-100, 100) | st.text(max_size=6), max_size=3),
    min_size=0,
    max_size=4,
)
fs_settings = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@given(json_values, st.integers(0, 2**40), st.sampled_from(["episode", "manifest", "custom_type"]))
def test_any_json_value_round_trips_through_a_line(value, seq, record_type):
    line = encode_line(value, seq, record_type, {"episode_id": "e", "rollout_number": 3})
    parsed = parse_line(line)
    assert parsed is not None
    assert (parsed.data, parsed.seq, parsed.type) == (value, seq, record_type)
    assert parsed.meta == {"episode_id": "e", "rollout_number": 3}


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(json_values, st.data())
def test_any_single_bit_flip_is_detected(value, data):
    line = bytearray(encode_line(value, 7, "episode"))
    bit = data.draw(st.integers(0, len(line) * 8 - 1))
    line[bit // 8] ^= 1 << (bit % 8)
    assert parse_line(bytes(line)) is None


@pytest.mark.slow
@fs_settings
@given(small_episodes, st.booleans())
def test_cut_at_every_byte_returns_exactly_the_complete_prefix(tmp_path: Path, episodes, sealed):
    data, written = build_segment(episodes, seal="completed" if sealed else None)
    run = tmp_path / f"cut-{random.random()}"
    for cut in range(len(data) + 1):
        write_segment(run, data[:cut])
        got = as_tuples(iter_records(run))  # must not raise: a cut is never corruption
        expected = [(seq, t, d, m) for _, end, seq, t, d, m in written if end <= cut]
        assert got == expected, cut
        assert read_run(run).status != "corrupt"


@pytest.mark.slow
@fs_settings
@given(small_episodes, st.data())
def test_damage_never_yields_a_record_that_was_not_written(tmp_path: Path, episodes, data):
    original, written = build_segment(episodes, seal=data.draw(st.sampled_from([None, "completed"])))
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):
            bit = data.draw(st.integers(0, len(damaged) * 8 - 1))
            damaged[bit // 8] ^= 1 << (bit % 8)
        else:
            at = data.draw(st.integers(0, len(damaged)))
            damaged[at:at] = b"\0" * data.draw(st.integers(1, 64))
    run = tmp_path / f"dmg-{random.random()}"
    write_segment(run, bytes(damaged))
    got = []
    try:
        for record in iter_records(run):
            got.append((record.seq, record.type, record.data, record.meta))
    except CorruptSpoolError:
        pass
    expected = [(seq, t, d, m) for _, _, seq, t, d, m in written]
    assert got == expected[: len(got)]


def test_a_flipped_byte_mid_spool_is_corruption_at_that_line(tmp_path: Path):
    data, written = build_segment([{"i": i} for i in range(5)])
    damaged = bytearray(data)
    offset = written[2][0]
    damaged[offset + 12] ^= 0x01
    write_segment(tmp_path, bytes(damaged))
    got = []
    with pytest.raises(CorruptSpoolError) as info:
        for record in iter_records(tmp_path):
            got.append(record.seq)
    assert info.value.offset == offset
    assert got == [1, 2]  # every good record before the damage was yielded first


@pytest.mark.parametrize(
    "record, field",
    [
        ({"a": {"b": object()}}, "a.b"),
        ({"a": [1, {2: "x"}]}, "a[1]"),
        ({"x": 1, "y": {1, 2}}, "y"),
    ],
)
def test_serialization_errors_name_the_field(record, field):
    with pytest.raises(RecordNotSerializableError) as info:
        prepare(record, "episode")
    assert info.value.field_path == field
    assert field in str(info.value) and "episode" in str(info.value)


@given(st.none() | st.text(), st.none() | st.integers(0, 10**18))
def test_an_episodes_rest_is_framing_rest_of_its_meta_byte_for_byte(episode_id, rollout_number):
    """The run frames each episode's type and meta with ``episode_rest`` (no mapping, no
    serialization of it whole); the line must be the one ``framing_rest`` makes of the meta."""
    meta = {"episode_id": episode_id, "rollout_number": rollout_number}
    assert episode_rest(episode_id, rollout_number) == framing_rest("episode", meta)


@settings(max_examples=30, deadline=None)
@given(json_values, st.integers(0, 2**40))
def test_a_lines_crc_is_the_crc32c_of_its_bytes(value, seq):
    """The checksum library loads at the first line, and the checksum of ``{"data":`` it
    starts from is a constant: each must be crc32c's own over the line's bytes, computed
    here by the library directly."""
    assert _DATA_OPEN_CRC == crc32c(_DATA_OPEN)
    line = encode_line({"value": value}, seq, "episode")
    body, trailer = line[:-19], line[-19:]
    assert trailer == b',"crc":"%08x"}\n' % crc32c(body)


def test_the_first_line_loads_crc32c_without_its_package_and_checksums_as_it_does() -> None:
    """The package's ``__init__`` imports argparse, csv, email and importlib.metadata to
    read its own version, about 85 M instructions at every command's first line: the line
    is checksummed by its C function, loaded alone, and gives the package's own values; the
    package imported after it works as ever."""
    import subprocess
    import sys

    script = ("import sys\n"
              "from prime_runs_spool.spool.format import checksum\n"
              "values = [checksum(b'123456789'), checksum(b''), checksum(b'x' * 100_000, 7)]\n"
              "print(values, sorted(m for m in ('crc32c', 'importlib.metadata', 'argparse', 'email') "
              "if m in sys.modules))\n"
              "import crc32c\n"
              "assert crc32c.crc32c(b'123456789') == values[0] and crc32c.crc32c.__module__ == 'crc32c._crc32c'\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([crc32c(b"123456789"), crc32c(b""), crc32c(b"x" * 100_000, 7)]) + " []", out
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C
