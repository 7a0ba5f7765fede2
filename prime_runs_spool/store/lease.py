"""A syncer's lease on one run in an object store: the cross-machine ``sync.lock``.

The lease is one small object beside the run's segments (``spool/sync.lease.json``) holding
``{owner, generation, expires_at, released, in_flight_until, state_in_store}``. It is never deleted, so its generation only
grows:

- **take**: create it (``If-None-Match: *``, generation 1); if it exists and is released or
  expired, replace it (``If-Match`` its etag) with generation + 1. Two syncers racing for it
  cannot both win: the store accepts one write per etag.
- **renew** before every write of the sync state that announces a request (so before every
  non-idempotent request: each is announced in the state first), and during long waits: ``If-Match`` our own last
  etag. Refused means another syncer took it over after it expired (unless the object read
  back is our own write whose answer was lost: :meth:`Lease._replace`): :class:`LeaseLost`,
  and the syncer stops (fencing by generation: the state records the generation that wrote it).
- **release** when done: rewrite it ``released`` (``If-Match``), so the next taker need not
  wait for the expiry.
- **a request in flight** is announced in the lease too: every write carries
  ``in_flight_until``, until when (the holder's wall clock) a request it announced may still
  land, 0 when none is out, and ``state_in_store``, whether its announcements are also in a
  state object every syncer reads. A taker that cannot read the holder's announcement (the
  holder kept its state in its own ``--state-dir``, or the taker does) waits until that time
  before it sends anything (:attr:`Lease.wait_until`): else the holder's late request and
  the taker's resend of the same rows would both land.
- **a process ending at once** (a second Ctrl-C) gives up every lease it holds on its way
  out (:func:`release_held`), but one under which a request may still land: that one keeps
  other syncers off until it expires.
- **which sync state knows everything pushed** under the lease: ``last_state``, an id of
  the state (a state object in the store, or a file on one machine: a ``--state-dir``, or
  the folder of a run synced on the machine that mirrors it), carried on from holder to
  holder; ``""`` once a holder whose state is another began to write, until its pass has
  settled with the platform. A taker whose state is not the one named knows its state may
  be behind the platform, and checks it there before it pushes (sync/leased.py).

Expiry is judged by the local clock against the holder's ``expires_at``; clocks are assumed
to agree within ``clock_skew`` seconds (docs/sync.md says what remains and why it is safe).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping

from prime_runs_spool.errors import LeaseLost, StoreConflict, StoreError
from prime_runs_spool.store.objects import ObjectStore

#: Seconds a lease lasts unless renewed (env ``PRIME_RUNS_LEASE_TTL``).
DEFAULT_TTL = 60.0
TTL_ENV = "PRIME_RUNS_LEASE_TTL"
#: How far two machines' clocks may disagree, in seconds: a lease is taken over only this
#: long after its holder's own clock says it expired.
DEFAULT_CLOCK_SKEW = 5.0
SKEW_ENV = "PRIME_RUNS_LEASE_CLOCK_SKEW"
#: A lease that says it lasts longer than this (or this machine's own TTL, if longer) from
#: now is no lease: no syncer writes one, and one that did would hold the run until then.
LONGEST_TTL = 24 * 3600.0
#: The shortest lease a machine may set: renewed every sixth of it, a shorter one is mostly renewals.
SHORTEST_TTL = 1.0


def env_timing(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """``(ttl, clock_skew)`` as this machine's environment sets them, else the defaults;
    ValueError, naming the variable, for a value that is not a number. Whether they are
    usable (finite, in range) is sync's rule to check (sync/store_sync.py, ``lease_problem``)."""
    env = os.environ if env is None else env
    out = []
    for name, default in ((TTL_ENV, DEFAULT_TTL), (SKEW_ENV, DEFAULT_CLOCK_SKEW)):
        text = env.get(name) or ""
        try:
            out.append(float(text) if text else default)
        except ValueError:
            raise ValueError(f"{name}={text[:40]!r} is not a number of seconds") from None
    return out[0], out[1]


