"""The publisher's judgement of stalls and outages, its spool failures and its shutdown.

confluent-kafka's Producer is another library's network layer, so at this tier it is
replaced by a small fake with the same surface (produce, poll, purge, list_topics) behind a
fake broker the test controls; the clock that times stalls is injected. The same behaviour
against a real broker is in tests/integration/test_publisher_agent.py and
test_broker_outage.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ragwatch.agents.publisher import PURGE_INFLIGHT, KafkaPublisher
from ragwatch.agents.spool import Spool

TOPIC = "ragwatch.gpu"
UNKNOWN_TOPIC = -188  # librdkafka's _UNKNOWN_TOPIC


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Msg:
    def __init__(self, topic: str, key: str, value: bytes) -> None:
        self._t, self._k, self._v = topic, key, value

    def topic(self) -> str:
        return self._t

    def key(self) -> bytes:
        return self._k.encode()

    def value(self) -> bytes:
        return self._v


class Err:
    def __init__(self, code: int, fatal: bool = False) -> None:
        self._code, self._fatal = code, fatal

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return f"error {self._code}"

    def fatal(self) -> bool:
        return self._fatal


class KafkaException(Exception):
    """confluent_kafka.KafkaException: its first argument is the error."""


class Broker:
    """What the fake producers talk to: whether it answers metadata, whether it acks."""

    def __init__(self) -> None:
        self.answers = True
        self.acks = True
        self.topics = {TOPIC}  # the topics it has
        self.stored: list[bytes] = []
        self.producers: list[Producer] = []
        self.metadata_requests = 0
        self.polls = 0
        self.fatal = False  # the next poll raises a fatal error (a restarted broker that
        # does not know the idempotent producer: UNKNOWN_PRODUCER_ID)

    def producer(self, conf: dict[str, Any]) -> Producer:
        p = Producer(self)
        self.producers.append(p)
        return p

    @property
    def in_flight(self) -> int:
        return sum(len(p.pending) for p in self.producers)


class Producer:
    """The surface of confluent_kafka.Producer the publisher uses."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.pending: list[tuple[Msg, Callable[..., None]]] = []
        self.purged: list[tuple[Msg, Callable[..., None]]] = []

    def produce(self, topic: str, value: bytes, key: str, on_delivery: Callable[..., None]) -> None:
        if topic not in self.broker.topics:  # librdkafka, once it knows the topic is missing
            raise KafkaException(Err(UNKNOWN_TOPIC))
        self.pending.append((Msg(topic, key, value), on_delivery))

    def poll(self, timeout: float) -> int:
        self.broker.polls += 1
        if self.broker.fatal:
            self.broker.fatal = False
            raise KafkaException(Err(59, fatal=True))
        done, self.purged = self.purged, []
        for msg, cb in done:
            cb(Err(PURGE_INFLIGHT), msg)
        if self.broker.acks and all(m.topic() in self.broker.topics for m, _ in self.pending):
            acked, self.pending = self.pending, []
            for msg, cb in acked:
                self.broker.stored.append(msg.value())
                cb(None, msg)
            done += acked
        if not done:
            time.sleep(timeout)  # what the real poll does when there is nothing to report
        return len(done)

    def purge(self, in_queue: bool, in_flight: bool, blocking: bool) -> None:
        self.purged, self.pending = self.purged + self.pending, []

    def list_topics(self, timeout: float) -> Metadata:
        self.broker.metadata_requests += 1
        if not self.broker.answers:
            raise RuntimeError("KafkaError{code=_TRANSPORT}: timed out")
        return Metadata({t: object() for t in self.broker.topics})


class Metadata:
    """What list_topics returns: the broker's topics by name."""

    def __init__(self, topics: dict[str, object]) -> None:
        self.topics = topics


def wait_for(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def publisher(broker: Broker, clock: Clock, **kw: Any) -> KafkaPublisher:
    kw.setdefault("stall_s", 10.0)
    return KafkaPublisher(
        {}, clock=clock, producer_factory=broker.producer, exit_timeout_s=None, **kw
    )


def rebuilt_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]


