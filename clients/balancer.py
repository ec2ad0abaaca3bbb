"""wok's client-side balancer (asyncio, grpc.aio): a channel per replica, power of two choices,
hedging, retries on another replica, a retry budget and outlier detection.

gRPC's own `round_robin` (wok.clients.channel) keeps sending a replica that hangs (SIGSTOP, a
dead node whose connections stay open) its share of the calls until an unanswered ping closes
the connection: about 5 s after the hang if the connection was carrying calls then (measured
5.1-5.3 s), up to 15 s if it was quiet (keepalive's ping; see wok.clients.channel); it also
keeps sending calls to a replica that is slow or answers INTERNAL, because its health service
still says SERVING. gRPC core's client has no hedging and no outlier detection outside xDS.
This module does both, above gRPC:

Replicas. `target` is "host:port", several of them ("a:p,b:p" or a list), or "dns:///name:port".
Every address a name resolves to (`system_resolver`) is one replica, of one family: when a
name has both (`localhost`: 127.0.0.1 and ::1), those its server accepts TCP connections on,
probed at each lookup (`probing`), as gRPC reaches one name over either family; IPv4 when it
accepts on both, so a dual-stack server is one replica, not two; when on neither, the family
whose connect got no answer in time (a server too busy to accept: its queue is full) over one
that refused it (nothing listens there), as `wok.clients.channel.channel_target` chooses; when
both did alike (not up yet) the family it had, else IPv4; and while neither accepts, the name
is looked up again within a second.
A replica has a grpc.aio channel of its own, with wok's keepalive options and health
checking (`channel_options(retries=False)`): the channel reports TRANSIENT_FAILURE while its
server is NOT_SERVING or gone, READY when it serves; a watcher task per replica follows
`get_state()` / `wait_for_state_change`. gRPC's retries are off on these channels: the
balancer retries, to a different replica. Names are resolved again every
`resolve_every_s`, so a Kubernetes headless Service's pods come and go: a new address gets a
channel, a vanished one gets no new calls and is closed once its calls are done, the streams
open on it (`stream_channel`) included. A name whose lookup fails (or finds nothing) keeps the
replicas it has; the other names' changes apply all the same. So does one whose lookup gives no
answer within `resolve_timeout_s` (10 s: a resolver that never answered stalled the lookups of
every name for good), logged; the lookup is left running, not cancelled, and the name is not
looked up anew while it runs: each lookup again waits for it, up to `resolve_timeout_s`, and
takes its answer once it comes (cancelled, the system resolver's getaddrinfo went on in a thread
until the system gave up, and each period started one more: the loop's default executor filled).
The names are looked up at once, a task each, each bounded on its own (so a resolver of one's
own may be asked for several names at once): one after another, N names whose resolver hung
cost N × resolve_timeout_s at each lookup and at start, and every other name's change waited as
long; now it waits for the slowest lookup, at most one resolve_timeout_s. Their answers are
taken in the targets' order all the same: an address two names share is the first's, and
start() raises for the first name that fails.
A resolver of one's own that raises anything but OSError (its own CancelledError included:
that ended the lookups for good, past every guard, and start() raised a cancellation no one
asked for), or answers what is not a list of addresses ("ip:port", "[v6]:port": a host name,
say, or an IPv6 address whose scope names no interface here, whose channel would fail every
call), is logged (logger `wok.balancer`) and treated alike: the lookups go on; at `start()` it
raises, a ValueError naming the answer for the latter, as for a timeout. One that swallows its
cancellation (catches CancelledError and awaits on) hung stop() for good: a lookup cancelled is
waited for CANCEL_GRACE_S (1 s), then left running, logged.
A lookup again that fails in any other way (a channel gRPC cannot make for a new address, the
probe of a name's two families raising: out of file descriptors) is logged too, and leaves the
set as it was until the next lookup: it ended the lookups for good, silently. Each error is
logged once per name and kind of error until it is over (the name's lookup gives addresses
again, a lookup's new channels are all made, a lookup again goes through: SETTLED_AFTER, 3,
times in a row; told at INFO, with how often it came back untold), and again at its next
occurrence: logged once for the process's life, a name that timed out, answered and timed out
again went untold the second time; over at the first that went through, a name whose lookups
failed every other time was logged at every other lookup.

Picking (`pick`): power of two choices on outstanding attempts: two random replicas among
the READY, non-ejected ones (if none is READY: among the READY ejected ones, then those
connecting, then those failing), the one with fewer calls in flight wins. A slow or hung
replica's calls pile up, so it stops winning: this alone steers most load away from it. A
hedge or a retry never goes to a failing one (channel TRANSIENT_FAILURE): there it would fail
at once, for a budget token; a first attempt does when every replica is down, so that the
call fails at once with UNAVAILABLE instead of waiting for a connection up to its deadline.

Hedging (Dean & Barroso, "The Tail at Scale", 2013): an attempt without an answer after
`hedge_after` gets one more attempt on a different replica; the first OK answer wins (over an
error that came with it) and the others are cancelled; `max_attempts` attempts in all, each
bounded by the caller's deadline. `hedge_after="auto"` (the default) is the 95th percentile of
the last 512 OK attempts' latencies, recomputed every 64 answers, and `hedge_initial_s`
(100 ms) until 64 answers have come, never below `hedge_floor_s` (20 ms; the initial delay neither):
deferring the hedge to the P95 costs about 5% more attempts on a healthy fleet (the paper's
figure), and the floor keeps a fleet that answers in a millisecond from hedging on scheduler
jitter. A number is a fixed delay; None turns hedging off. Inference is idempotent, so two
answers do no harm.

Retries: UNAVAILABLE (connection refused or reset, server draining) is sent again at once to
another replica; only when every replica has been tried (or the others are down) does an
attempt go back to one already tried, after a random backoff of up to 50 ms × 2ⁿ (at most 1 s);
with none left but failing ones, or a backoff that would end at or past the call's deadline,
the call ends with the UNAVAILABLE: the last attempt's, naming the last earlier one that said
something else (`BEFORE`), such as a drained server's "grace period over". Nothing else is
retried or hedged once it comes back: INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED (the fleet
is full: more attempts would feed the overload), DEADLINE_EXCEEDED, INTERNAL (the model failed; it
is the call's answer) and the rest are the call's answer.

Budget (like gRPC's retryThrottling): `budget_tokens` (100) tokens; every retry or hedge
takes one (given back if it never goes out: cancelled in its backoff because another attempt
answered, or its deadline passed first), every OK call gives `budget_ratio` (0.1) back; no
retry or hedge while half the bucket or less is left. So extra attempts are at most about one
per ten OK calls, and a dead fleet costs 50 extra attempts, not `max_attempts` × every call.

Outlier detection (like Envoy's): a replica with `consecutive_failures` (5) failures in a row
(UNAVAILABLE, INTERNAL, UNKNOWN) or as many attempts in a row that reached `hedge_after`
without an answer is ejected: it gets no calls for `base_ejection_s` (2 s) × the times it was
ejected (at most `max_ejection_s`, 30 s); the count is forgotten once it has answered OK,
before `hedge_after`, as many times in a row again. Back in the rotation it is judged afresh:
late attempts and failures before its return (attempts out at its ejection, or sent to it while
ejected) do not count towards its next ejection, so a lasting fault costs as many calls each
time it comes back. At most `max_ejected_fraction` (half, rounded down, but one of two; any
fraction above 0 allows one, and 0 none) of the replicas are ejected at once, never the last
one, so a fault of the whole fleet cannot empty the rotation. The cap holds as the set changes
too: a lookup that leaves more replicas ejected than it allows (the name's other addresses
gone) readmits the excess at once, those ejected for slowness first, then those due back first,
judged afresh (`readmitted_by_cap` in `stats()`; left out, a lone replica ejected got no call
while its channel reconnected, and the next new address took every call until the ejections
ended). And while no replica in the rotation is
READY (the others are down), the READY ejected ones take the calls: a replica ejected for
slowness fills the cap, and the one that dies next could not be ejected in its place. A
READY replica that fails its calls, with the cap full, takes the place of one ejected only for
slowness, which is readmitted early: it stops getting calls after `consecutive_failures`
failures, and as many replicas as before stay in the rotation. Ejected failing ones are
never swapped out: a further failing replica stays in the rotation, taking its share of the
calls and failing them, until an ejection ends (it is ejected at its next failure then). The
cap bounds what the balancer takes out on its own judgement, whatever the ejected ones' fault
(a fault of the whole fleet, or of the client, looks like failing replicas too), and nothing
says an ejected failing one has recovered: it gets no calls while the rotation has a READY
replica, unless its channel goes down and comes back (next). With hedging off
(`hedge_after=None`) attempts are never "late", so only failures eject; with one attempt per
call (`max_attempts=1`) there is no hedge, but an attempt is late all the same. A transient stall
costs a replica 2 s out of the rotation; a lasting fault costs 5 delayed (hedged) or failed
calls each time it comes back, at growing intervals.

Down is not an outlier: the channel's connectivity tracks it already. A failure of an attempt
sent while the replica's channel was neither READY nor IDLE (every replica down, a first
attempt goes to a failing one) does not count towards ejection, and an ejection during which
the channel was TRANSIENT_FAILURE ends as soon as it is READY again: a replica restarted after
a crash (its last calls failed before its channel said so, and ejected it) gets calls again
at once, not after the rest of its ejection. Nor is a replica ejected for slowness while it is
the only READY one in the rotation (the others down or ejected): it carries every call, which
may be why it is slow, it would take them all still, and the first replica back would get all
of them for the rest of its ejection (counted in `ejections_refused`). Unless it hangs: its
server has answered nothing since the first of those late attempts went out while a READY
replica sits out for slowness; that one is readmitted early and the hung one ejected in its
place (a swap). Hedges and retries of a call that has tried every READY replica in the
rotation may go to a READY one ejected for slowness (never to one ejected for failures), so
calls stuck on a hung replica are answered there meanwhile.

Counters (`stats()`): calls, attempts, hedges and retries, each counted as it goes out to its
replica (attempts = first attempts + hedges + retries; a retry cancelled in its backoff, another
attempt having answered, is none of them), refusals by the budget, ejections and those the cap
refused, swaps (a failing or hung replica ejected in the place of a slow one), readmissions by
the cap as the set shrank (`readmitted_by_cap`), and per replica attempts, OK answers, failures,
slow attempts, ejections, early readmissions (its ejection for slowness cut short by a swap),
readmissions by the cap, its state. The totals are the balancer's own: they
keep what a replica counted after re-resolution drops it, while `replicas` lists the current
set only, so the per-replica counters may add up to less than the totals.

One owned object: `await start()` / `await stop()` (or `async with`), made and used in one
running loop. `stop()` cancels the attempts in flight (their callers get CANCELLED, a caller
whose attempt had just failed too: it starts no retry once `stop()` has begun; one whose attempt
had just answered gets that answer, counted as any other) and the resolver, waits until none of
them runs, closes the channels and sees each replica's watcher end with its channel (a watcher
cancelled instead left its connectivity watch in gRPC's core, to complete on a loop closed by
then).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import math
import numbers
import os
import random
import socket
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from wok.errors import NAME_CHARS, cut_message, message_of, quoted, quoted_name, shown_value
from wok.numerals import ascii_digits

from .channel import (
    NAME_OPTIONS,
    PROBE_TIMEOUT_S,
    Probe,
    channel_options,
    close_ending_watches,
    family_of,
    is_target_list,
    loop_future,
    loop_state,
    on_thread,
    open_channel,
    preferred_families,
    probe,
    retrieved,
    split_host_port,
)

CODE = grpc.StatusCode
STATE = grpc.ChannelConnectivity
FAILURES = frozenset({CODE.UNAVAILABLE, CODE.INTERNAL, CODE.UNKNOWN})  # count towards ejection
RETRYABLE = frozenset({CODE.UNAVAILABLE})
LATENCY_WINDOW = 512  # OK attempts kept for the auto hedge delay
LATENCY_EVERY = 64  # recompute the quantile every this many OK attempts
SCHEMA = "wok.balancer/1"
UNDECIDED_RESOLVE_S = 1.0  # look a name up again this soon while its server accepted on neither family
STOPPED = "the balancer was stopped"
# An error logged is over once its name's lookups (or the lookups again, or the channels made) went
# through this many times in a row: re-armed at the first, a name whose lookups alternated failing
# and working was logged at every other lookup, a WARNING and an INFO each time, for good.
SETTLED_AFTER = 3
# How long a lookup the balancer cancelled (stop(), a failed start) is waited for. A resolver of one's own
# that swallows its cancellation (catches CancelledError and awaits on) hung stop() for good; past this,
# its lookup is left running, logged as stuck.
CANCEL_GRACE_S = 1.0

Resolver = Callable[[str, int], Awaitable[list[str]]]
log = logging.getLogger("wok.balancer")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _positive(name: str, value: Any, finite: bool = False, zero: bool = False, unit: str = "") -> None:
    """ValueError unless `value` is a number of seconds > 0, or >= 0 if `zero` (NaN is not; infinity
    only if not `finite`); a `unit` other than seconds makes it a number of that unit, not a duration."""
    if not (_real(value) and (value >= 0 if zero else value > 0) and (not finite or math.isfinite(value))):
        what = f"{'a finite' if finite else 'a'} {'number' if unit else 'duration'} {'>=' if zero else '>'} 0"
        raise ValueError(f"{name}: expected {what} {unit or 'in seconds'}; got {shown_value(value)}")


def _not_below(name: str, value: float, other: str, bound: float) -> None:
    """ValueError if the cap `name` is below `other`: the cap was then every ejection's (or backoff's)
    length, `other` given and never used."""
    if value < bound:
        raise ValueError(f"{name}: expected a duration >= {other} ({bound:g} s), as it caps it; got {value:g} s")


@dataclass(frozen=True)
class BalancerSettings:
    """The balancer's knobs; the module's doc says what each does and why its default. Durations
    are in seconds, finite but `resolve_every_s` (infinite: never looked up again), and > 0 but
    `hedge_floor_s` (0: no floor); `budget_tokens` and `budget_ratio` are finite numbers > 0, as
    gRPC's retryThrottling takes them; the counts are ints (2.0 is refused, as a count in a wok
    config is: a float there is a slip). A cap below what it caps is refused: `max_ejection_s` <
    `base_ejection_s`, `max_backoff_s` < `backoff_s` made the cap every ejection's or backoff's
    length, the other setting given and never used.

    `max_ejected_fraction`: at most this fraction of the replicas (those the names resolve to now)
    are ejected at once, rounded down but at least one while it is above 0 (0.5 of 3 replicas is
    1, 0.1 of 2 is 1), never the last one; 0: none is ever ejected (each ejection due is counted
    in `ejections_refused`), while `consecutive_failures=0` turns detection off. (gRPC's outlier
    detection ejects while fewer than its max_ejection_percent are out: one at any percentage
    above 0, none at 0; Envoy ejected one whatever the value, 0 included, until 1.31 made that
    `always_eject_one_host`, off by default.)

    `resolve_timeout_s`: how long one lookup of a name (the resolver's answer) may take; the names
    are looked up at once, so names that all hang cost it once, not once each. At `start()` a
    lookup past it raises the ValueError of a name that does not resolve; at a lookup again it is
    logged (once per name, until its lookups give addresses SETTLED_AFTER times in a row) and the
    name keeps its replicas; the lookup is left running, and the name's next lookup,
    `resolve_every_s` later, waits for it again rather than start another. (The system resolver
    gives up on a silent name server after 5 s × 2 tries by default: resolv.conf's `timeout` and
    `attempts`; its lookup holds a daemon thread until then, cancelled or not, and neither stop() nor the
    program's exit waits for it: one per name in the process, shared by every balancer that looks it up meanwhile,
    not one more at each period or each start().)
    """

    max_attempts: int = 3
    hedge_after: float | str | None = "auto"  # seconds, "auto" or None (no hedging)
    hedge_quantile: float = 0.95
    hedge_floor_s: float = 0.02
    hedge_initial_s: float = 0.1
    budget_tokens: float = 100.0
    budget_ratio: float = 0.1
    consecutive_failures: int = 5  # 0: no outlier detection
    base_ejection_s: float = 2.0
    max_ejection_s: float = 30.0
    max_ejected_fraction: float = 0.5  # 0: no ejection
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    resolve_every_s: float = 30.0
    resolve_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not (_whole(self.max_attempts) and self.max_attempts >= 1):
            raise ValueError(f"max_attempts: expected a whole number >= 1; got {shown_value(self.max_attempts)}")
        h = self.hedge_after
        # (Not infinite: None says no hedging; an infinite delay did it too, and no attempt was ever late.)
        if not (h is None or h == "auto" or (_real(h) and h > 0 and math.isfinite(h))):
            raise ValueError(
                f"hedge_after: expected a finite duration > 0 in seconds, 'auto' or None; got {shown_value(h)}"
            )
        if not (_real(self.hedge_quantile) and 0 < self.hedge_quantile < 1):
            raise ValueError(f"hedge_quantile: expected a number in (0, 1); got {shown_value(self.hedge_quantile)}")
        f = self.max_ejected_fraction
        if not (_real(f) and 0 <= f <= 1):
            raise ValueError(
                f"max_ejected_fraction: expected a number in [0, 1] (0: no ejection); got {shown_value(f)}"
            )
        k = self.consecutive_failures
        if not (_whole(k) and k >= 0):
            raise ValueError(
                f"consecutive_failures: expected a whole number >= 0 (0: no ejection); got {shown_value(k)}"
            )
        # Unchecked, NaN, a negative, infinity or a string passed here and failed at a call, or did
        # not fail: a NaN hedge_floor_s made the auto delay NaN once 64 answers came (a hedge wait of
        # max(0, NaN), 0 s), budget_tokens=inf refused every retry (inf is not > inf / 2).
        _positive("hedge_floor_s", self.hedge_floor_s, finite=True, zero=True)
        _positive("hedge_initial_s", self.hedge_initial_s, finite=True)
        _positive("budget_tokens", self.budget_tokens, finite=True, unit="(tokens)")
        _positive("budget_ratio", self.budget_ratio, finite=True, unit="(tokens given back per OK call)")
        _positive("base_ejection_s", self.base_ejection_s, finite=True)
        _positive("max_ejection_s", self.max_ejection_s, finite=True)
        _not_below("max_ejection_s", self.max_ejection_s, "base_ejection_s", self.base_ejection_s)
        _positive("backoff_s", self.backoff_s, finite=True)
        _positive("max_backoff_s", self.max_backoff_s, finite=True)
        _not_below("max_backoff_s", self.max_backoff_s, "backoff_s", self.backoff_s)
        _positive("resolve_every_s", self.resolve_every_s)
        _positive("resolve_timeout_s", self.resolve_timeout_s, finite=True)


def split_targets(target: str | Sequence[str]) -> list[tuple[str, int]]:
    """[(host, port)] of "host:port", "a:p,b:p", "dns:///name:port" or a list of them."""
    expected = "expected host:port, [ipv6]:port, dns:///name:port or a list of them"
    if not isinstance(target, str) and not is_target_list(target):  # as channel_target refuses it
        raise TypeError(f"target: {expected}; got {shown_value(target)}")
    items = [t.strip() for t in target.split(",")] if isinstance(target, str) else [str(t).strip() for t in target]
    out = []
    for item in items:
        text = item
        if text.startswith("dns:"):
            text = text[4:].lstrip("/")
            if "/" in text:  # dns://authority/name:port: the authority is a DNS server; we use the system's
                text = text.split("/", 1)[1]
        elif text.startswith(("ipv4:", "ipv6:")):
            text = text[5:]
        parsed = split_host_port(text)
        if parsed is None:
            raise ValueError(
                f"target {quoted_name(item)}: the wok balancer needs host:port, [ipv6]:port or dns:///name:port"
            )
        out.append(parsed)
    if not out:  # said "no target given", naming nothing given
        raise ValueError(f"target: {expected}; got an empty {type(target).__name__}")
    return out


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class _BadAnswer(ValueError):
    """A resolver answered something other than a list of addresses."""


class _NoAnswer(Exception):
    """A resolver gave no answer within `resolve_timeout_s`."""


class _Cancelled(RuntimeError):
    """A resolver's lookup ended cancelled, not by the balancer: its own CancelledError."""


@dataclass
class _Logged:
    """An error logged and not over: how often it came back since, untold, and how many lookups in a
    row went through since it last came (it is over at SETTLED_AFTER)."""

    again: int = 0
    through: int = 0


def _shown(value: Any) -> str:
    """A value a resolver answered, as a message shows it (`shown_value`); a list or anything else
    cut past NAME_CHARS characters, as a string is: an answer of 10,000 addresses made a 200 KB line."""
    return shown_value(value) if isinstance(value, str) else cut_message(shown_value(value), NAME_CHARS)


def _unknown_scope(ip: str) -> str | None:
    """The scope of an IPv6 address ("fe80::1%eth0") when it names no network interface of this
    host: gRPC takes a number, or a name if_nametoindex knows, and fails every call of any other."""
    scope = ip.partition("%")[2]
    if not scope or ascii_digits(scope):
        return None
    try:
        socket.if_nametoindex(scope)
    except OSError:
        return scope
    return None


def _answer(name: str, found: Any) -> list[str]:
    """A resolver's answer for target `name`, each address as `_address` writes it; _BadAnswer naming
    the first that is not "ip:port" or "[ipv6]:port" (a host name among them: the channel made for
    it failed every call, UNKNOWN "the target uri is not valid"; so did an IPv6 address whose scope
    names no interface here, and with an address of the other family, the probe of it raised)."""
    expected = "expected a list of addresses, 'ip:port' or '[ipv6]:port'"
    if not isinstance(found, (list, tuple)):
        raise _BadAnswer(f"target {quoted_name(name)}: the resolver answered {_shown(found)}; {expected}")
    out = []
    for a in found:
        parsed = split_host_port(a) if isinstance(a, str) else None
        ip = None if parsed is None else _literal(parsed[0])
        scope = None if ip is None else _unknown_scope(ip)
        if ip is None or scope is not None or not 0 < parsed[1] < 65536:
            why = "" if scope is None else f" (its scope {quoted_name(scope)} names no network interface of this host)"
            raise _BadAnswer(
                f"target {quoted_name(name)}: the resolver answered {_shown(a)} (of {_shown(list(found))}); "
                f"{expected}{why}"
            )
        out.append(_address(ip, parsed[1]))
    return out


# The system resolver's lookups in flight, one per (host, port) in the process. A lookup that hangs holds its
# thread until the resolver gives up (30 s with resolv.conf's defaults), and nothing can stop it: a start()
# retried after a name failed, or a balancer made per job, started one more thread each time (50 failed starts
# left 50 threads). They all wait for that one lookup now.
_LOOKUPS: dict[tuple[str, int], concurrent.futures.Future] = {}
_LOOKUPS_LOCK = threading.Lock()


def _forget_lookups_in_child() -> None:
    # A child of fork() has none of its parent's threads: a lookup it inherited would never end.
    global _LOOKUPS_LOCK
    _LOOKUPS_LOCK = threading.Lock()
    _LOOKUPS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lookups_in_child)


