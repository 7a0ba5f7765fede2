"""The streams ``prime-runs eval`` gives verifiers (runner/terminal_mask.py): every secret
value the config's masking found is replaced in each text written, and nothing else changes;
the real stream's other attributes (a dashboard asks ``isatty`` and ``fileno``) pass through."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from prime_runs_spool.content.mask_locations import MASK
from prime_runs_spool.runner.terminal_mask import MaskedStream, TerminalMask, masked_terminal

SECRET = "cfs_TERMINAL_SECRET_0042"


def mask_of(*values: str) -> TerminalMask:
    mask = TerminalMask()
    from prime_runs_spool.content.error_scrub import error_forms

    mask.add(error_forms(values))
    return mask


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.just(SECRET),  # its only lowercase "c" is its first: no part forms it by accident
                          st.text(alphabet=st.characters(blacklist_characters="c"), max_size=30)), max_size=8))
def test_a_secret_anywhere_in_a_write_is_masked_and_the_rest_kept(parts: list[str]) -> None:
    out = io.StringIO()
    stream = MaskedStream(out, mask_of(SECRET))
    text = "".join(parts)
    assert stream.write(text) == len(text)
    assert SECRET not in out.getvalue()
    assert out.getvalue() == "".join(MASK if part == SECRET else part for part in parts)


def test_the_real_streams_attributes_pass_through_and_are_restored(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as handle:
        stream = MaskedStream(handle, mask_of(SECRET))
        assert stream.fileno() == handle.fileno() and stream.isatty() is False and stream.encoding == handle.encoding
    before = sys.stdout, sys.stderr
    with masked_terminal(mask_of(SECRET)):
        assert isinstance(sys.stdout, MaskedStream) and isinstance(sys.stderr, MaskedStream)
    assert (sys.stdout, sys.stderr) == before


def test_the_launch_files_credential_locations_are_known_before_the_run_opens(tmp_path: Path) -> None:
    launch = tmp_path / "eval.toml"
    launch.write_text(f'model = "m"\n[client]\nbase_url = "http://x"\n[client.headers]\nX-Team = "{SECRET}"\n')
    mask = TerminalMask()
    mask.add_launch_file(str(launch))
    assert mask.clear(f"header {SECRET}!") == f"header {MASK}!"
    assert mask.clear("model m at http://x") == "model m at http://x"
    resolved = tmp_path / "eval.json"  # verifiers' resolved config, a resume's launch file
    resolved.write_text('{"client": {"headers": {"X-Other": "cfs_RESOLVED_SECRET_77"}}}')
    mask.add_launch_file(str(resolved))
    assert mask.clear("x cfs_RESOLVED_SECRET_77 y") == f"x {MASK} y" and mask.clear(SECRET) == MASK
    (tmp_path / "bad.toml").write_text("[[[")
    mask.add_launch_file(str(tmp_path / "bad.toml"))  # verifiers' to report, not ours
    mask.add_launch_file(str(tmp_path / "missing.toml"))