def test_an_idle_gap_longer_than_the_stall_timeout_is_not_a_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scrape every 15 s with stall_s=10: each record is delivered at once; the 15 s
    between them are not time spent waiting for the broker (issue 29, point 1)."""
    broker, clock = Broker(), Clock()
    pub = publisher(broker, clock)
    for i in range(5):
        pub.write(TOPIC, "h1", b"%d" % i)
        assert pub.flush(10) == 0
        clock.now += 15.0
    pub.close(10)
    assert pub.stats.recoveries == 0 and len(broker.producers) == 1
    assert pub.stats.produced == pub.stats.delivered == 5
    assert broker.stored == [b"0", b"1", b"2", b"3", b"4"]
    assert rebuilt_logs(caplog) == []


def test_a_broker_that_does_not_answer_is_waited_for_never_rebuilt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A frozen broker (SIGSTOP: connects, never answers) for 300 s: the producer keeps its
    in-flight records (librdkafka re-sends them with the same producer id), no rebuild, one
    log line going and one coming back, nothing re-sent twice."""
    caplog.set_level(logging.INFO, "ragwatch.agents.publisher")
    broker, clock = Broker(), Clock()
    broker.acks = broker.answers = False
    pub = publisher(broker, clock)
    for i in range(3):
        pub.write(TOPIC, "h1", b"%d" % i)
    wait_for(lambda: broker.in_flight == 3)
    for asked in range(1, 31):  # every stall_s the broker is asked, and does not answer
        clock.now += 10.0
        wait_for(lambda n=asked: broker.metadata_requests == n)
    broker.acks = broker.answers = True
    assert pub.flush(10) == 0
    pub.close(10)
    s = pub.stats
    assert (s.recoveries, s.resent, len(broker.producers)) == (0, 0, 1)
    assert broker.stored == [b"0", b"1", b"2"]
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in messages if m.startswith("kafka does not answer")]) == 1
    assert len([m for m in messages if m.startswith("kafka reachable again")]) == 1
    assert rebuilt_logs(caplog) == []


def test_a_producer_stuck_while_the_broker_answers_is_rebuilt_with_backoff() -> None:
    """No progress although the broker answers (it lost the producer's state): rebuilt
    after stall_s, then after 2x, 4x... while rebuilds do not help; the records re-sent
    from in flight are counted as possible duplicates; progress resets the backoff."""
    broker, clock = Broker(), Clock()
    broker.acks = False
    pub = publisher(broker, clock)
    pub.write(TOPIC, "h1", b"a")
    pub.write(TOPIC, "h1", b"b")
    wait_for(lambda: broker.in_flight == 2)

    def after(seconds: float) -> int:
        """Move the clock, let the sender look at it twice, return the producers built."""
        clock.now += seconds
        polls = broker.polls
        wait_for(lambda: broker.polls >= polls + 2)
        return len(broker.producers)

    assert after(9.0) == 1
    assert after(1.0) == 2  # 10 s: rebuilt, both re-sent by the new producer
    wait_for(lambda: broker.in_flight == 2)
    assert after(10.0) == 2  # the rebuild did not help: now 20 s
    assert after(10.0) == 3
    wait_for(lambda: broker.in_flight == 2)
    assert after(30.0) == 3  # then 40 s
    assert after(10.0) == 4
    broker.acks = True
    assert pub.flush(10) == 0
    assert broker.stored == [b"a", b"b"]
    assert (pub.stats.recoveries, pub.stats.resent) == (3, 6)
    broker.acks = False  # progress was made: the next stall is judged after stall_s again
    pub.write(TOPIC, "h1", b"c")
    wait_for(lambda: broker.in_flight == 1)
    assert after(10.0) == 5
    pub.close(0)


def missing_lines(caplog: pytest.LogCaptureFixture, topic: str) -> tuple[int, int]:
    """How many lines said ``topic`` is missing, and how many that it is back."""
    messages = [r.getMessage() for r in caplog.records]
    return (
        sum(m.startswith(f"topic {topic} is missing") for m in messages),
        sum(m.startswith(f"topic {topic} is back") for m in messages),
    )