#: The leases this process holds, taken and not yet given up: what a process ending at once
#: (a second Ctrl-C) gives up on its way out (:func:`release_held`).
_HELD: set[Lease] = set()
#: Reentrant: :func:`release_held` runs in a signal handler, which may interrupt its own thread
#: between taking this lock and letting it go.
_HELD_LOCK = threading.RLock()
#: Seconds a process ending at once gives its leases' releases (a store that does not answer
#: would hold its exit for the library's retries): one not released by then expires.
RELEASE_AT_EXIT_SECONDS = 2.0


def default_owner() -> str:
    """Who holds a lease: host, pid and a random part (a restarted pid is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """The lease on one run. Not thread-safe: one per run, used by that run's sync."""

    def __init__(self, store: ObjectStore, key: str, *, owner: str | None = None, ttl: float | None = None,
                 clock_skew: float | None = None, clock: Callable[[], float] = time.time,
                 state_in_store: bool = True, monotonic: Callable[[], float] | None = None) -> None:
        self.store, self.key = store, key
        #: Whether this holder announces its requests in a state object beside the lease
        #: (False: in a ``--state-dir`` no other machine reads).
        self.state_in_store = state_in_store
        #: Until when (wall clock) a request this holder announced may still land: 0.0 when
        #: none is out. Written with every write of the lease; the sync sets it with each
        #: state write, from the request that state announces.
        self.in_flight_until = 0.0
        #: Until when (the previous holder's wall clock) a request it announced where this
        #: holder cannot read it may still land: this holder sends nothing before then. 0.0: none.
        self.wait_until = 0.0
        #: The sync state that knows everything pushed under the lease (see the module's
        #: docstring): as the lease named it when taken (None: it named none), then as this
        #: holder's sync sets it; written with every write of the lease.
        self.last_state: str | None = None
        self.owner = owner or default_owner()
        if ttl is None or clock_skew is None:
            env_ttl, env_skew = env_timing()
            ttl = env_ttl if ttl is None else ttl
            clock_skew = env_skew if clock_skew is None else clock_skew
        self.ttl, self.clock_skew = float(ttl), float(clock_skew)
        #: The wall clock: what the lease object says (expiry, a request's lifetime), which
        #: every machine compares with its own.
        self.clock = clock
        #: This process's monotonic clock: how long its own waits last, which a wall clock
        #: set back cannot stretch (an injected ``clock`` drives both, as in the protocol).
        self.monotonic = monotonic or (time.monotonic if clock is time.time else clock)
        #: The generation we hold (0: none), the lease object's etag after our last write,
        #: and when that write was made (local clock).
        self.generation = 0
        #: Whether this syncer made the lease object (no syncer held the run before it).
        self.created = False
        self.etag: str | None = None
        self.renewed_at = 0.0
        #: When our last write was made, on :attr:`monotonic`.
        self._renewed_here = 0.0
        self.holder: dict[str, object] | None = None
        #: The etag of the holder's lease this syncer replaced when it took it (None: made it).
        self.taken_from: str | None = None
        #: One write of the lease at a time: the sync and its keep-alive thread share it.
        self._lock = threading.RLock()

    @property
    def held(self) -> bool:
        return self.etag is not None

    def _body(self, generation: int, *, released: bool = False) -> bytes:
        now = self.clock()
        # A request the previous holder announced where this one cannot read it, not waited out
        # yet, is in no state object either: a next holder reading ours must wait it out too.
        in_store = self.state_in_store and self.wait_until + self.clock_skew <= now
        return json.dumps({"owner": self.owner, "generation": generation,
                           "expires_at": 0.0 if released else now + self.ttl,
                           "released": released, "written_at": now,
                           "in_flight_until": self.in_flight_until, "state_in_store": in_store,
                           "last_state": self.last_state,
                           "nonce": uuid.uuid4().hex}, sort_keys=True).encode()

    def try_take(self) -> bool:
        """Take the lease if it is free, released or expired; False when someone holds it."""
        now = self.clock()
        self.last_state = None
        try:
            body = self._body(1)
            self.etag = self._landed(lambda: self.store.create(self.key, body), body)
            self.generation, self.renewed_at, self.created = 1, now, True
            self._renewed_here = self.monotonic()
            self._held(True)
            return True
        except StoreConflict as refused:
            current = refused.current  # what the store read back after refusing: no second GET
        if current is None:
            current = self.store.read(self.key)
        if current is None:
            return False  # deleted between the two calls: the next try creates it
        data, etag = current
        try:
            holder = json.loads(data)
            generation, free = self._judge(holder, now)
        except (ValueError, TypeError, AttributeError):
            holder, generation, free = {}, 0, True  # an unreadable lease is no lease
        self.holder = holder
        if not free or etag is None:
            return False
        inherited = _in_flight_until(holder)
        self.in_flight_until = inherited  # carried on, until our own state says what is out
        last_state = holder.get("last_state")
        self.last_state = last_state if isinstance(last_state, str) else None
        try:
            body = self._body(generation + 1)
            self.etag = self._landed(lambda: self.store.replace(self.key, body, etag), body)
        except StoreConflict:
            self.in_flight_until, self.last_state = 0.0, None
            return False  # another syncer took it first
        self.generation, self.renewed_at, self._renewed_here = generation + 1, now, self.monotonic()
        self._held(True)
        self.taken_from = etag
        both_in_store = self.state_in_store and holder.get("state_in_store") is True
        self.wait_until = 0.0 if both_in_store else inherited
        return True

    def _judge(self, holder: dict[str, object], now: float) -> tuple[int, bool]:
        """The holder's generation and whether its lease is free; ValueError for a lease no
        syncer writes, which is then no lease: a generation that is not a small whole number
        (1e300 ended the whole command in an internal error when the next one was written
        to the state), an expiry that is not a finite number, or one further ahead than any
        holder sets it (a lease expiring in 1e308, or NaN, blocked the run for every syncer
        forever). The horizon is not this machine's own TTL, which another machine's may
        exceed (``PRIME_RUNS_LEASE_TTL`` is per machine), and is measured from the clock as
        read after the lease, which its holder may have renewed since ``now``."""
        generation = holder.get("generation", 0)
        if type(generation) is not int or not 0 <= generation < 1 << 62:
            raise ValueError(f"lease generation {generation!r}")
        if holder.get("released"):
            return generation, True
        expires_at = float(holder.get("expires_at", 0))  # type: ignore[arg-type]
        horizon = self.clock() + max(self.ttl, LONGEST_TTL) + self.clock_skew
        if not now - 1e12 < expires_at <= horizon:
            raise ValueError(f"lease expiry {expires_at!r}")
        return generation, expires_at + self.clock_skew < now

    def take(self, *, wait: bool, sleep: Callable[[float], None] = time.sleep,
             stop: Callable[[], bool] = lambda: False) -> bool:
        """Take the lease; with ``wait``, poll until it is free (or ``stop``)."""
        while True:
            if self.try_take():
                return True
            if not wait or stop():
                return False
            sleep(min(1.0, max(0.05, self.ttl / 8)))

    def _lost(self) -> LeaseLost:
        return LeaseLost(f"{self.store.location(self.key)}: the lease (generation {self.generation}) "
                         "was taken over by another syncer after it expired; this one stops "
                         "and the other carries on")

    def renew(self) -> None:
        """Extend our lease (``If-Match`` our last etag); :class:`LeaseLost` if it was taken over."""
        with self._lock:
            if self.etag is None:
                raise self._lost()
            now = self.clock()
            try:
                self.etag = self._replace(self._body(self.generation))
            except StoreConflict:
                self.etag = None
                self._held(False)
                raise self._lost() from None
            self.renewed_at, self._renewed_here = now, self.monotonic()

    def _replace(self, body: bytes) -> str | None:
        """Write our lease (``If-Match`` our last etag). Refused, the object read back may
        still be ours: a write of this holder's whose answer was lost once the store's
        retries were spent (a StoreError, our etag left behind) landed all the same. It holds
        our owner and generation, which no other syncer writes, so no one took the lease
        since: the write is made over it (``If-Match`` its etag). Read as taken over, the
        holder gave up a run it still held, and its lease kept every other syncer off for a
        lease lifetime."""
        etag = self.etag
        assert etag is not None
        try:
            return self._landed(lambda: self.store.replace(self.key, body, etag), body)
        except StoreConflict as refused:
            found = refused.current if refused.current is not None else self.store.read(self.key)
            own = found is not None and found[1] is not None and self._own(found[0])
            if not own:
                raise
            assert found is not None and found[1] is not None
            mine = found[1]
            return self._landed(lambda: self.store.replace(self.key, body, mine), body)

    def _landed(self, write: Callable[[], str | None], body: bytes) -> str | None:
        """``write``, a conditional write of ``body``, whose etag it returns. Failed with no
        answer once the store's retries were spent, the object is read back before giving
        up: holding exactly ``body`` (every body carries a nonce), the write landed, and is
        ours. A renewal given up so stopped the pass holding a lease it had just renewed."""
        try:
            return write()
        except StoreConflict:
            raise
        except StoreError as failed:
            try:
                found = self.store.read(self.key)
            except StoreError:
                found = None
            if found is None or found[0] != body:
                raise failed from None
            return found[1]

    def _own(self, data: bytes) -> bool:
        """Whether a lease object's bytes are a write of this holder's: its owner, its
        generation, not given up."""
        try:
            holder = json.loads(data)
        except ValueError:
            return False
        return (isinstance(holder, dict) and holder.get("owner") == self.owner
                and holder.get("generation") == self.generation and holder.get("released") is False)

    def since_renewed(self) -> float:
        """Seconds since our last write of the lease, by the clock that says more: the wall
        one, by which every syncer judges its expiry (and which goes on while a suspended
        machine's monotonic clock stops), or the monotonic one, which a wall clock set back
        cannot shorten (renewals held off by the step let the lease expire mid-wait)."""
        return max(self.clock() - self.renewed_at, self.monotonic() - self._renewed_here)

    def outrank(self, fence: int) -> None:
        """Hold the lease at a generation above ``fence``, the one a state was written under,
        by a renewal (``If-Match`` our last etag, so :class:`LeaseLost` if another syncer took
        the lease since we did). The lease object lost its count (deleted, overwritten: made
        or taken again at generation 1) while the state kept the fence of its last holder;
        every sync stopped as taken over, one generation more each, until the count caught
        up. Renewed, no one can have taken the run since we did, so no holder of ``fence``
        holds it now: its next renewal fails, as a holder taken over does."""
        with self._lock:
            held = self.generation
            self.generation = fence + 1
            try:
                self.renew()
            except BaseException:
                self.generation = held
                raise

    def renew_if_old(self) -> None:
        """Renew once a third of the lease has passed: what long waits call between naps."""
        with self._lock:
            if self.etag is not None and self.since_renewed() > self.ttl / 3:
                self.renew()

    @contextlib.contextmanager
    def kept_alive(self) -> Iterator[None]:
        """Renew the lease in the background while the block runs, so one long request (a
        25 MiB body on a slow link) does not outlast it. The sync still renews before each
        state write: that, not this thread, is the fence. A paused process pauses this
        thread too, so its lease expires as it should."""
        stop = threading.Event()

        def keep() -> None:
            while not stop.wait(max(0.05, self.ttl / 6)):
                try:
                    self.renew_if_old()
                except LeaseLost:
                    return  # the sync's next state write finds out and stops
                except Exception:  # noqa: BLE001  a store hiccup: the next tick tries again
                    continue

        thread = threading.Thread(target=keep, name="prime-runs-lease", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def sleeper(self, sleep: Callable[[float], None] = time.sleep) -> Callable[[float], None]:
        """A ``sleep`` that keeps the lease alive across long waits (the protocol's fences).
        It lasts ``seconds`` of the monotonic clock: to a wall-clock deadline, a clock set
        back mid-wait stalled the sync by the step. That is safe because it only sleeps: how
        old a request is, and so how long a fence lasts, its caller counts (``Protocol.fence``
        asks again after each nap, by the clocks docs/sync.md "Clocks" says)."""
        def nap(seconds: float) -> None:
            deadline = self.monotonic() + seconds
            while (left := deadline - self.monotonic()) > 0:
                sleep(min(left, max(0.05, self.ttl / 4)))
                self.renew_if_old()
        return nap

    def release(self) -> None:
        """Give the lease up (``If-Match``); a lease already taken over is left alone."""
        with self._lock:
            if self.etag is None:
                return
            try:
                self._replace(self._body(self.generation, released=True))
            except StoreConflict:
                pass
            finally:
                self.etag = None
                self._held(False)

    def in_doubt(self) -> bool:
        """Whether a request this holder announced, or one it took over and has not waited
        out, may still land (:attr:`in_flight_until`, as another machine's clock may read it)."""
        return self.in_flight_until + self.clock_skew > self.clock()

    def release_unless_in_doubt(self) -> bool:
        """Give the lease up unless :meth:`in_doubt`, in one step against the sync's writes (a
        request announced after this is refused: the lease is no longer ours); whether it is
        given up (or was not held)."""
        with self._lock:
            if self.etag is not None and self.in_doubt():
                return False
            self.release()
            return True

    def expires_in(self) -> float:
        """Seconds until another syncer may take the lease, left to expire now."""
        return max(0.0, self.renewed_at + self.ttl + self.clock_skew - self.clock())

    def _held(self, held: bool) -> None:
        with _HELD_LOCK:
            (_HELD.add if held else _HELD.discard)(self)


def release_held(seconds: float = RELEASE_AT_EXIT_SECONDS) -> list[str]:
    """On the way out of a process ending at once (a second signal, past the first's grace):
    give up every lease it holds, so the next sync of the run need not wait for it to expire
    (a lease lifetime plus the clock skew: ``skipped``, or a wait with ``--wait``). Not one
    whose holder may have a request that can still land (:meth:`Lease.in_doubt`): that one
    keeps other syncers off until it expires, and the line returned for it says so, and for
    how long; so does one the store did not let go of within ``seconds``. Each release in a
    thread of its own, none waited for past ``seconds``: a store that does not answer would
    hold the exit for its retries."""
    with _HELD_LOCK:
        held = list(_HELD)
    #: Per lease, why it is kept; "" once given up (each written by its own thread only).
    why = [f"it was not given up within {seconds:g} s"] * len(held)

    def give_up(number: int) -> None:
        try:
            released = held[number].release_unless_in_doubt()
            why[number] = "" if released else "a request announced under it may still land"
        except Exception as exc:  # noqa: BLE001 - a store error: the lease expires by itself
            why[number] = f"it could not be given up ({exc})"

    threads = [threading.Thread(target=give_up, args=(number,), daemon=True) for number in range(len(held))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    told = [(lease, reason) for lease, reason in zip(held, list(why)) if reason]
    return [f"{lease.store.location(lease.key)}: {reason}, so the run's "
            f"lease is left to expire, in about {lease.expires_in():.0f} s; until then a sync of the run skips it "
            "(or waits for it, --wait)" for lease, reason in told]


def _in_flight_until(holder: Mapping[str, object]) -> float:
    """The holder's ``in_flight_until``; 0.0 for none, or for a value no syncer writes (a
    lease written before the field existed has none)."""
    value = holder.get("in_flight_until", 0.0)
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        return 0.0
    return max(0.0, float(value))  # type: ignore[arg-type]
