"""``check-storage``: test a store against the storage contract (SPEC §17.4).

Every check runs under a fresh key prefix ``wdelta-check-<random>/`` that is
deleted afterwards, also when a check fails or the run is interrupted
(Ctrl-C): the writer threads are joined first, so nothing is written after
the cleanup.  The checks are a sample, not a proof: a store that passes may
still break a rule under other timing, a store that fails breaks it for sure.

- ST-1: ``writers`` threads, each with its own storage client from
  ``connect``, create one key at once, ``rounds`` times: exactly one wins,
  every other is told the key exists, and the stored bytes are the winner's.
- ST-2: objects written by create-only write and by upload are, right after
  the write, visible to stat, read and list with their exact size and bytes;
  a key never written is absent from all three.
- ST-3: ranged reads at the edges and the middle of a multi-block object
  return exactly the requested bytes, a range past the end fails, and a
  streamed read from an offset returns the object's tail.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...errors import BadArgumentError, TruncatedError, WdeltaError
from ..errors import NotFoundError
from .base import Storage
from .local import LocalStorage

RANGED_OBJECT_BYTES = (2 << 20) + 123  # spans several stream blocks, odd size
WRITE_OBJECTS = 4
RULES = ("ST-1", "ST-2", "ST-3")


@dataclass(frozen=True)
class RuleResult:
    """One rule's verdict and what was observed (a sentence)."""

    rule: str
    passed: bool
    observed: str


class _Fail(Exception):
    """A rule was broken; the message says how."""


def _pattern(n: int, seed: str) -> bytes:
    """``n`` deterministic pseudo-random bytes (no two offsets look alike)."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.blake2b(f"{seed}:{counter}".encode(), digest_size=64).digest()
        counter += 1
    return bytes(out[:n])


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise _Fail(message)


def _race(clients: list[Storage], key: str, payloads: list[bytes]) -> list[bool]:
    """Each client creates ``key`` with its payload, released together by a barrier."""
    barrier = threading.Barrier(len(clients))

    def racer(i: int) -> bool:
        barrier.wait()
        return clients[i].create(key, payloads[i])

    with ThreadPoolExecutor(len(clients)) as pool:
        futures = [pool.submit(racer, i) for i in range(len(clients))]
        return [f.result() for f in futures]


def check_create_only(
    connect: Callable[[], Storage], prefix: str, writers: int, rounds: int
) -> str:
    """ST-1 (see the module doc); returns what was observed, raises _Fail."""
    clients = [connect() for _ in range(writers)]
    for r in range(rounds):
        key = f"{prefix}st1/race-{r}"
        payloads = [f"writer {i} round {r}".encode() for i in range(writers)]
        winners = [i for i, won in enumerate(_race(clients, key, payloads)) if won]
        _expect(len(winners) == 1, f"round {r + 1}: {len(winners)} of {writers} creates won")
        stored = clients[0].read(key, max(map(len, payloads)) + 1)
        _expect(
            stored == payloads[winners[0]],
            f"round {r + 1}: writer {winners[0]} won but the key holds {stored[:40]!r}",
        )
        _expect(not clients[0].create(key, b"late"), f"round {r + 1}: a later create won")
    return f"{writers} concurrent creates of one key, {rounds} rounds: one winner each"


def _visible(st: Storage, prefix: str, key: str, data: bytes, how: str) -> None:
    info = st.stat(key)
    _expect(info is not None, f"stat right after {how} does not find {key}")
    assert info is not None
    _expect(info.size == len(data), f"stat after {how}: {info.size} bytes, wrote {len(data)}")
    _expect(st.read(key, len(data) + 1) == data, f"read right after {how} returns other bytes")
    listed = {o.key: o.size for o in st.list(prefix)}
    _expect(key in listed, f"list right after {how} does not show {key}")
    _expect(listed[key] == len(data), f"list after {how}: {listed[key]} bytes")


def check_read_after_write(st: Storage, prefix: str, scratch: Path) -> str:
    """ST-2 (see the module doc); returns what was observed, raises _Fail."""
    for i in range(WRITE_OBJECTS):
        data = _pattern(1000 + i, f"st2-{i}")
        key = f"{prefix}st2/created-{i}"
        _expect(st.create(key, data), f"create of new key {key} was refused")
        _visible(st, prefix, key, data, "a create")
        path = scratch / f"upload-{i}"
        path.write_bytes(data[::-1])
        key = f"{prefix}st2/uploaded-{i}"
        st.put_file(key, path)
        _visible(st, prefix, key, data[::-1], "an upload")
    missing = f"{prefix}st2/never-written"
    _expect(st.stat(missing) is None, "stat finds a key never written")
    _expect(missing not in {o.key for o in st.list(prefix)}, "list shows a key never written")
    try:
        st.read(missing, 1)
    except NotFoundError:
        pass
    else:
        raise _Fail("reading a key never written did not fail with not-found")
    return (
        f"{2 * WRITE_OBJECTS} objects (create and upload) seen whole by stat, read and list "
        "right after their write; a missing key is not-found"
    )


def check_ranged_reads(st: Storage, prefix: str, scratch: Path) -> str:
    """ST-3 (see the module doc); returns what was observed, raises _Fail."""
    size = RANGED_OBJECT_BYTES
    data = _pattern(size, "st3")
    path = scratch / "ranged"
    path.write_bytes(data)
    key = f"{prefix}st3/object"
    st.put_file(key, path)
    ranges = [(0, 1), (0, size), (size - 1, 1), (1 << 20, 4097), (12345, 1 << 20), (size, 0)]
    for start, length in ranges:
        got = st.read_range(key, start, length)
        _expect(
            got == data[start : start + length],
            f"read_range({start}, {length}) returned {len(got)} bytes that differ",
        )
    try:
        short = st.read_range(key, size - 10, 20)
    except TruncatedError:
        pass
    else:
        raise _Fail(f"a range past the end returned {len(short)} bytes instead of failing")
    tail = b"".join(st.stream(key, 1_000_001))
    _expect(tail == data[1_000_001:], f"stream from 1000001 returned {len(tail)} other bytes")
    return f"{len(ranges)} ranged reads of a {size}-byte object exact; past the end fails"


@dataclass(frozen=True)
class Report:
    """The rules' verdicts; ``leftover`` says what the cleanup could not remove (None: all)."""

    url: str
    prefix: str
    results: tuple[RuleResult, ...]
    leftover: str | None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results) and self.leftover is None


