"""What ``prime-runs eval --help`` prints, and the verifiers releases it names.

Apart from :mod:`prime_runs_spool.runner.verifiers_eval` so that printing the help costs
nothing: that module loads the writer and, when it runs, verifiers (seconds of CPU), none
of which a user asking what the command does should wait for. verifiers' own arguments
are ``vf-eval --help``'s to list.
"""

from __future__ import annotations

#: The verifiers releases whose eval runner ``prime-runs eval`` binds (lowest included,
#: highest not).
SUPPORTED_MIN = (0, 4, 0)
SUPPORTED_BELOW = (0, 5, 0)
#: The same range as pip spells it (pyproject.toml's ``verifiers`` extra gives it too).
SUPPORTED_RANGE = f">={'.'.join(map(str, SUPPORTED_MIN))},<{'.'.join(map(str, SUPPORTED_BELOW))}"

#: What ``prime-runs eval --help`` (or ``-h``, or no argument at all) prints.
EVAL_HELP = f"""\
prime-runs eval [VF-EVAL ARGUMENTS...]

Runs the installed verifiers' own eval (vf-eval, verifiers {SUPPORTED_RANGE}) in this
process, with every argument passed through unchanged, and records every episode in a
crash-safe spool (output_dir/run.dir/spool/, beside traces.jsonl) before it counts as done.
What prime-runs eval adds:
  - offline by default: the spool only; it prints how to sync it at the end
    (PRIME_RUNS_MODE=online streams it to the platform while the eval runs;
    PRIME_RUNS_MODE=disabled keeps the run off the disk)
  - --no-push keeps the spool: it only means nothing is streamed while the eval
    runs (PRIME_RUNS_MODE=online is then offline); sync the spool afterwards
  - --resume continues the same spool; retried rollouts supersede the errored ones
  - Ctrl-C / SIGTERM seal the run 'cancelled' and print the command that resumes it;
    a killed process leaves it 'crashed'
  - a full disk, a file size limit or a folder it cannot write: one line naming the
    path and the resume command (exit 1)
  - --clean is refused while the spool holds episodes no sync shipped (exit 1)
  - run.attach is refused: a spool syncs into an evaluation of its own (exit 1)
The exit code is verifiers' own (130 after Ctrl-C), but for those (1), and 2 when
verifiers is missing or not a supported release, PRIME_RUNS_MODE is not offline,
online or disabled, or the @ file is a folder, a FIFO, a socket or a device.

Examples:
  prime-runs eval @ eval.toml                 # vf-eval's arguments, unchanged
  prime-runs eval @ outputs/RUN/configs/resolved/eval.json --resume   # as vf-eval resumes
  PRIME_RUNS_MODE=online prime-runs eval @ eval.toml   # ship while it runs
  prime-runs sync outputs                     # then ship every run (or --local to browse)

verifiers' own arguments (every one passes through): vf-eval --help
"""
