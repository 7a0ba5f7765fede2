"""spool/rewrite.py with content/remask.py's change: the copy ``prime-runs mirror`` uploads of a
segment written under older masking rules (docs/masking.md, "Spools written under older rules").

Properties over random old segments (Hypothesis): credentials at random locations and in a
seal's error, episodes with nothing to mask among them, any older version or none:

- the copy is a spool the reader and ``verify`` accept whole: the same records in the same
  order, with the same sequence numbers, types and meta, each record's data what
  ``remask`` gives (so a sync of the copy sends what a sync of the original sends), the
  manifest saying today's version;
- no credential is in any byte of the copy; a line with nothing to mask is copied byte for byte;
- the copy of a prefix ending at any line boundary (a live writer's durable mark) is a prefix
  of the copy of the whole: a sync that read the shorter copy finds it unchanged;
- a torn tail is left out, and damage is refused.
"""

from __future__ import annotations

import io
import string
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.episodes import make_episode
from prime_runs_spool.content.mask_locations import MASKING_VERSION
from prime_runs_spool.content.remask import copy_masking, remasked_record
from prime_runs_spool.errors import CorruptSpoolError
from prime_runs_spool.spool.layout import segment_path
from prime_runs_spool.spool.reader import iter_records
from prime_runs_spool.spool.rewrite import rewrite_segment
from prime_runs_spool.spool.verify import check_run
from prime_runs_spool.spool.writer import SegmentWriter

#: Where a credential goes in a trace's seat config, given the secret: each a place today's rules mask.
PLACES = [
    lambda s: {"client": {"api_key": s}},
    lambda s: {"client": {"headers": {"X-Anything": s}}},
    lambda s: {"harness": {"env": {"HF_TOKEN": s}}},
    lambda s: {"sandbox": {"env": [f"HF_TOKEN={s}"]}},
    lambda s: {"env_args": {"judge_api_key": s}},
    lambda s: {"env_args": {"access_tokens": [s]}},
    lambda s: {"client": {"base_url": f"https://user:{s}@vllm.internal/v1"}},
    lambda s: {"sampling_args": {"extra_headers": {"Authorization": f"Bearer {s}"}}},
]

secrets = st.text(string.ascii_letters + string.digits, min_size=8, max_size=16).map(lambda t: f"ZQXsecret{t}")
episodes = st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(range(len(PLACES))), secrets), max_size=3),
                              st.text(max_size=40)), min_size=1, max_size=5)
versions = st.one_of(st.none(), st.integers(0, MASKING_VERSION - 1))


def write_old_segment(run_dir: Path, placed: list, version: int | None, error_secret: str | None) -> list[str]:
    """A sealed old segment; the secrets it holds in clear text."""
    manifest = {"run_id": "old", "name": "old", "environments": ["gsm8k"], "model": "m", "format_version": 1,
                "config": {"model": "m", "client": {"api_key": "ZQXsecretmanifest"}}}
    if version is not None:
        manifest["masking_version"] = version
    held = ["ZQXsecretmanifest"]
    writer = SegmentWriter.create(run_dir, "old")
    writer.append("manifest", manifest)
    items = []
    for number, (places, text) in enumerate(placed):
        episode = make_episode(number, run_id="old", size=0)
        config = episode["traces"][0]["agent"]["config"]
        config.clear()  # only what the example places: an episode with none has nothing to mask
        config["model"] = "m"
        episode["traces"][0]["nodes"][1]["message"]["content"] = text
        for place, secret in places:
            config.update(PLACES[place](secret))
            held.append(secret)
        items.append(("episode", episode, {"episode_id": episode["id"], "rollout_number": number}))
    writer.append_many(items)
    if error_secret is not None:
        held.append(error_secret)
    writer.seal("failed" if error_secret else "completed",
                error=f"CloneError: git clone https://bot:{error_secret}@git.example/r failed" if error_secret else None)
    writer.close()
    return held


def rewritten(segment: Path, size: int) -> bytes:
    out = io.BytesIO()
    change = copy_masking({})  # a manifest without a version: masked again
    assert change is not None
    written = rewrite_segment(segment, 1, size, out, change)
    assert written == len(out.getvalue())
    return out.getvalue()


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed=episodes, version=versions, error_secret=st.one_of(st.none(), secrets))
def test_the_copy_is_the_spool_masked_again_and_its_prefixes_are_its_prefixes(placed, version, error_secret) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source_run, copy_run = Path(tmp) / "source", Path(tmp) / "copy"
        held = write_old_segment(source_run, placed, version, error_secret)
        segment = segment_path(source_run, 1)
        data = segment.read_bytes()
        whole = rewritten(segment, len(data))
        assert not [secret for secret in held if secret.encode() in whole]
        # Every line boundary, as a live writer's durable mark could be: the copy only grows.
        boundaries = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
        for end in boundaries:
            assert whole.startswith(rewritten(segment, end))
        copy = segment_path(copy_run, 1)
        copy.parent.mkdir(parents=True)
        copy.write_bytes(whole)
        report = check_run(copy_run)
        assert report["ok"] and report["status"] == ("failed" if error_secret else "completed"), report
        originals, copies = list(iter_records(source_run)), list(iter_records(copy_run))
        assert [(r.seq, r.type, r.meta) for r in copies] == [(r.seq, r.type, r.meta) for r in originals]
        for original, copied in zip(originals, copies):
            assert copied.data == orjson.loads(orjson.dumps(remasked_record(original)))
            if remasked_record(original) is original.data:  # nothing to mask: the very bytes
                assert whole[copied.offset:copied.end_offset] == data[original.offset:original.end_offset]
        assert copies[0].data["masking_version"] == MASKING_VERSION


def test_a_torn_tail_is_left_out_and_damage_refused(tmp_path: Path) -> None:
    write_old_segment(tmp_path / "run", [([(0, "ZQXsecretTorn1234")], "hi")], None, None)
    segment = segment_path(tmp_path / "run", 1)
    data = segment.read_bytes()
    lines = data.split(b"\n")
    sealed_copy = rewritten(segment, len(data))
    unsealed = b"\n".join(lines[:-2]) + b"\n"  # header, manifest and episode; the seal cut off
    segment.write_bytes(unsealed + b'{"data":{"api_key":"ZQXsecretTorn')  # a line cut short by a crash
    for mark in segment.parent.glob("*.durable"):  # as a writer killed before it marked the seal durable
        mark.unlink()
    copy = rewritten(segment, segment.stat().st_size)
    assert sealed_copy.startswith(copy) and copy.count(b"\n") == 3 and b"ZQXsecretTorn" not in copy
    lines[2] = lines[2].replace(b'"id"', b'"iD"', 1)  # the episode's checksum no longer holds
    segment.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptSpoolError, match="corrupt at byte"):
        rewritten(segment, len(data))