def test_records_for_a_missing_topic_wait_in_order_and_the_topic_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The producer refuses a topic it knows is missing: its records wait (the memory
    queue, then the spool), are offered again every HOLD_S, and go out in order once the
    topic exists; one line names it, one says it is back; nothing is dropped, no rebuild."""
    broker, clock = Broker(), Clock()
    broker.topics = set()
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    pub = publisher(broker, clock, queue_max=3, spool=spool)
    for i in range(10):
        pub.write(TOPIC, "h1", b"%d" % i)
    wait_for(lambda: missing_lines(caplog, TOPIC) == (1, 0))
    for _ in range(5):  # offered again each HOLD_S, named only once
        clock.now += 1.0
        polls = broker.polls
        wait_for(lambda p=polls: broker.polls >= p + 2)
    assert missing_lines(caplog, TOPIC) == (1, 0)
    assert pub.queued == 10 and pub.stats.spooled > 0 and broker.stored == []
    broker.topics = {TOPIC}
    clock.now += 1.0
    assert pub.flush(10) == 0
    pub.close(10)
    assert broker.stored == [b"%d" % i for i in range(10)]
    assert (pub.stats.dropped, pub.stats.recoveries) == (0, 0)
    assert missing_lines(caplog, TOPIC) == (1, 1)
    assert rebuilt_logs(caplog) == []


def test_a_topic_that_vanishes_under_records_in_flight_is_named_not_a_stall(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Records in flight when their topic disappears (a broker restarted empty): the stall
    check finds the broker answering without the topic, names it and keeps waiting instead
    of rebuilding the producer; when it exists again the records are delivered."""
    broker, clock = Broker(), Clock()
    broker.acks = False
    pub = publisher(broker, clock)
    pub.write(TOPIC, "h1", b"a")
    wait_for(lambda: broker.in_flight == 1)
    broker.topics = set()  # gone while the producer holds the record
    for _ in range(6):  # 60 s of stall checks: the topic is still missing
        clock.now += 10.0
        requests = broker.metadata_requests
        wait_for(lambda r=requests: broker.metadata_requests > r)
    assert missing_lines(caplog, TOPIC) == (1, 0)
    assert pub.stats.recoveries == 0 and rebuilt_logs(caplog) == []
    broker.topics, broker.acks = {TOPIC}, True
    assert pub.flush(10) == 0
    pub.close(10)
    assert broker.stored == [b"a"] and pub.stats.dropped == 0
    assert missing_lines(caplog, TOPIC) == (1, 1)


def test_a_fatal_error_raised_by_poll_rebuilds_the_producer_and_loses_nothing() -> None:
    """confluent-kafka raises a fatal error (UNKNOWN_PRODUCER_ID from a broker restarted
    empty) from poll() instead of passing it to error_cb: the sender thread survives, the
    producer is rebuilt and its records are sent again."""
    broker, clock = Broker(), Clock()
    broker.acks = False
    pub = publisher(broker, clock)
    pub.write(TOPIC, "h1", b"a")
    wait_for(lambda: broker.in_flight == 1)
    broker.fatal = True
    wait_for(lambda: len(broker.producers) == 2)
    broker.acks = True
    assert pub.flush(10) == 0
    pub.close(10)
    assert broker.stored == [b"a"]
    assert (pub.stats.recoveries, pub.stats.dropped) == (1, 0)


