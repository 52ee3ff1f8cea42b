"""The embedded queue (core/file_queue.py): every message arrives whole, and first in is first out across
the clock values that broke kombu's stock names and across a restart of the processes."""

from __future__ import annotations

import json
import threading

import pytest
from kombu import Connection

from core import file_queue
from core.queue import FILE_QUEUE_TRANSPORT, _transport_options
from core.settings import Settings

QUEUE = "amct.jobs.cpu"


@pytest.fixture
def connect(tmp_path):
    settings = Settings(data_dir=tmp_path)
    options = _transport_options(settings)

    def connection() -> Connection:  # a new one per "process"
        return Connection("filesystem://", transport=FILE_QUEUE_TRANSPORT, transport_options=options)

    return connection


def _take_all(queue) -> list[str]:
    taken = []
    while True:
        try:
            message = queue.get(block=False)
        except queue.Empty:
            return taken
        taken.append(message.payload)
        message.ack()


def test_order_holds_across_the_clock_values_kombus_names_misorder_and_a_restart(connect, monkeypatch):
    # kombu names a message after unpadded monotonic milliseconds: "999999_…" sorts after "1000000_…".
    # Ours: wall-clock nanoseconds, zero-padded; the last message comes from new connections (a restart).
    clock = iter([999_999 * 10**6, 1_000_000 * 10**6, 9_999_999 * 10**6, 10_000_000 * 10**6])
    monkeypatch.setattr(file_queue.time, "time_ns", lambda: next(clock))
    with connect() as producer:
        for body in ("first", "second", "third"):
            producer.SimpleQueue(QUEUE).put(body)
    with connect() as producer_after_restart:
        producer_after_restart.SimpleQueue(QUEUE).put("fourth")
    with connect() as consumer:
        assert _take_all(consumer.SimpleQueue(QUEUE)) == ["first", "second", "third", "fourth"]


def test_a_consumer_polling_while_messages_are_written_never_reads_a_partial_one(connect, tmp_path):
    bodies = [f"job-{i:03d}-" + "x" * 20_000 for i in range(150)]  # big enough to be caught half-written
    received: list[str] = []
    done = threading.Event()

    def consume() -> None:
        with connect() as consumer:
            queue = consumer.SimpleQueue(QUEUE)  # one consumer: a new one per poll would drop what it prefetched
            while not done.is_set() or len(received) < len(bodies):
                received.extend(_take_all(queue))

    with connect() as producer:
        queue = producer.SimpleQueue(QUEUE)
        reader = threading.Thread(target=consume)
        reader.start()
        for body in bodies:
            queue.put(body)
    done.set()
    reader.join(timeout=60)
    assert received == bodies  # every message whole, none lost, in the order sent
    assert list((tmp_path / "broker" / file_queue.WRITING_FOLDER).iterdir()) == []


def test_a_new_exchange_table_is_written_with_its_binding(connect, tmp_path):
    with connect() as conn:
        conn.SimpleQueue(QUEUE)
    table = json.loads((tmp_path / "broker" / "control" / f"{QUEUE}.exchange").read_text())
    assert table == [[QUEUE, "", QUEUE]]
    assert list((tmp_path / "broker" / file_queue.WRITING_FOLDER).iterdir()) == []


def test_a_message_is_named_so_that_kombu_finds_its_queue():
    name = file_queue.message_name(QUEUE, now_ns=1)
    assert name.startswith("00000000000000000001_") and name.partition(".")[2] == f"{QUEUE}.msg"
