"""A bench worker that answers its start or its connect with another word than the protocol's is refused in the
'<input>: expected ...; got V' form, naming the worker, the word expected and the word it said."""

from __future__ import annotations

import pytest

from wok.bench import workers
from wok.bench.workers import WorkerPool, WorkerProcesses


def _saying(stage: str, word: str, seen: list):
    """workers._from_worker, but the worker's word at `stage` is replaced by `word`: its start word is read first,
    as the protocol reads it; its connect word is not waited for (the pool refuses the replaced one at once)."""
    real = workers._from_worker

    def from_worker(conn, process, at: str) -> object:
        seen.append((process.pid, process))  # its pid as it is read: unreadable once closed
        said = real(conn, process, at) if at == "start" else None
        return word if at == stage else said

    return from_worker


def _ended(procs: list) -> list:
    ended = []
    for p in procs:
        try:
            p.join(10)
            ended.append(p.exitcode is not None)
        except ValueError:  # closed as its owner let go of it, which closes only an ended one
            ended.append(True)
    return ended


def test_a_worker_that_starts_with_another_word_is_refused_naming_both_words(monkeypatch):
    seen: list = []
    monkeypatch.setattr(workers, "_from_worker", _saying("start", "hello", seen))
    processes = WorkerProcesses().start()
    try:
        with pytest.raises(RuntimeError) as info:
            processes.take(1)
        pid = seen[0][0]
        assert str(info.value) == f"bench worker {pid}'s first word: expected 'started'; got 'hello'"
        assert _ended([p for _, p in seen]) == [True]
    finally:
        processes.stop()


def test_a_worker_that_connects_with_another_word_is_refused_naming_both_words(monkeypatch):
    seen: list = []
    monkeypatch.setattr(workers, "_from_worker", _saying("connect", "hello", seen))
    with pytest.raises(RuntimeError) as info:
        WorkerPool("127.0.0.1:1", [b""], 1)
    pid = seen[-1][0]  # the process whose connect was read
    assert str(info.value) == f"bench worker {pid}'s word as it connected: expected 'ready'; got 'hello'"
    assert all(_ended([p for _, p in seen]))