def test_spool_failures_never_raise_into_write_and_are_counted_as_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A spool that cannot write (here: a directory where its segment file should be, as
    good as a permission error) while the broker is down: every record that overflows
    memory is dropped and counted, sampling goes on, one log line for the kind of error."""
    broker, clock = Broker(), Clock()
    broker.acks = broker.answers = False
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    (tmp_path / "spool" / "spool-00000001.seg").mkdir()
    pub = publisher(broker, clock, queue_max=2, max_in_flight=1, spool=spool)
    pub.write(TOPIC, "h1", b"0")
    wait_for(lambda: broker.in_flight == 1)
    for i in range(1, 10):
        pub.write(TOPIC, "h1", b"%d" % i)  # never raises
    s = pub.stats
    assert (s.spooled, s.spool_errors) == (0, 7)
    assert s.dropped == 7  # all but the two kept in memory and the one in flight
    assert pub.queued == 3
    errors = [r.getMessage() for r in caplog.records if r.name == "ragwatch.agents.spool"]
    assert len(errors) == 1 and "cannot write" in errors[0] and "Is a directory" in errors[0]
    broker.acks = broker.answers = True
    assert pub.flush(10) == 0
    pub.close(10)
    assert broker.stored == [b"0", b"8", b"9"]


def test_the_spool_cap_counts_in_the_publishers_dropped(tmp_path: Path) -> None:
    """Records the spool drops over its cap are records the publisher lost: the agent's
    exit line (``dropped=``) and exit code come from these counters."""
    broker, clock = Broker(), Clock()
    broker.acks = broker.answers = False
    spool = Spool(tmp_path / "spool", max_bytes=1000, segment_bytes=300)
    pub = publisher(broker, clock, queue_max=1, max_in_flight=1, spool=spool)
    pub.write(TOPIC, "h1", b"x" * 53)
    wait_for(lambda: broker.in_flight == 1)
    for i in range(1, 100):
        pub.write(TOPIC, "h1", b"x" * 50 + b"%03d" % i)
    assert spool.dropped > 0 and pub.stats.dropped == spool.dropped
    assert pub.stats.spooled == 98  # all but the one in flight and the one in memory
    assert len(spool) + spool.dropped == 98
    broker.acks = broker.answers = True
    assert pub.flush(10) == 0
    pub.close(10)
    assert pub.stats.delivered + pub.stats.dropped == 100


def test_with_closes_and_writes_after_close_are_counted() -> None:
    broker, clock = Broker(), Clock()
    with publisher(broker, clock) as pub:
        pub.write(TOPIC, "h1", b"a")
    assert broker.stored == [b"a"] and pub.queued == 0
    pub.write(TOPIC, "h1", b"late")
    pub.close()  # a second close does nothing
    assert pub.stats.dropped == 1 and broker.stored == [b"a"]


def test_close_with_the_broker_frozen_spools_what_was_in_flight_as_possible_duplicates(
    tmp_path: Path,
) -> None:
    """SIGTERM while the broker is frozen: in-flight records are purged into the spool for
    the next start; the broker may have stored them, so they count as resent."""
    broker, clock = Broker(), Clock()
    broker.acks = broker.answers = False
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    pub = publisher(broker, clock, queue_max=10, max_in_flight=2, spool=spool)
    for i in range(5):
        pub.write(TOPIC, "h1", b"%d" % i)
    wait_for(lambda: broker.in_flight == 2)
    pub.close(0)
    assert (pub.stats.resent, pub.stats.spooled, pub.stats.dropped) == (2, 5, 0)
    again = Spool(tmp_path / "spool", max_bytes=1 << 20)
    assert [again.get() for _ in range(5)] == [(TOPIC, "h1", b"%d" % i) for i in range(5)]


@pytest.mark.parametrize("kw", [{"exit_timeout_s": -1.0}, {"exit_timeout_s": float("nan")}])
def test_bad_exit_timeout_raises(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="exit_timeout_s"):
        KafkaPublisher({}, **kw)


FORK_SCRIPT = """
import logging, os, sys
from ragwatch.agents.publisher import KafkaPublisher
logging.basicConfig(level=logging.INFO, format="%(process)d %(message)s")
pub = KafkaPublisher({"bootstrap.servers": "127.0.0.1:9"}, exit_timeout_s=0.5)
pub.write("t", "k", b"v")  # no broker there: it stays queued
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a worker process that ends normally: the interpreter's exit hooks run
os.waitpid(pid, 0)
print("parent", os.getpid(), "child", pid, flush=True)
"""


def test_the_exit_hook_skips_what_a_parent_process_made() -> None:
    """After a fork the child inherits the parent's publisher, without its sender thread:
    the child's exit leaves it alone (no wait, no second send); the parent's exit closes
    it, and says what it could not deliver."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    _, parent, _, child = line.split()
    closed = [x for x in out.stderr.splitlines() if "publisher closed:" in x]
    assert [x.split()[0] for x in closed] == [parent], out.stderr
    assert "dropped=1" in closed[0]
    assert not any(x.startswith(child + " ") for x in out.stderr.splitlines())
