"""The request SDK in scripts that end: what was recorded is on the topic, whether the
script closes nothing (the README's snippet as written), only the recorder, or both with
``with``; and an exit with the broker away waits a bounded time and says what was lost.
Each script is a real Python process against a real broker of the test's own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragwatch import codec
from ragwatch.config import Settings
from ragwatch.embedded import EmbeddedStack, free_port
from ragwatch.kafka_admin import ensure_topics
from ragwatch.schema import RequestsEnvelope
from tests.integration.conftest import clean_environ, read_records

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```python\n(.*?)```", re.S)
REQUESTS = 300

# Stand-ins for the service's own code, and a report the test reads: registered before
# ragwatch makes anything, so it runs after ragwatch's exit hook (atexit runs LIFO).
PRELUDE = """
import atexit, json

def _report():
    pub = rec.sink
    print(json.dumps({"recorded": rec.stats.recorded, "sent": rec.stats.sent_records,
                      "envelopes": rec.stats.sent_envelopes, "delivered": pub.stats.delivered,
                      "dropped": pub.stats.dropped}), flush=True)

atexit.register(_report)
query, ctx_tokens, out_tokens = "what is ragwatch?", 1200, 250

def retrieve(query):
    return ["doc-1", "doc-2"]

def rerank(query, docs):
    return docs[:1]

def generate(query, docs):
    return "an answer"
"""


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[Settings]:
    """A broker of the test's own, with the ragwatch topics under their default names (the
    snippets do not name a topic)."""
    stack = EmbeddedStack(tmp_path / "stack")
    stack.up(("kafka",))
    settings = Settings.from_env(stack.env())
    ensure_topics(settings)
    yield settings
    stack.down()


def snippet(page: str) -> str:
    """The page's python block that makes a RequestRecorder, as a user copies it."""
    (block,) = [b for b in FENCE.findall((ROOT / page).read_text()) if "RequestRecorder(" in b]
    return textwrap.dedent(block)


def run_script(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def arrived(settings: Settings, envelopes: int) -> list[RequestsEnvelope]:
    """The request envelopes on the topic (read until ``envelopes`` of them, then a little
    longer so that a duplicate would show)."""
    topic = settings.topic("requests")
    msgs = read_records(settings, topic, max(1, envelopes), timeout=20)
    return [codec.decode_as(RequestsEnvelope, m.value()) for m in msgs]


def report(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("page", "then"),
    [("README.md", ""), ("README.md", "rec.close()"), ("docs/commands.md", "")],
    ids=["readme-closes-nothing", "readme-closes-the-recorder", "commands-closes-nothing"],
)
def test_the_documented_snippet_in_a_script_that_ends_delivers_every_record(
    kafka: Settings, page: str, then: str
) -> None:
    """The snippet as written: its set-up once, its request part 300 times, then the
    script ends (closing nothing, or only the recorder): every request is on the topic."""
    code = re.sub(
        r'"bootstrap.servers": "[^"]*"',
        f'"bootstrap.servers": "{kafka.kafka_bootstrap}"',
        snippet(page),
    )
    lines = code.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("with rec.request()"))
    setup, request = "\n".join(lines[:first]), "\n".join(lines[first:])
    per_loop = sum(line.startswith(("with rec.request()", "rec.record(")) for line in lines)
    script = "\n".join(
        [PRELUDE, setup, f"for _ in range({REQUESTS}):", textwrap.indent(request, "    "), then]
    )
    got = report(run_script(script))
    envelopes = arrived(kafka, got["envelopes"])
    assert sum(len(e.records) for e in envelopes) == REQUESTS * per_loop, got
    assert got["recorded"] == got["sent"] == REQUESTS * per_loop
    assert got["delivered"] == got["envelopes"] == len(envelopes) and got["dropped"] == 0
    assert {(e.service, e.instance) for e in envelopes} == {("rag-api", "pod-7")}


def test_with_publisher_and_recorder_delivers_everything_when_the_block_ends(
    kafka: Settings,
) -> None:
    """``with KafkaPublisher(...) as pub, RequestRecorder(pub, ...) as rec:``: when the
    block ends the recorder has drained into the publisher, and the publisher has
    delivered it all, before the script goes on."""
    script = f"""
import json
from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sdk import RequestRecorder

conf = {{"bootstrap.servers": "{kafka.kafka_bootstrap}"}}
with KafkaPublisher(conf) as pub, RequestRecorder(pub, service="batch", instance="job-1") as rec:
    for i in range({REQUESTS}):
        with rec.request() as r:
            with r.stage("retriever"):
                pass
            r.tokens(context=i, output=1)
print(json.dumps({{"recorded": rec.stats.recorded, "sent": rec.stats.sent_records,
                  "envelopes": rec.stats.sent_envelopes, "delivered": pub.stats.delivered,
                  "dropped": pub.stats.dropped, "queued": pub.queued}}), flush=True)
"""
    got = report(run_script(script))
    assert got["recorded"] == got["sent"] == REQUESTS
    assert got["delivered"] == got["envelopes"] >= 1 and got["queued"] == got["dropped"] == 0
    envelopes = arrived(kafka, got["envelopes"])
    assert [r.context_tokens for e in envelopes for r in e.records] == list(range(REQUESTS))


def test_an_exit_with_the_broker_away_waits_a_bounded_time_and_says_what_was_lost() -> None:
    script = f"""
from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.agents.sdk import RequestRecorder

pub = KafkaPublisher({{"bootstrap.servers": "127.0.0.1:{free_port()}"}}, exit_timeout_s=1)
rec = RequestRecorder(pub, service="rag-api", instance="pod-7")
for _ in range(10):
    rec.record(e2e_ms=5.0)
"""
    out = run_script(script, timeout=30)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "publisher closed with 1 undelivered record(s) after 1s (lost; " in out.stderr
