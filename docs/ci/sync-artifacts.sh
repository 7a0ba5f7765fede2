#!/usr/bin/env bash
# Sync (or, with --replay, push again as new evaluations) every run spool under DIR, for a
# CI job: docs/ci.md. The JSON report goes to $SYNC_REPORT (default sync-report.json), a
# one-line summary per run to stdout, its warnings under it.
#
#   bash sync-artifacts.sh [--replay] DIR [prime-runs sync options...]
#
# Installed with the package: prime-runs ci-script prints it (no clone needed).
#
# Eval outputs written without a spool (verifiers' traces.jsonl, metadata.json +
# results.jsonl) are imported first; for a read-only artifact pass --state-dir DIR.
# Exit codes are prime-runs sync's (docs/cli.md): 0 every run synced, up to date or its end
# recorded; 1 some run failed to sync or import (listed on stderr; its state is kept, so
# re-running the job carries on), or DIR holds nothing to sync, or the report could not be
# written whole (one line says so); 2 usage or configuration error, e.g. no PRIME_API_KEY.
set -uo pipefail

prime_runs=${PRIME_RUNS:-prime-runs}   # a command line; tests set "python -m commands"
report=${SYNC_REPORT:-sync-report.json}
replay=()
if [ "${1:-}" = "--replay" ]; then
  replay=(--replay)
  shift
fi
if [ $# -lt 1 ]; then
  echo "usage: $0 [--replay] DIR [prime-runs sync options...]" >&2
  exit 2
fi
dir=$1
shift
if [ -d "$report" ]; then
  echo "cannot write the sync report $report (SYNC_REPORT): it is a folder; point SYNC_REPORT at a file, e.g. $report/sync-report.jsonl" >&2
  exit 2
fi
# The report names runs, evaluations and their errors: 0600 like every file prime-runs writes,
# whatever the job's umask (a report left by an earlier job loses its group/other bits too).
if ! { (umask 077 && : > "$report") && { [ ! -f "$report" ] || chmod go= "$report"; }; } 2>/dev/null; then  # else bash skips the sync and it reads as a failed one
  echo "cannot write the sync report $report (SYNC_REPORT): its folder is missing or not writable; point SYNC_REPORT at a file this job can write" >&2
  exit 2
fi

# shellcheck disable=SC2086  # $prime_runs is a command line on purpose
$prime_runs sync "$dir" "${replay[@]}" --json "$@" > "$report"
status=$?

whole=no  # a report cut short, or empty, by a disk that filled lists no run: said once, below
if [ -s "$report" ]; then
  python3 - "$report" <<'PY'
import json, sys


def shown(text):
    """A folder's name or a message on one line of the log, as prime-runs sync prints it
    (files.shown): a line break, a carriage return or an escape sequence's ESC as its
    escape, so an artifact's folder name can neither forge a line nor drive the terminal."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


try:
    report = json.load(open(sys.argv[1]))
except ValueError:  # cut short (a disk that filled): prime-runs sync said why, and exits 1
    sys.exit(3)  # said below, as for a report with nothing in it
for imported in report.get("imports", []):
    state = imported["state"]
    if state == "spooled" and not imported["warnings"]:
        continue  # the eval wrote its own spool, and its traces.jsonl agrees: nothing was imported
    source = shown(imported["source"])
    if state in ("imported", "appended", "up_to_date"):
        print(f"{state:<10} {source}  (eval outputs imported into {shown(imported['run_dir'])})")
    else:  # spooled with a warning, live (an eval may still be writing there), empty, left, error
        why = imported["error"] if state == "error" else imported["reason"] or imported["error"]
        print(f"{state:<10} {source}  ({shown(why)})")
    if state == "error":
        print(f"FAILED {source}: {shown(imported['error'])}", file=sys.stderr)
for run in report["runs"]:
    line = f"{run['state']:<10} {shown(run['path'])}  pushed {run['pushed_now']} (total {run['pushed_total']})"
    print(line + (f"  {shown(run['url'])}" if run.get("url") else ""))
    for warning in run.get("warnings") or []:  # as prime-runs sync prints them: the job's log is all anyone reads
        print(f"  warning: {shown(warning)}")
    if run["state"] in ("error", "corrupt", "lost", "gone"):  # the states that make sync exit 1
        print(f"FAILED {shown(run['path'])}: {shown(run['error'])}", file=sys.stderr)
    elif run.get("error"):  # skipped (another sync holds the run): why, as prime-runs sync says it
        print(f"  error: {shown(run['error'])}")
if not report["runs"] and not report.get("imports"):
    print("no runs found (the job fails unless --allow-empty is passed)")
PY
  [ $? -eq 0 ] && whole=yes
fi
case $status in
  0) ;;
  1) if [ $whole = yes ]; then
       echo "some runs failed to sync (or nothing was found); re-run this job to carry on from the saved state" >&2
     else  # no run is known to have failed: the sync's own line above says what went wrong
       echo "the sync report $report is not whole, so no run is listed: see the line above" >&2
     fi ;;
  *) echo "prime-runs sync could not start (exit $status): the line above says why (a missing PRIME_API_KEY secret, a path, an option)" >&2 ;;
esac
exit $status