def _our_keys(prefix: str, rounds: int) -> set[str]:
    """Every key the checks may write (deleted even if a stale listing hides it)."""
    keys = {f"{prefix}st1/race-{r}" for r in range(rounds)} | {f"{prefix}st3/object"}
    for i in range(WRITE_OBJECTS):
        keys |= {f"{prefix}st2/created-{i}", f"{prefix}st2/uploaded-{i}"}
    return keys


def _cleanup(st: Storage, prefix: str, rounds: int) -> str | None:
    """Delete every object under ``prefix``; None if nothing is left, else what is."""
    try:
        keys = _our_keys(prefix, rounds) | {o.key for o in st.list(prefix)}
        for key in sorted(keys):
            st.delete(key)
        left = [key for key in sorted(keys) if st.stat(key) is not None]
    except WdeltaError as exc:
        return f"cleanup failed: {exc.category}: {exc}"
    if isinstance(st, LocalStorage):  # the empty folders of the prefix
        shutil.rmtree(st.root / prefix, ignore_errors=True)
    return f"{len(left)} objects left under {prefix}" if left else None


def check_storage(
    connect: Callable[[], Storage], *, writers: int = 8, rounds: int = 3,
    rules: tuple[str, ...] = RULES,
) -> Report:  # fmt: skip
    """Run ST-1..ST-3 (or those of them in ``rules``, as the storage contract tests run
    them one by one) against the store ``connect()`` opens (see the module doc).

    A storage error inside a rule fails that rule (its message is the
    observation); the prefix is cleaned up in every case, also when an
    exception such as KeyboardInterrupt ends the run.
    """
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        raise BadArgumentError(f"no storage rule {unknown[0]!r}; the rules are {RULES}")
    st = connect()
    prefix = f"wdelta-check-{uuid.uuid4().hex[:16]}/"
    results: list[RuleResult] = []
    leftover: str | None = None
    with tempfile.TemporaryDirectory(prefix="wdelta-check-") as tmp:
        checks: list[tuple[str, Callable[[], str]]] = [
            ("ST-1", lambda: check_create_only(connect, prefix, writers, rounds)),
            ("ST-2", lambda: check_read_after_write(st, prefix, Path(tmp))),
            ("ST-3", lambda: check_ranged_reads(st, prefix, Path(tmp))),
        ]
        try:
            for rule, check in checks:
                if rule in rules:
                    results.append(_run(rule, check))
        finally:
            leftover = _cleanup(st, prefix, rounds)
    return Report(st.url, prefix, tuple(results), leftover)


def _run(rule: str, check: Callable[[], str]) -> RuleResult:
    try:
        return RuleResult(rule, True, check())
    except _Fail as exc:
        return RuleResult(rule, False, str(exc))
    except WdeltaError as exc:
        return RuleResult(rule, False, f"{exc.category}: {exc}")
