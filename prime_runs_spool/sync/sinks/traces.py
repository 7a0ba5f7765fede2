"""Prime Traces as a sink: content-addressed batches cut from spool positions
(sync/sinks/addressed.py; docs/sync.md, "Prime Traces").

Each line is the episode record as the spool holds it (masked before it reached the disk),
stamped with the platform's run (``run.id`` = the evaluation id, ``run.type``, on the episode
and every member trace) and encoded as ``prime-traces`` encodes records; the boundaries are
the library's own (``prime_traces.iter_batches``: a batch closes before the line that would
take it past the target size), so a run synced after it ended is cut exactly as the library
would cut its JSONL file.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

from prime_runs_spool.errors import CorruptSpoolError, PlatformError, SyncError
from prime_runs_spool.sync.options import SAMPLES, TRACES
from prime_runs_spool.sync.rows import LARGE_BODIES, LARGE_BODY
from prime_runs_spool.sync.sinks.addressed import AddressedSink, Cut, HeldStream, Line, LineStream
from prime_runs_spool.sync.sinks.registry import register
from prime_runs_spool.sync.state import SyncState

# prime-traces (and with it httpx) is imported where an upload is made, not here: a sync
# with nothing to send must not pay for an HTTP stack (tests/test_sync_e2e.py).

#: The upload context's ``source``: which producer the service sees.
SOURCE = "prime-runs-spool"


def cut_batches(stream: LineStream | HeldStream, target_bytes: int) -> Iterator[Cut]:
    """The stream's lines in the library's batches, each with the spool position it ends at.

    ``iter_batches`` reads one line past a batch before closing it, so the positions of the
    lines read wait in a queue: a batch of ``n`` lines ends where its ``n``-th line ends. The
    last batch ends past whatever follows its last episode (a seal), so the cursor can reach
    the end of the log.

    Memory is bounded as for samples (sync/rows.py): a batch about to grow past LARGE_BODY
    first takes one of the process-wide LARGE_BODIES tokens and gives it back once it has
    been sent (the caller drops each cut before asking for the next), so ``--jobs 4`` over
    large runs holds two 30 MiB batches, not four. A batch waiting for a token holds none."""
    from prime_traces import TraceTooLargeError, iter_batches

    from prime_runs_spool.platform_api.traces import MAX_LINE_BYTES

    reached = stream.cursor
    pending: deque[Line] = deque()
    failure: list[BaseException] = []
    held: list[Any] = []
    buffered = [0]  # bytes of the lines read and not yet in a yielded batch

    def feed() -> Iterator[bytes]:
        try:
            for line in stream.lines():
                if not held and buffered[0] + len(line.data) > LARGE_BODY:
                    LARGE_BODIES.acquire()
                    held.append(LARGE_BODIES)
                pending.append(line)
                buffered[0] += len(line.data)
                yield line.data
        except CorruptSpoolError as exc:  # everything before the corruption still goes
            failure.append(exc)

    def release() -> None:
        while held:
            held.pop().release()

    try:
        for batch in iter_batches(feed(), target_bytes=target_bytes, max_line_bytes=MAX_LINE_BYTES):
            taken = [pending.popleft() for _ in range(batch.num_lines)]
            buffered[0] -= batch.size
            last = stream.done and not pending
            reached = stream.cursor if last else taken[-1].after
            cut = Cut(batch.data, reached, len(taken), sum(line.traces for line in taken),
                      stream.seal if last else None, [line.episode_id for line in taken], digest=batch.digest)
            del batch, taken
            yield cut
            del cut
            release()  # sent: the next batch may take the token
    except TraceTooLargeError as exc:
        raise SyncError(f"an episode's line is {exc.size} bytes, over Prime Traces' {exc.limit}-byte limit for one "
                        f"line; it cannot be sent there: {stream.sink.advice_elsewhere(SAMPLES)} (samples split an "
                        "episode too large for one row by trace)") from None
    finally:
        release()
    if failure:
        raise failure[0]
    if stream.cursor != reached:
        yield Cut(None, stream.cursor, seal=stream.seal)


class TracesSink(AddressedSink):
    name = TRACES
    title = "Prime Traces"

    @classmethod
    def used_by(cls, state: SyncState) -> bool:
        """A batch committed, or one announced that may have landed (its answer lost): the
        run is there either way, and goes nowhere else."""
        return bool(state.uploads or (state.in_flight and state.in_flight.kind == cls.name))

    def available(self) -> bool | None:
        """One cheap read (``GET /episodes?limit=1``), shared by the runs of one sync."""
        return self.context.client.traces_probe().answer()

    def holds_run(self) -> bool:
        """Asked of an evaluation found again with no state that names its sink: without it,
        ``--to samples`` (or ``auto`` falling back) would push the episodes a second time.
        Where the listing cannot be asked (:meth:`_listing` is None), the run's episodes
        are not seen, and nothing is held there: the limit docs/sync.md states for an
        account without Prime Traces."""
        listed = self.context.protocol.retry(f"listing the episodes {self.title} holds for the run", self._listing)
        return bool(listed)

    def episodes_there(self) -> list[str]:
        """For reconciling a run sent here (``settle``). Where the listing cannot be asked,
        the pass cannot tell which episodes the run holds, and stops: read as "none", every
        batch would go again and be counted pushed now, and a run adopted from vf-eval's
        own push would have its episodes stored twice."""
        listed = self._listing()
        if listed is None:
            raise SyncError(f"the episode listing of {self.title} answered 404 (no such route), so which of this "
                            "run's episodes it holds cannot be told and none was sent again; check the Prime Traces "
                            "URL (PRIME_TRACES_URL, or traces_url in the config file)")
        return listed

    def _listing(self) -> list[str] | None:
        """The ids of the episodes the platform's Prime Traces run holds; None when the
        platform has no such listing (it answers 404: a platform without the route).

        The 404 is read here, not beside the 403 in ``PlatformClient.trace_run_episode_ids``:
        the client answers "nothing there" for a 403 (the account has Prime Traces off, and
        its uploads are refused alike, so the upload tells), but a missing route says nothing
        of what was sent, and what that means is the caller's: "nothing held" to
        :meth:`holds_run`, "cannot tell" to :meth:`episodes_there`."""
        try:
            return self.context.client.trace_run_episode_ids(self.context.run_id)
        except PlatformError as exc:
            if exc.status == HTTPStatus.NOT_FOUND:
                return None
            raise

    def encode(self, record: Any) -> bytes:
        from prime_runs_spool.platform_api.traces import RUN_TYPE, encode_line, stamp_run

        return encode_line(stamp_run(record.data, self.context.run_id, RUN_TYPE))

    def cut(self, stream: LineStream | HeldStream) -> Iterator[Cut]:
        from prime_runs_spool.platform_api.traces import TARGET_BATCH_BYTES

        return cut_batches(stream, self.context.options.traces_batch_bytes or TARGET_BATCH_BYTES)

    def upload(self, cut: Cut) -> str:
        """Through the destination's uploader, shared by every run of this sync
        (``PlatformClient.traces``)."""
        from prime_traces import Batch

        from prime_runs_spool.platform_api.traces import receipt_id

        assert cut.data is not None
        batch = Batch(data=cut.data, digest=cut.digest, num_lines=len(cut.ids), first_line_number=1)
        return receipt_id(self.context.client.traces().upload(batch, self._upload_context()))

    def _upload_context(self) -> dict[str, str]:
        from prime_runs_spool.platform_api.traces import RUN_TYPE

        manifest = self.context.manifest
        context = {"source": SOURCE, "run_type": RUN_TYPE, "local_run_id": self.state.local_run_id}
        for key in ("framework", "model"):
            if manifest.get(key):
                context[key] = str(manifest[key])
        return context


register(TracesSink)