def _system_lookup(host: str, port: int) -> concurrent.futures.Future:
    """`socket.getaddrinfo(host, port)` on a daemon thread (`on_thread`), shared with every caller that asks for
    the same name while it runs."""
    key = (host, port)
    with _LOOKUPS_LOCK:
        found = _LOOKUPS.get(key)
        if found is not None:
            return found
        found = on_thread("wok-balancer-lookup", socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        _LOOKUPS[key] = found

    def forget(done: concurrent.futures.Future) -> None:
        with _LOOKUPS_LOCK:
            if _LOOKUPS.get(key) is done:
                del _LOOKUPS[key]

    found.add_done_callback(forget)  # (outside the lock: a lookup done already calls it at once)
    return found


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of `host` as "ip:port" or "[v6]:port", IPv4 first, by `socket.getaddrinfo` on a daemon
    thread of its own (`on_thread`); the balancer keeps one family of them (`Balancer`, `probing`).

    Not `loop.getaddrinfo`: that runs on the loop's default executor, and a lookup that hangs held asyncio.run's
    end and the interpreter's exit (both join that executor's threads) until the system resolver gave up, long
    after stop() (30 s with resolv.conf's defaults)."""
    infos = await loop_future(_system_lookup(host, port))
    v4 = [i[4][0] for i in infos if i[0] == socket.AF_INET]
    v6 = [i[4][0] for i in infos if i[0] == socket.AF_INET6]
    return [_address(ip, port) for ip in dict.fromkeys(v4 + v6)]


# A replica's last error (its code and a server's details) is shown in describe() up to this many
# characters: a server's details of 100 KB made each wait_ready timeout's message as long.
ERROR_CHARS = 300


async def probing(addresses: Sequence[str], timeout: float | None = None) -> dict[str, Probe]:
    """`wok.clients.channel.probe` (how each address answers a TCP connect: accepted, no answer
    within `timeout` seconds, PROBE_TIMEOUT_S by default, or refused) on a thread: its wait stays
    off the event loop."""
    return await asyncio.to_thread(probe, addresses, PROBE_TIMEOUT_S if timeout is None else timeout)


@dataclass(eq=False)
class Replica:
    """One server address, its channel and what the balancer knows about it."""

    address: str  # "ip:port"
    name: str  # the target it came from
    channel: Any = None
    state: grpc.ChannelConnectivity = STATE.IDLE
    outstanding: int = 0  # attempts out on its channel (what power of two choices compares)
    launched: int = 0  # attempts launched to it and not ended: those out and those in their backoff
    streams: int = 0  # calls open on its channel that the balancer does not carry (`stream_channel`)
    ejected: bool = False
    ejected_slow: bool = False  # ejected for slow attempts, not failures: gives its place to a failing one
    ejected_down: bool = False  # its channel was TRANSIENT_FAILURE during this ejection: ends when READY
    removed: bool = False
    times_ejected: int = 0
    consecutive_failures: int = 0
    consecutive_slow: int = 0
    consecutive_ok: int = 0
    late_starts: list[float] = field(default_factory=list)  # when its last K late attempts went out
    answered_at: float = -math.inf  # when an answer of its server last came (loop time)
    attempts: int = 0
    ok: int = 0
    failures: int = 0
    slow: int = 0
    hedges: int = 0
    retries: int = 0
    ejections: int = 0
    readmitted_early: int = 0  # ejected for slowness, readmitted early to make room for a failing one
    readmitted_by_cap: int = 0  # readmitted early as the set shrank: its ejection was past the cap
    last_error: str | None = None  # its last failed attempt's code and details
    methods: dict = field(default_factory=dict)
    watcher: asyncio.Task | None = None
    readmit: asyncio.TimerHandle | None = None

    def stats(self) -> dict:
        return {
            "address": self.address,
            "target": self.name,
            "state": self.state.name,
            "ejected": self.ejected,
            "attempts": self.attempts,
            "ok": self.ok,
            "failures": self.failures,
            "slow": self.slow,
            "hedges": self.hedges,
            "retries": self.retries,
            "ejections": self.ejections,
            "readmitted_early": self.readmitted_early,
            "readmitted_by_cap": self.readmitted_by_cap,
        }


class _Attempt:
    __slots__ = ("counts", "due", "kind", "late", "replica", "started", "task")

    def __init__(self, replica: Replica, kind: str = "first") -> None:
        self.replica = replica
        self.kind = kind  # "first", "hedge" or "retry"
        self.due = 0.0  # when it is to go out: its launch, plus any backoff
        self.started: float | None = None  # when the call went out (after any backoff)
        self.late = False  # reached hedge_after without an answer
        self.counts = True  # its failure counts towards ejection: its channel was READY or IDLE
        self.task: asyncio.Task | None = None


# The attribute of a call's final error that holds, as "CODE: details", the last error of an earlier attempt of it
# that said something else: a drained server's "grace period over: ...", retried on a replica gone since, ended
# the call with "Connection refused" alone. The client's InferError shows it (`Answers.error`). Cut as a model's
# message is (errors.cut_message).
BEFORE = "wok_before"


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """An error made here (no replica, the balancer stopped), of the type grpc.aio raises."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class Balancer:
    """Balances unary calls over replicas with hedging, retries and outlier detection (see the module)."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        settings: BalancerSettings | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.targets = split_targets(target)
        self.settings = settings or BalancerSettings()
        self._options = channel_options(options, retries=False)
        self._credentials = credentials
        self._resolve = resolver or system_resolver
        self.replicas: dict[str, Replica] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closing: set[asyncio.Task] = set()  # of _tasks: channels of replicas no longer resolved
        self._retired: set[asyncio.Task] = set()  # their watchers, until they end with the channel
        self._resolver_task: asyncio.Task | None = None
        self._starting: asyncio.Task | None = None  # start()'s lookups
        self._lookups: dict[str, asyncio.Future] = {}  # {name: its resolver's lookup}, until its answer is taken
        self._stuck: set[asyncio.Future] = set()  # lookups cancelled that outlived CANCEL_GRACE_S, until they end
        self._names = {f"{h}:{p}" for h, p in self.targets if _literal(h) is None}
        self._shown_targets = quoted_name(",".join(_address(h, p) for h, p in self.targets))
        self._logged: dict[tuple[str, str, str], _Logged] = {}  # (stage, name, error type) of errors logged, not over
        self._undecided = False  # a name's server accepted on neither of its families at the last lookup
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = self._stopped = False
        self.tokens = self.settings.budget_tokens
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._since_quantile = 0
        # The floor holds from the first call: an initial delay below it hedged on the jitter it is for.
        self._auto_hedge_s = max(self.settings.hedge_floor_s, self.settings.hedge_initial_s)
        self.calls = self.ok_calls = self.attempts = self.hedges = self.retries = 0
        self.budget_refusals = self.ejections = self.ejections_refused = self.swaps = self.readmitted_by_cap = 0

    @property
    def names(self) -> list[str]:
        """The host names among the targets (not IP addresses), each once, in the targets' order: what
        start() looks up, and again every `resolve_every_s`."""
        return list(dict.fromkeys(host for host, _ in self.targets if _literal(host) is None))

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> Balancer:
        """Resolve the targets and open a channel per address; ValueError if none resolves,
        RuntimeError if stop() came first or while the targets were looked up (no channel is made)."""
        if self._started:
            raise RuntimeError("this Balancer was started already")
        if self._stopped:  # its channels would be made after stop() closed them all, and never closed
            raise RuntimeError(f"targets {self._shown_targets}: this Balancer was stopped before it started")
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._started = True
        try:
            # In a task stop() cancels: a stop() from another task while the names were looked up
            # found nothing to close, and this start() made the channels afterwards, never closed.
            starting = self._starting = self._loop.create_task(self._resolve_all(strict=True))
            await asyncio.wait([starting])  # (start()'s caller cancelling it: stop() below ends the task)
            if self._stopped:  # (also when the lookups had ended, just before stop() ran)
                # A lookup's error, left unread, was logged as "never retrieved" when the task went.
                cause = None if starting.cancelled() else starting.exception()
                raise RuntimeError(
                    f"targets {self._shown_targets}: stop() was called while start() looked them up; "
                    "no channel was made"
                ) from cause
            addresses = starting.result()
            if not addresses:
                raise ValueError(f"targets {self._shown_targets}: no address to balance over")
            self._update(addresses)
            if any(_literal(h) is None for h, _ in self.targets):
                self._resolver_task = self._loop.create_task(self._re_resolve())
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        """Cancel the attempts in flight, start()'s lookups (that start() raises RuntimeError) and the
        resolver; close every channel, its watcher ending. A resolver's lookup still running
        CANCEL_GRACE_S after its cancellation is left running, logged (`_end_lookup`). From a loop other than
        start()'s: RuntimeError while that loop is open (`_check_loop`'s); once it has closed (an asyncio.run that
        ended without stop()), the channels are closed, and nothing else: the rest can neither run nor be cancelled."""
        if self._stopped:
            return
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            if not self._loop.is_closed():
                raise self._elsewhere()
            # Its tasks and watchers were cancelled, or abandoned, with their loop; cancelling one now schedules on
            # the closed loop (RuntimeError "Event loop is closed"). A channel's close is gRPC's core's, any loop's.
            self._stopped = True
            for r in self.replicas.values():
                if r.channel is not None:
                    await r.channel.close()
            return
        self._stopped = True
        # Until none is left: a caller woken by an attempt that ended just before stop() sees
        # `_stopped` and launches nothing, but cancelled tasks may still spawn a channel's close.
        while True:
            tasks = [t for t in (self._resolver_task, self._starting) if t is not None and not t.done()]
            tasks += [t for t in self._tasks if not t.done()]
            # A name's lookup past resolve_timeout_s, left running between lookups (`_lookup`), ended
            # apart: the resolver's, it may outlive its cancellation.
            lookups = list(self._lookups.items())
            self._lookups.clear()
            if not tasks and not lookups:
                break
            for t in tasks:
                if t not in self._closing:  # a channel's close is let finish: it is quick
                    t.cancel()
            ends = (self._end_lookup(name, lookup) for name, lookup in lookups)
            await asyncio.gather(*tasks, *ends, return_exceptions=True)
        for r in self.replicas.values():
            if r.readmit is not None:
                r.readmit.cancel()
        # One pass for all: the watchers of the replicas and those of replicas removed earlier.
        channels = [r.channel for r in self.replicas.values() if r.channel is not None]
        watchers = [r.watcher for r in self.replicas.values() if r.watcher is not None]
        await close_ending_watches(channels, watchers + list(self._retired))
        self._notify()

    async def __aenter__(self) -> Balancer:
        return await self.start()

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    # -- replicas -----------------------------------------------------------------------------
    async def _resolve_all(self, strict: bool) -> dict[str, str]:
        """{address: target name}, in the targets' order. The names are looked up at once, a task each,
        each bounded by `resolve_timeout_s` on its own: one after another, N names whose resolver hung
        cost N × resolve_timeout_s at each lookup (and at start), and every other name's change waited
        as long. `strict` (at start) raises for the first name in the targets' order that fails, the
        other lookups cancelled. Not `strict` (a lookup again), a name whose lookup fails, finds
        nothing or takes over `resolve_timeout_s` keeps the replicas it has, and the other names'
        changes apply all the same: one name gone from DNS froze the replica set of every other."""
        out: dict[str, str] = {}
        self._undecided = False
        lookups = {  # (a name given twice is looked up once)
            f"{h}:{p}": self._loop.create_task(self._look_up(h, p)) for h, p in self.targets if _literal(h) is None
        }
        try:
            for host, port in self.targets:
                ip = _literal(host)
                if ip is not None:
                    out.setdefault(_address(ip, port), f"{host}:{port}")
                    continue
                name = f"{host}:{port}"
                # Taken in the targets' order, whichever answers first: that order decides the name an
                # address two names share belongs to, the name start() raises for, and the log's order.
                found, error, choosing = await lookups[name]
                if error is not None:
                    found = self._failed(host, port, found, error, choosing, strict)
                if found:
                    self._rearm("lookup", name, f"its lookup answers again, {_shown(found)}")
                else:  # (failed untold, an OSError, or found nothing: not a lookup that went through)
                    self._unsettled("lookup", name)
                if not found and not strict:
                    for r in self.replicas.values():
                        if r.name == name and not r.removed:
                            out.setdefault(r.address, name)
                    continue
                for a in found:
                    out.setdefault(a, name)
        finally:
            # A name failed at start, or stop() (or start()'s caller) cancelled this task: the lookups
            # still running are cancelled and waited for, so none outlives it.
            running = [task for task in lookups.values() if not task.done()]
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        return out

    async def _look_up(self, host: str, port: int) -> tuple[list[str], Exception | None, bool]:
        """One name's lookup, a task of `_resolve_all`: (its addresses, of one family; None; False), or
        ([], the error of its lookup or answer, False), or (the answer, the error its family's choice
        raised, True). Returned, not raised: `_resolve_all` takes them in the targets' order."""
        name = f"{host}:{port}"
        try:
            found = _answer(name, await self._lookup(host, port))
        except Exception as exc:
            return [], exc, False
        try:
            return (await self._one_family(name, found) if found else found), None, False
        except Exception as exc:
            return found, exc, True

    def _failed(
        self, host: str, port: int, found: list[str], exc: Exception, choosing: bool, strict: bool
    ) -> list[str]:
        """A name's failed lookup (`_look_up`): raised if `strict`, else logged once as its kind asks; []."""
        name = f"{host}:{port}"
        shown = quoted_name(name)
        if choosing:
            if strict:
                raise exc
            # Its probe raised (out of file descriptors, say): it ended the lookups for good.
            what = f"target {shown}: choosing the family of {_shown(found)} failed: {type(exc).__name__}: "
            self._log_once(name, exc, what + message_of(exc), exc_info=True)
        elif isinstance(exc, (_NoAnswer, OSError)):
            if strict:
                raise ValueError(f"target {shown}: cannot resolve {quoted_name(host)}: {exc}") from None
            # A lookup that failed is the resolver's answer, and is not logged; one that hung
            # stalled every later lookup, of every name, silently.
            if isinstance(exc, _NoAnswer):
                self._log_once(name, exc, f"target {shown}: {exc}", logging.WARNING)
        else:
            if strict:
                raise exc
            # A resolver of one's own may raise anything (a bug, its library's error), or answer
            # what is no address: the one ended the lookups for good, silently, the other
            # replaced the name's replicas with channels that fail every call.
            told = isinstance(exc, (_BadAnswer, _Cancelled))  # (messages that name the target)
            what = str(exc) if told else f"target {shown}: the resolver raised {type(exc).__name__}: {message_of(exc)}"
            self._log_once(name, exc, what, exc_info=not told)
        return []

    async def _lookup(self, host: str, port: int) -> Any:
        """The resolver's answer; _NoAnswer if it gives none within `resolve_timeout_s`, _Cancelled if
        it ends cancelled by another than the balancer: its own CancelledError (a shared lookup it
        waited on, cancelled) ended the lookups for good, past every guard, and start() raised a
        cancellation no one asked for. `asyncio.wait`'s timeout, not wait_for's: a TimeoutError the
        resolver raises is its answer (an OSError: the name does not resolve), not a lookup that
        took too long.

        A lookup past `resolve_timeout_s` is not cancelled but left running, and the name's next
        lookup waits for it again (up to `resolve_timeout_s`), taking its answer, rather than start
        another: cancelled, the system resolver's getaddrinfo went on in its thread until the system
        gave up, and each period started one more; a name that hung piled up threads (when they were
        the loop's default executor's, it filled, 6 threads on 2 cores, and every `asyncio.to_thread`
        of the process, the family probes included, queued behind them). stop() cancels it."""
        timeout = self.settings.resolve_timeout_s
        name = f"{host}:{port}"
        lookup = self._lookups.get(name)
        if lookup is None:
            lookup = self._lookups[name] = asyncio.ensure_future(self._resolve(host, port))
        try:
            # Not `await lookup`: this task's cancellation (stop(), start()'s caller, a failed start)
            # would then look the same as the lookup's own.
            await asyncio.wait([lookup], timeout=timeout)
        except asyncio.CancelledError:  # this task was: the lookup with it, and waited for
            if self._lookups.get(name) is lookup:
                del self._lookups[name]
            await self._end_lookup(name, lookup)
            raise
        if not lookup.done():
            raise _NoAnswer(f"the resolver gave no answer within {timeout:g} s (resolve_timeout_s)")
        self._lookups.pop(name, None)  # (stop() may have taken it: it cancels those left running)
        if not lookup.cancelled():
            return lookup.result()
        raise _Cancelled(
            f"target {quoted_name(f'{host}:{port}')}: the resolver's lookup of {quoted_name(host)} ended cancelled, "
            "not by the balancer (the resolver's own CancelledError)"
        )

    async def _end_lookup(self, name: str, lookup: asyncio.Future) -> None:
        """Cancel a name's lookup and wait for its end, up to CANCEL_GRACE_S: a resolver that swallows
        its cancellation is left running past it (kept, and logged once), so that stop() ends. Its
        answer, if one came, is read: unread, "exception was never retrieved"."""
        lookup.cancel()
        await asyncio.wait([lookup], timeout=CANCEL_GRACE_S)
        if lookup.done():
            retrieved(lookup)
            return
        if lookup in self._stuck:  # (stop() and the lookup's own task both wait for it)
            return
        self._stuck.add(lookup)
        lookup.add_done_callback(self._stuck_ended)
        log.error(
            "target %s: the resolver's lookup of %s did not end within %g s of its cancellation (a resolver "
            "that catches CancelledError and goes on); it is left running",
            quoted_name(name),
            quoted_name(name.rpartition(":")[0]),
            CANCEL_GRACE_S,
        )

    def _stuck_ended(self, lookup: asyncio.Future) -> None:
        self._stuck.discard(lookup)
        retrieved(lookup)

    def _log_once(
        self,
        name: str,
        exc: BaseException,
        what: str,
        level: int = logging.ERROR,
        exc_info: bool = False,
        stage: str = "lookup",
    ) -> None:
        """Log `what` (an error of the lookups again: they go on) once per name and kind of error,
        not at every period, until it is over (`_rearm`): logged once for the process's life, a
        name's second outage went untold. `stage`: "lookup" (the name's lookup), "channel" (a
        channel for its new address) or "round" (a lookup again as a whole, name "")."""
        kind = (stage, name, f"{type(exc).__module__}.{type(exc).__qualname__}")
        self._unsettled(stage, name)
        if kind in self._logged:
            self._logged[kind].again += 1
            return
        self._logged[kind] = _Logged()
        keep = "its replicas are kept and it is" if name in self._names else "the replicas are kept and the names are"
        log.log(
            level,
            "%s; %s looked up again every %g s (this error is logged once, until it is over)",
            what,
            keep,
            self.settings.resolve_every_s,
            exc_info=exc if exc_info else None,
        )

    def _unsettled(self, stage: str, name: str) -> None:
        """`name` failed again at `stage`: the errors logged for it start again counting lookups in a row."""
        for kind, logged in self._logged.items():
            if kind[:2] == (stage, name):
                logged.through = 0

    def _rearm(self, stage: str, name: str | None, how: str) -> None:
        """`stage` went through (for `name`, or for all): the errors logged there are over once it has
        SETTLED_AFTER times in a row, as `how` says: told at INFO, with how often they came back untold,
        so that a warning's end is in the log too, and the next such error is logged again."""
        over: dict[str, int] = {}  # subject: times its errors came back untold
        for kind, logged in list(self._logged.items()):
            if kind[0] == stage and (name is None or kind[1] == name):
                logged.through += 1
                if logged.through >= SETTLED_AFTER:
                    del self._logged[kind]
                    over[kind[1]] = over.get(kind[1], 0) + logged.again
        for subject in sorted(over):
            shown = f"target {quoted_name(subject)}" if subject else f"targets {self._shown_targets}"
            again = over[subject]
            untold = f", which came back {again} time{'s' * (again != 1)} since, untold" if again else ""
            log.info(
                "%s: %s (%d lookups in a row, after the error logged before%s: the next one is logged again)",
                shown,
                how,
                SETTLED_AFTER,
                untold,
            )

    async def _one_family(self, name: str, found: list[str]) -> list[str]:
        """Those of a name's addresses of the family its server answers on best (`preferred_families`,
        as channel_target): the one it accepts TCP connections on, IPv4 when both (a dual-stack
        server is one replica, not two); when neither, the one that got no answer over the one that
        refused; when both did alike (not up yet, or down), the family its replicas have now, else
        IPv4. While neither accepts the name is looked up again within a second."""
        if len({family_of(a) for a in found}) < 2:
            return found
        outcomes = await probing(found)
        families = preferred_families(found, outcomes)
        if not any(outcomes.get(a) is Probe.ACCEPTED for a in found):
            # Not only a tie: no answer may also be a host that drops connections, with the
            # server coming up on the family that refused; it must not wait resolve_every_s.
            self._undecided = True
            if len(families) > 1:
                had = {family_of(r.address) for r in self.replicas.values() if r.name == name and not r.removed}
                families = had or families
        family = socket.AF_INET if socket.AF_INET in families else socket.AF_INET6
        return [a for a in found if family_of(a) == family]

    def _update(self, addresses: dict[str, str], strict: bool = True) -> None:
        """Apply a lookup's {address: target name}: a channel for each new address, the vanished ones
        closed once idle. All or nothing: if a channel cannot be made (gRPC's constructor raised),
        those made for the others are closed and the set stays as it was; `strict` (at start) it
        raises, else it is logged once per name and kind of error until a lookup's channels are all
        made, the next lookup trying again (it ended the lookups for good, silently: names never
        changed again)."""
        opened: list[Replica] = []
        for address, name in addresses.items():
            if address in self.replicas:
                continue
            r = Replica(address, name)
            options = list(self._options)
            host = name.rpartition(":")[0]
            # TLS checks the name, not the address; unless the caller's options name one already
            # (ssl_target_name_override: a second name would fail every call, "call host does
            # not match SSL server name").
            if _literal(host) is None and not any(key in NAME_OPTIONS for key, _ in options):
                options.append(("grpc.default_authority", name))
            target = ("ipv6:" if address.startswith("[") else "ipv4:") + address
            try:
                r.channel = open_channel(grpc.aio, target, self._credentials, options)
            except Exception as exc:
                for o in opened:
                    self._close_channel(o.channel)
                if strict:
                    raise
                what = f"target {quoted_name(name)}: no channel could be made to {address}: {type(exc).__name__}: "
                self._log_once(name, exc, what + message_of(exc), exc_info=True, stage="channel")
                return
            opened.append(r)
        for r in opened:
            r.watcher = self._loop.create_task(self._watch(r))
            self.replicas[r.address] = r
        for address, r in list(self.replicas.items()):
            if address in addresses:
                r.removed = False  # (one that came back before its channel was closed)
            elif not r.removed:
                r.removed = True
                self._close_if_idle(r)
        self._within_cap()
        self._notify()
        self._rearm("channel", None, "the channels of its new addresses were made")

    def _close_channel(self, channel) -> asyncio.Task:
        """Close `channel` in a task that stop() lets finish (it is quick) rather than cancel."""
        closing = self._spawn(channel.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        return closing

    def _close_if_idle(self, r: Replica) -> None:
        # After stop() nothing is started: it closed every channel, and waits for no later task.
        if r.removed and r.launched == 0 and r.streams == 0 and not self._stopped and self.replicas.get(r.address) is r:
            del self.replicas[r.address]
            if r.readmit is not None:
                r.readmit.cancel()
            self._close_channel(r.channel)
            if r.watcher is not None:  # it ends with the channel; stop() sees to one that has not
                self._retired.add(r.watcher)
                r.watcher.add_done_callback(self._retired.discard)

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _re_resolve(self) -> None:
        while True:
            # A server that accepted on neither family was given one by a guess, or for no answer
            # over a refusal: a server coming up on the other must not wait resolve_every_s for calls.
            every = self.settings.resolve_every_s
            await asyncio.sleep(min(every, UNDECIDED_RESOLVE_S) if self._undecided else every)
            try:
                addresses = await self._resolve_all(strict=False)
                if addresses:  # (a name whose lookup failed or found nothing keeps its replicas)
                    self._update(addresses, strict=False)
            except Exception as exc:
                # A last guard (the errors known are the names' own, above): this task ended for good
                # at an error, silently, and the names never changed again.
                what = f"targets {self._shown_targets}: a lookup again failed: {type(exc).__name__}: "
                self._log_once("", exc, what + message_of(exc), exc_info=True, stage="round")
            else:
                self._rearm("round", None, "a lookup again went through")

    async def _watch(self, r: Replica) -> None:
        state = r.channel.get_state(try_to_connect=True)
        while True:
            r.state = state
            if r.ejected and state is STATE.TRANSIENT_FAILURE:
                r.ejected_down = True
            elif r.ejected_down and state is STATE.READY and r.readmit is not None:
                # Its server was down (failures then are the channel's, which connectivity
                # tracks) and serves again: keeping it out longer would only delay its return.
                r.readmit.cancel()
                self._readmit(r)
            self._notify()
            try:
                await r.channel.wait_for_state_change(state)
                state = r.channel.get_state(try_to_connect=True)
            except (grpc.aio.UsageError, AssertionError):
                # Its channel was closed: grpc.aio asserts that a watch succeeded, and refuses
                # one on a closed channel. The watch has ended in gRPC's core.
                if r.removed or self._stopped:
                    return
                raise

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Return at the next change: a replica's state, an ejection, the set of replicas, a hedge or
        retry launched, sent, refused by the budget or given its token back unsent, an attempt found
        late (for tests and waiters)."""
        await self._changed.wait()

    async def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float | None = None,
        what: str = "as awaited",
        *,
        within: str | None = None,
    ) -> None:
        """Wait until `predicate()` holds, re-checked at each change; TimeoutError if not in time,
        naming the targets, `what` was awaited and each replica's state and last error, and the time
        waited as `within` says it ("{timeout} s" by default: a caller that waited before for other
        things quotes its own timeout)."""

        async def loop() -> None:
            while not predicate():
                await self.changed()

        try:
            await asyncio.wait_for(loop(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.describe()}: not {what} within {within or f'{timeout} s'}") from None

    async def wait_ready(self, timeout: float | None = None, *, within: str | None = None) -> None:
        """Wait until at least one replica is READY; TimeoutError past `timeout` (`wait_for`'s `within`)."""

        def ready() -> bool:
            return any(r.state is STATE.READY for r in self.replicas.values())

        await self.wait_for(ready, timeout, "connected (no replica READY)", within=within)

    def describe(self) -> str:
        """The targets (quoted, as the module's other messages show them: a target is the user's
        text) and each replica's state and last error (quoted, escaped and cut past ERROR_CHARS: a
        server's details), for messages: "'localhost:8001' (127.0.0.1:8001 TRANSIENT_FAILURE, last
        error 'UNAVAILABLE: ...')"."""
        parts = []
        for r in self.replicas.values():
            part = f"{r.address} {r.state.name}" + (" ejected" if r.ejected else "")
            parts.append(part + (f", last error {quoted(r.last_error, ERROR_CHARS)}" if r.last_error else ""))
        return f"{self._shown_targets} ({'; '.join(parts) or 'no replica'})"

    def replica(self, address: str) -> Replica:
        return self.replicas[address]

    # -- picking ------------------------------------------------------------------------------
    def pick(self, exclude: Sequence[Replica] = (), *, extra: bool = False) -> Replica | None:
        """Power of two choices on outstanding attempts among the best-connected usable replicas.

        `extra` (a hedge or a retry): never a replica whose channel is TRANSIENT_FAILURE. A first
        attempt may go to one when no replica is better connected, to fail at once (UNAVAILABLE)
        rather than wait; an extra attempt there would fail at once too, spending a budget token
        for nothing, and the call is already answered or waited for elsewhere."""
        tiers: tuple[list[Replica], ...] = ([], [], [], [])
        # Excluded replicas count here: while one in the rotation is READY, a hedge or retry never
        # lands on an ejected one (slow, or failing: its INTERNAL would become the call's answer).
        rotation_ready = False
        for r in self.replicas.values():
            if r.removed:
                continue
            rotation_ready |= r.state is STATE.READY and not r.ejected
            if r in exclude:
                continue
            if r.ejected:
                # Out of the rotation only while another can take its calls: with the cap on
                # ejections, a replica ejected for slowness can leave only dead ones behind.
                if r.state is STATE.READY:
                    tiers[1].append(r)
            elif r.state is STATE.READY:
                tiers[0].append(r)
            elif r.state is STATE.TRANSIENT_FAILURE:
                if not extra:
                    tiers[3].append(r)
            elif r.state is not STATE.SHUTDOWN:
                tiers[2].append(r)
        if rotation_ready:
            # A hedge or retry whose call has tried every READY replica in the rotation may go to
            # a READY one ejected for slowness (it answers, if slowly: the rotation's may have gone
            # silent), never to one ejected for failures (its INTERNAL would be the call's answer).
            tiers[1][:] = [r for r in tiers[1] if extra and r.ejected_slow]
        for c in tiers:
            if len(c) == 1:
                return c[0]
            if c:
                a, b = random.sample(c, 2)
                return b if b.outstanding < a.outstanding else a
        return None

    # -- outlier detection --------------------------------------------------------------------
    def _ejection_cap(self, live: int) -> int:
        """How many of `live` replicas may be ejected at once: `max_ejected_fraction` of them,
        rounded down but at least one, never all; none at 0 (which allowed one all the same)."""
        fraction = self.settings.max_ejected_fraction
        if live < 2 or fraction == 0:
            return 0
        return min(live - 1, max(1, math.floor(fraction * live)))

    def _eject(self, r: Replica, slow: bool = False) -> None:
        if r.ejected or r.removed or self._stopped:
            return  # (stopped: an answer counted after stop() starts no readmission timer)
        live = [x for x in self.replicas.values() if not x.removed]
        if sum(x.ejected for x in live) >= self._ejection_cap(len(live)):
            # A slow replica still answers, a failing one fails every call it gets: with the cap
            # full, a failing one takes the place of the slow one due back first, readmitted now.
            slow_ones = [x for x in live if x.ejected and x.ejected_slow and x.readmit is not None]
            if slow or not slow_ones:
                self.ejections_refused += 1
                return
            self._readmit_early(slow_ones)
        r.ejected = True
        r.ejected_slow = slow
        r.ejected_down = r.state is STATE.TRANSIENT_FAILURE
        r.times_ejected += 1
        r.ejections += 1
        self.ejections += 1
        r.consecutive_failures = r.consecutive_slow = r.consecutive_ok = 0
        duration = min(self.settings.max_ejection_s, self.settings.base_ejection_s * r.times_ejected)
        r.readmit = self._loop.call_later(duration, self._readmit, r)
        self._notify()

    def _within_cap(self) -> None:
        """After the set of replicas changed: readmit the ejected ones past the cap. The cap was held
        only at each ejection, so a name whose other addresses left kept its ejected ones out, all
        of them at worst: a lone replica ejected got no call while its channel reconnected ("no
        replica to send to"), and the first new address took every call for the ejections' rest.
        Those ejected for slowness come back first (they answer), then those due back first."""
        live = [x for x in self.replicas.values() if not x.removed]
        ejected = [x for x in live if x.ejected]
        excess = len(ejected) - self._ejection_cap(len(live))
        if excess <= 0:
            return
        ejected.sort(key=lambda x: (not x.ejected_slow, x.readmit.when() if x.readmit is not None else -math.inf))
        for x in ejected[:excess]:
            if x.readmit is not None:
                x.readmit.cancel()
            x.readmitted_by_cap += 1
            self.readmitted_by_cap += 1
            self._readmit(x)

    def _readmit_early(self, slow_ones: list[Replica]) -> None:
        """Readmit the one of `slow_ones` (ejected for slowness) due back first: a swap."""
        back = min(slow_ones, key=lambda x: x.readmit.when())
        back.readmit.cancel()
        back.readmitted_early += 1
        self.swaps += 1
        self._readmit(back)

    def _readmit(self, r: Replica) -> None:
        r.ejected = r.ejected_slow = r.ejected_down = False
        r.readmit = None
        # Judged afresh: K late attempts or failures in a row after its return, as before its first
        # ejection. Those of attempts out at its ejection, or sent to it meanwhile, ejected it again
        # at its first late attempt or failure back (a lasting fault cost 1 call per return, not K).
        r.consecutive_failures = r.consecutive_slow = 0
        r.late_starts = []
        self._notify()

    def _answered(self, a: _Attempt, code: grpc.StatusCode, latency_s: float | None) -> None:
        """Record an attempt's answer for outlier detection and the hedge delay."""
        r, k = a.replica, self.settings.consecutive_failures
        if a.started is not None and code is not CODE.DEADLINE_EXCEEDED and code is not CODE.CANCELLED:
            r.answered_at = self._loop.time()  # not those two: the client's own timer or cancel
        if not a.late:
            r.consecutive_slow = 0
        if code in FAILURES:
            r.failures += 1
            r.consecutive_ok = 0
            # Not one sent while its channel was neither READY nor IDLE (every replica down: a
            # first attempt goes to one anyway): that is the channel's state, which connectivity
            # tracks, and it would eject a replica that is about to come back.
            if a.counts:
                r.consecutive_failures += 1
                if k and r.consecutive_failures >= k:
                    self._eject(r)
        elif code is CODE.OK:
            r.ok += 1
            r.consecutive_failures = 0
            # Only answers in time count towards forgetting ejections: a slow replica answers OK too.
            r.consecutive_ok = 0 if a.late else r.consecutive_ok + 1
            if r.times_ejected and r.consecutive_ok >= max(1, k):
                r.times_ejected = 0
            if latency_s is not None:
                self._latencies.append(latency_s)
                self._since_quantile += 1
                if self._since_quantile >= LATENCY_EVERY:
                    self._since_quantile = 0
                    ordered = sorted(self._latencies)
                    q = ordered[min(len(ordered) - 1, math.ceil(self.settings.hedge_quantile * len(ordered)) - 1)]
                    self._auto_hedge_s = max(self.settings.hedge_floor_s, q)
        elif code is not CODE.DEADLINE_EXCEEDED and code is not CODE.CANCELLED:
            r.consecutive_failures = 0  # an answer: the replica works

    def _late(self, a: _Attempt) -> None:
        a.late = True
        r = a.replica
        r.slow += 1
        self._notify()
        if r.ejected:
            # Out already (an attempt sent before its ejection, or while it takes calls ejected):
            # nothing to judge. Counted, an ejected slow one that alone is READY was "hung" and
            # swapped out for itself, its ejection lengthened.
            return
        r.consecutive_slow += 1
        k = self.settings.consecutive_failures
        if k:
            r.late_starts = [*r.late_starts, a.started][-k:]
        if k and r.consecutive_slow >= k:
            if not any(
                x is not r and not x.removed and not x.ejected and x.state is STATE.READY
                for x in self.replicas.values()
            ):
                # Slow while it is the only READY one in the rotation: it carries every call, and
                # that load may be its slowness. Ejected, it would take the calls still (no other is
                # READY), and the first replica back would get all of them for the ejection's rest.
                # Unless its server has answered nothing since the first of its last K late attempts
                # went out (hung, not slow) while a READY one sits out for slowness: that one comes
                # back early and this one takes its place. Not on slowness alone: two slow replicas
                # of a loaded fleet would trade places at every K late attempts.
                back = [
                    x
                    for x in self.replicas.values()
                    if x.ejected_slow and not x.removed and x.state is STATE.READY and x.readmit is not None
                ]
                if back and r.answered_at < r.late_starts[0]:
                    self._readmit_early(back)
                    self._eject(r, slow=True)
                    return
                self.ejections_refused += 1
                self._notify()
                return
            self._eject(r, slow=True)

    @property
    def hedge_after_s(self) -> float | None:
        """The current hedge delay in seconds (None: no hedging)."""
        h = self.settings.hedge_after
        if h is None:
            return None
        return self._auto_hedge_s if h == "auto" else float(h)

    # -- budget -------------------------------------------------------------------------------
    def _spend(self) -> bool:
        if self.tokens > self.settings.budget_tokens / 2:
            self.tokens -= 1
            return True
        self.budget_refusals += 1
        self._notify()
        return False

    # -- calls --------------------------------------------------------------------------------
    def unary_unary(self, method: str, request_serializer=None, response_deserializer=None) -> _Method:
        """A callable like grpc.aio's multicallable: `await m(request, timeout=..., metadata=...)`."""
        return _Method(self, method, request_serializer, response_deserializer)

    async def _attempt(self, a: _Attempt, key, request, deadline: float | None, metadata, delay: float):
        if delay:
            await asyncio.sleep(delay)
        loop = self._loop
        r = a.replica
        timeout = None if deadline is None else deadline - loop.time()
        if timeout is not None and timeout <= 0:
            return CODE.DEADLINE_EXCEEDED, None, rpc_error(CODE.DEADLINE_EXCEEDED, "Deadline Exceeded")
        r.outstanding += 1
        r.attempts += 1
        self.attempts += 1
        # Hedges and retries are counted as they go out, as attempts are: one cancelled in its
        # backoff (another attempt answered) or past the deadline before it went out was counted
        # in `retries` (its replica's: "sent to it") but not in `attempts`.
        if a.kind == "hedge":
            self.hedges += 1
            r.hedges += 1
            self._notify()
        elif a.kind == "retry":
            self.retries += 1
            r.retries += 1
            self._notify()
        a.started = loop.time()
        a.counts = r.state is STATE.READY or r.state is STATE.IDLE
        try:
            mc = r.methods.get(key)
            if mc is None:
                mc = r.channel.unary_unary(key[0], request_serializer=key[1], response_deserializer=key[2])
                r.methods[key] = mc
            return CODE.OK, await mc(request, timeout=timeout, metadata=metadata), None
        except grpc.aio.AioRpcError as exc:
            if exc.code() in FAILURES:
                r.last_error = f"{exc.code().name}: {exc.details()}"
            # Without its traceback: that holds grpc's call, and the call its channel open in the
            # core past close() (the error, the attempt's task and frame are a cycle): the
            # channel's connectivity watch would end only when the collector ran.
            return exc.code(), None, exc.with_traceback(None)
        except grpc.aio.UsageError as exc:
            # The channel was closed under this attempt (a last guard: stop() cancels the attempts
            # first, and a replica's channel is closed once its attempts are done). Not an
            # AioRpcError, so it would reach the caller raw, past AsyncClient's InferError.
            code = CODE.CANCELLED if self._stopped else CODE.UNAVAILABLE
            return code, None, rpc_error(code, f"replica {r.address}: {exc}")
        finally:
            r.outstanding -= 1

    def _launch(self, pending: dict, a: _Attempt, key, request, deadline, metadata, delay: float = 0.0) -> None:
        if self._stopped:  # stop() waits for the attempts it knows of: start none after it
            raise rpc_error(CODE.CANCELLED, STOPPED)
        a.due = self._loop.time() + delay
        # Its replica's channel stays open from its launch to its task's end, not only while the call
        # is out: a retry sleeping in its backoff counted for nothing, so a lookup that dropped the
        # address closed the channel "as idle", and the retry woke to it closed (UNAVAILABLE, "Channel
        # is closed"). (A callback, not the task's `finally`: a task cancelled before it ran runs none.)
        # Counted once the task exists (it runs no sooner than the next turn of the loop): a create_task
        # that raised (a closed loop) left the count up for good, and the channel never closed as idle.
        attempt = self._attempt(a, key, request, deadline, metadata, delay)
        try:
            a.task = self._loop.create_task(attempt)
        except BaseException:
            # Defensive, reached by no test since call()'s _check_loop refuses a closed loop first: a coroutine
            # that never ran warned "coroutine 'Balancer._attempt' was never awaited" once collected.
            attempt.close()
            raise
        a.replica.launched += 1
        self._tasks.add(a.task)
        a.task.add_done_callback(self._tasks.discard)
        a.task.add_done_callback(lambda _: self._attempt_ended(a.replica))
        if a.kind != "first":
            a.task.add_done_callback(lambda _: self._unsent(a))
        pending[a.task] = a

    def _attempt_ended(self, r: Replica) -> None:
        r.launched -= 1
        if r.removed:
            self._close_if_idle(r)

    def _unsent(self, a: _Attempt) -> None:
        """A hedge or retry ended: one that never went out (cancelled in its backoff or before it
        ran, or its deadline passed first) gives its budget token back; the budget pays for extra
        attempts sent."""
        if a.started is None:
            self.tokens = min(self.settings.budget_tokens, self.tokens + 1)
            self._notify()

    def _check_running(self) -> None:
        if not self._started or self._stopped:
            raise RuntimeError("the Balancer is not running: use `async with Balancer(...)` or start()")

    def _no_replica(self) -> grpc.aio.AioRpcError:
        return rpc_error(
            CODE.UNAVAILABLE, f"targets {self._shown_targets}: no replica to send to among {len(self.replicas)}"
        )

    def _check_loop(self) -> None:
        """RuntimeError for a call from a loop other than start()'s: its channels and attempts belong to that loop.
        Its attempts were scheduled there, and the call waited for them for good, past its timeout (only an attempt
        enforces it): start()'s loop, not running, never ran them; running on another thread, its tasks' ends
        never woke the caller's loop (asyncio's callbacks are not thread-safe). One check per call, ~0.1 us."""
        if asyncio.get_running_loop() is not self._loop:
            raise self._elsewhere()

    def _elsewhere(self) -> RuntimeError:
        return RuntimeError(
            f"targets {self._shown_targets}: the Balancer was called on a loop other than the one it was started "
            f"on, which {loop_state(self._loop)}; its channels and attempts belong to that loop: call it there, or "
            "make a Balancer (an AsyncClient) per loop"
        )

    async def call(self, key, request, timeout: float | None, metadata):
        """One call: attempts, hedges and retries as the module says; raises grpc.aio.AioRpcError, or RuntimeError
        before start(), after stop(), or on a loop other than start()'s (`_check_loop`)."""
        self._check_running()
        self._check_loop()
        loop, s = self._loop, self.settings
        self.calls += 1
        deadline = None if timeout is None else loop.time() + timeout
        first = self.pick()
        if first is None:
            raise self._no_replica()
        pending: dict[asyncio.Task, _Attempt] = {}
        tried = [first]
        sent = 1
        backoffs = 0
        last_error: grpc.aio.AioRpcError | None = None
        before: grpc.aio.AioRpcError | None = None  # the last earlier error unlike last_error: see BEFORE
        self._launch(pending, _Attempt(first), key, request, deadline, metadata)
        last_launch = loop.time()
        try:
            while pending:
                hedge_s = self.hedge_after_s
                wake = math.inf
                if hedge_s is not None:
                    if sent < s.max_attempts:
                        wake = last_launch + hedge_s
                    for a in pending.values():
                        # One not started yet (its task has not run) by when it is due: skipped, a
                        # call's last attempt (its first, with max_attempts 1) was never found late.
                        if not a.late:
                            wake = min(wake, (a.due if a.started is None else a.started) + hedge_s)
                wait = None if wake == math.inf else max(0.0, wake - loop.time())
                done, _ = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                now = loop.time()
                retry = 0
                answers = []
                for task in done:
                    a = pending.pop(task)
                    if task.cancelled():  # only stop() cancels an attempt: the call ends below
                        continue
                    code, response, error = task.result()
                    started = a.started
                    self._answered(a, code, None if started is None else now - started)
                    answers.append((code, response, error))
                # Answers that came together are all recorded (above), and an OK one among them is the
                # call's answer, whatever came with it: `done` is a set, in no order. Taken in its order,
                # a hedge's INTERNAL could beat the OK that came with it, and the answers after the
                # first to end the call went uncounted (a replica's ok and failures, its ejection).
                # So is one that came before stop(), counted as any other (its replica's ok, the hedge
                # delay's latencies and the budget's token were not).
                for code, response, _ in answers:
                    if code is CODE.OK:
                        self.ok_calls += 1
                        self.tokens = min(s.budget_tokens, self.tokens + s.budget_ratio)
                        return response
                if self._stopped or len(answers) < len(done):
                    # Anything but an OK answer ends here once stop() has begun, even an attempt that
                    # failed before it (an UNAVAILABLE would launch a retry that stop() does not know
                    # of, on a channel it closes): the caller gets CANCELLED.
                    raise rpc_error(CODE.CANCELLED, STOPPED)
                for code, _, error in answers:
                    if code not in RETRYABLE:
                        raise error
                    if last_error is not None and last_error.details() != error.details():
                        before = last_error
                    last_error = error
                    retry += 1
                if hedge_s is not None:
                    for a in pending.values():
                        if a.started is not None and not a.late and now >= a.started + hedge_s:
                            self._late(a)
                extra = []
                while retry and sent < s.max_attempts:
                    extra.append("retry")
                    retry -= 1
                if not extra and hedge_s is not None and sent < s.max_attempts and now >= last_launch + hedge_s:
                    extra.append("hedge")
                for kind in extra:
                    busy = [a.replica for a in pending.values()]
                    r = self.pick(exclude=tried, extra=True) or self.pick(exclude=busy, extra=True)
                    delay, backoff = 0.0, r is not None and r in tried and kind == "retry"
                    if backoff:
                        delay = random.uniform(0, min(s.max_backoff_s, s.backoff_s * 2**backoffs))
                        if deadline is not None and now + delay >= deadline:
                            # It would wake at or past the deadline, to fail DEADLINE_EXCEEDED unsent:
                            # the call ended up to max_backoff_s late, for a token. It ends now, with
                            # its UNAVAILABLE, unless another attempt is still out.
                            continue
                    if r is None or not self._spend():
                        if kind == "hedge":
                            last_launch = now  # try again one hedge delay later
                        continue
                    backoffs += backoff
                    tried.append(r)
                    sent += 1
                    # Counted in `hedges` or `retries` once it goes out (`_attempt`), as in `attempts`.
                    self._launch(pending, _Attempt(r, kind), key, request, deadline, metadata, delay)
                    last_launch = now
                    self._notify()
            if before is not None:  # set only beside a later last_error that said something else
                # Cut (errors.MESSAGE_BYTES): whole, it about doubled the final error's text, the earlier details
                # being as long as a server's details may be.
                setattr(last_error, BEFORE, cut_message(f"{before.code().name}: {before.details()}"))
            raise last_error or rpc_error(CODE.UNAVAILABLE, "no attempt could be made")
        finally:
            for task in pending:
                task.cancel()

    def stream_channel(self) -> tuple[grpc.aio.Channel, Callable[[], None]]:
        """A replica's channel (power of two choices) for a call the balancer does not carry (a
        stream), and the function to call once that call has ended: until then the channel stays
        open, as for the balancer's own attempts, should its address leave the name (closing it
        cancelled the stream under its caller, answers owed and all). RuntimeError, as `call` raises, before
        start() or after stop() (it handed out a channel stop() had closed), or on a loop other than start()'s
        (grpc.aio raised its own error as the stream began, "Event loop is closed" or another loop's)."""
        self._check_running()
        self._check_loop()
        r = self.pick()
        if r is None:
            raise self._no_replica()
        r.streams += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                r.streams -= 1
                if r.removed:
                    self._close_if_idle(r)

        return r.channel, release

    # -- counters -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters since start (schema wok.balancer/1; docs/reliability.md)."""
        return {
            "schema": SCHEMA,
            "calls": self.calls,
            "ok": self.ok_calls,
            "attempts": self.attempts,
            "hedges": self.hedges,
            "retries": self.retries,
            "budget_refusals": self.budget_refusals,
            "ejections": self.ejections,
            "ejections_refused": self.ejections_refused,
            "swaps": self.swaps,
            "readmitted_by_cap": self.readmitted_by_cap,
            "hedge_after_ms": None if self.hedge_after_s is None else round(1e3 * self.hedge_after_s, 3),
            "replicas": [r.stats() for r in self.replicas.values()],
        }


def merge_stats(parts: Sequence[dict | None]) -> dict | None:
    """Counters of several balancers (the bench's workers) added up; per replica by address.

    A part may itself be a merge (a bench result's, whose `hedge_after_ms` is already a list):
    the hedge delays of all the balancers behind the parts come out as one list. `swaps`,
    `readmitted_by_cap` and a replica's `readmitted_early` and `readmitted_by_cap` are later
    additions (within wok.balancer/1: nothing read before them changed): a part written before
    them counts 0, and a replica's comes out only when some part has it.
    """
    parts = [p for p in parts if p]
    if not parts:
        return None
    keys = ("calls", "ok", "attempts", "hedges", "retries", "budget_refusals", "ejections", "ejections_refused")
    out: dict = {"schema": SCHEMA, **{k: sum(p[k] for p in parts) for k in keys}}
    out["swaps"] = sum(p.get("swaps", 0) for p in parts)
    out["readmitted_by_cap"] = sum(p.get("readmitted_by_cap", 0) for p in parts)
    hedge = []
    for p in parts:
        h = p["hedge_after_ms"]
        hedge.extend(h if isinstance(h, list) else [] if h is None else [h])
    out["hedge_after_ms"] = hedge if hedge else None  # each balancer's own, at its end
    replicas: dict[str, dict] = {}
    for p in parts:
        for r in p["replicas"]:
            m = replicas.setdefault(r["address"], {"address": r["address"], "target": r["target"]})
            for k in ("attempts", "ok", "failures", "slow", "hedges", "retries", "ejections"):
                m[k] = m.get(k, 0) + r[k]
            for k in ("readmitted_early", "readmitted_by_cap"):
                if k in r:
                    m[k] = m.get(k, 0) + r[k]
    out["replicas"] = list(replicas.values())
    return out


class _Method:
    """A method of the balancer, called like a grpc.aio multicallable."""

    __slots__ = ("balancer", "key")

    def __init__(self, balancer: Balancer, method: str, request_serializer, response_deserializer) -> None:
        self.balancer = balancer
        self.key = (method, request_serializer, response_deserializer)

    def __call__(self, request, *, timeout: float | None = None, metadata=None):
        return self.balancer.call(self.key, request, timeout, metadata)
