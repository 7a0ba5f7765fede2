"""Spools for the viewer's tests: the committed example runs plus a few written here.

The committed ``fixtures/outputs/`` tree has completed, failed, torn and resumed runs; the
tests add, in a temporary copy, a corrupt run (a byte flipped inside an episode line), a run
whose prompt is a ``<script>`` (it must stay text), and a live writer in a child process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from fixtures.episodes import make_episode
from fixtures.make_outputs import make_episodes
from prime_runs_spool import open_run
from prime_runs_spool.spool.layout import list_segments
from support.env import REPO_ROOT, child_env
from support.runs import RunBuilder

FIXTURE_OUTPUTS = REPO_ROOT / "fixtures" / "outputs"
#: The prompt that must be shown, never run.
SCRIPT_PROMPT = "<script>window.__viewer_xss = 1</script><img src=x onerror=\"window.__viewer_xss = 2\"> What is 2 + 2?"

#: Each run of the copied tree and the status the viewer must show for it.
EXPECTED_STATUSES = {
    "gsm8k-completed": "completed",
    "gsm8k-failed": "failed",
    "gsm8k-crashed-torn": "torn",
    "gsm8k-resumed": "completed",
    "judge-credentials": "completed",
    "gsm8k-clean-source": "completed",
    "gsm8k-corrupt": "corrupt",
    "script-prompt": "completed",
    "abandoned": "crashed",
    "gsm8k-rerun": "completed",
}


def rerun_episodes() -> list[dict]:
    """gsm8k-completed's first three examples with every score flipped (1 - score): against
    it, examples 0 and 2 regressed, 1 improved, and 3 is only in gsm8k-completed."""
    episodes = make_episodes("fixture-gsm8k-rerun", 3, num_tasks=4)
    for episode in episodes:
        for trace in episode["traces"]:
            for reward in (trace.get("rewards") or {}).values():
                if isinstance(reward, dict) and isinstance(reward.get("score"), (int, float)):
                    reward["score"] = 1.0 - reward["score"]
    return episodes


def script_episode(number: int) -> dict:
    episode = make_episode(number, size=0, run_id="script-prompt", salt="script", idx=number)
    for trace in episode["traces"]:
        trace["task"] = {"type": "T", "data": {"idx": number, "prompt": SCRIPT_PROMPT, "answer": "4"}}
        trace["nodes"][0]["message"]["content"] = SCRIPT_PROMPT
        trace["nodes"][1]["message"]["content"] = "</pre><script>window.__viewer_xss = 3</script>4"
    return episode


def build_outputs(root: Path) -> Path:
    """A copy of fixtures/outputs under ``root`` with the extra runs; returns the outputs dir."""
    out = root / "outputs"
    shutil.copytree(FIXTURE_OUTPUTS, out)
    corrupt = out / "gsm8k-corrupt"
    shutil.copytree(out / "gsm8k-completed", corrupt)
    segment = list_segments(corrupt)[0][1]
    lines = segment.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"Janet", b"Jxnet", 1)  # an episode line, intact ones after it
    segment.write_bytes(b"\n".join(lines))
    with open_run(out / "script-prompt", name="script-prompt", environments=["xss"], model="m",
                  run_id="script-prompt", mode="offline") as run:
        run.log_episodes([script_episode(n) for n in range(2)])
    with open_run(out / "gsm8k-rerun", name="gsm8k-rerun", environments=["gsm8k"], model="Qwen/Qwen3-8B",
                  run_id="gsm8k-rerun", mode="offline") as run:
        run.log_episodes(rerun_episodes())
    abandoned = RunBuilder(out / "abandoned", "abandoned")
    abandoned.open_segment()
    abandoned.add(2, size=0)
    abandoned.abandon()  # the writer stopped between two lines, without a seal: crashed
    return out


LIVE_WRITER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from fixtures.episodes import make_episode
    from prime_runs_spool import open_run
    run_dir, count, pause, gate = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
    with open_run(run_dir, name="live-run", environments=["gsm8k"], model="Qwen/Qwen3-8B", run_id="live-run",
                  mode="offline") as run:
        for n in range(count):
            if gate.exists():
                break
            run.log_episodes([make_episode(n, size=0, run_id="live-run")])
            print(n + 1, flush=True)
            time.sleep(pause)
        while not gate.exists():
            time.sleep(0.05)
""")


def start_live_writer(run_dir: Path, count: int, pause: float, gate: Path) -> subprocess.Popen[str]:
    """A child process that logs up to ``count`` episodes ``pause`` s apart, one number per line
    on stdout as each is durable, and seals (completed) as soon as ``gate`` exists."""
    return subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(run_dir), str(count), str(pause), str(gate)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            cwd=REPO_ROOT)


def spool_of_episodes(tmp_path: Path, episodes: list[dict]) -> Path:
    """A sealed run under ``tmp_path / "runs"`` holding ``episodes`` as given, whatever their
    shape (the writer takes any JSON object): what another producer might have written."""
    from prime_runs_spool.spool.writer import SegmentWriter
    from support.runs import manifest_for

    writer = SegmentWriter.create(tmp_path / "runs" / "odd", "odd-shapes")
    writer.append("manifest", manifest_for("odd-shapes"))
    for n, episode in enumerate(episodes):
        writer.append("episode", episode, {"episode_id": f"odd-{n}", "rollout_number": n})
    writer.seal("completed")
    return tmp_path / "runs"
