"""The embedded mode's message queue: kombu's filesystem transport, with messages that appear whole and are
taken first in, first out (docs/service.md, "Queue order").

kombu's own `_put` opens `<monotonic ms>_<uuid>.<queue>.msg` in the queue folder and writes into it, and its
`_get` takes the first name in string order and reads it at once. Two defects follow, both seen here:
- a consumer can take a file the producer has opened but not yet written: it reads nothing, the worker
  stops on a JSONDecodeError and the job waits for the reaper's resend (tests/service/test_dashboard.py
  waited 5 minutes for a job whose message was read empty);
- the unpadded milliseconds of `time.monotonic()` sort as strings: once the machine has been up 10**6 ms
  (16.7 min; again at 2.8 h, 27.8 h) newer messages sort ahead of older ones, and after a reboot the order is
  arbitrary (issue 39: two jobs waited 17 and 25 min while six later ones ran).

Its `_queue_bind` has the same gap for an exchange's table in the control folder: it creates the file, then
locks it and writes; a producer reading the table in between finds no JSON and fails the publish.

This subclass writes each message into a sibling folder and renames it into the queue folder (a rename
within one filesystem is atomic: a reader sees the whole file or none), under a name that sorts by the wall
clock in zero-padded nanoseconds, then a per-process counter. kombu's `_get` is kept as it is; only the
names it sorts change. Wall-clock order holds across restarts of every process (it does not across a clock
set backwards).
"""

from __future__ import annotations

import itertools
import os
import time
import uuid

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.json import dumps

WRITING_FOLDER = "writing"  # beside the queue folder, on the same filesystem
_COUNTER = itertools.count()


def message_name(queue: str, now_ns: int | None = None) -> str:
    """`<ns since the epoch, 20 digits>_<counter, 8 digits>_<uuid hex>.<queue>.msg`: string order is time order.

    No '.' before the queue's name: kombu's `_get` matches the name's part after its first '.'."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    return f"{now_ns:020d}_{next(_COUNTER) % 10**8:08d}_{uuid.uuid4().hex}.{queue}.msg"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs) -> None:  # type: ignore[override]  # as kombu.filesystem's
        name = message_name(queue)
        try:
            partial = self._write_whole(name, dumps(payload))
            os.replace(partial, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(f"cannot add message {name!r} to the queue folder: {exc}") from exc

    def _queue_bind(self, exchange, routing_key, pattern, queue) -> None:
        table = self._exchange_file(exchange)
        if not table.exists():
            # A new table appears whole, this binding in it; an existing one kombu updates under its lock.
            binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            partial = self._write_whole(f"{uuid.uuid4().hex}.exchange", dumps([binding]))
            try:
                self.control_folder.mkdir(exist_ok=True)
                os.link(partial, table)  # fails where another process made it first
                return
            except FileExistsError:
                pass
            finally:
                os.unlink(partial)
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def _write_whole(self, name: str, text: str) -> str:
        """Write `text` into `name` in the writing folder; the caller moves it where readers look."""
        writing = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_out)), WRITING_FOLDER)
        os.makedirs(writing, exist_ok=True)
        partial = os.path.join(writing, name)
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)
        return partial


class Transport(filesystem.Transport):
    """kombu shares one record of declared bindings among every filesystem connection of a process, so a
    second connection skips binding and may read a table the first has not written yet, or one of another
    data folder. Each connection here keeps its own record and declares what it uses in its own folders."""

    Channel = Channel

    def __init__(self, client, **kwargs) -> None:
        super().__init__(client, **kwargs)
        self.state = virtual.BrokerState()
