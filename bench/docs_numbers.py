"""The numbers the docs quote from demo runs: measured by running the demos, recorded in
``bench/results/docs-numbers.json``, and written into the docs' marked blocks.

Two blocks are this script's, never edited by hand:

- ``README.md``, between ``<!-- demo:leak -->`` and ``<!-- /demo:leak -->``: what ``make
  demo`` prints (the first recorded leak run) and the spread over the recorded runs;
- ``docs/commands.md``, between ``<!-- demo:scenarios -->`` and ``<!-- /demo:scenarios
  -->``: what ``--scenario all`` and ``--scenario healthy`` delivered, and how long they
  took;
- ``docs/rules.md``, between ``<!-- demo:hints -->`` and ``<!-- /demo:hints -->``: the
  hints of the first recorded ``all`` run.

``tests/unit/test_docs_numbers.py`` fails when a block differs from what this script
renders from the results file, or when the numbers in the results file are not those of
the demo outputs recorded in it; the integration suite's own leak and ``all`` demos
(``tests/integration/test_cli.py``) hold a fresh run to the recorded ranges, widened by
:data:`TOLERANCE`. A change that moves what the demos print fails there until this
script is run again and the docs say the new numbers.

Run-to-run variation: the telemetry is the same in every run (same seed, same time of
day) and the rules run in event time, so what an alert says (the leak's rate at its first
firing, its growth, the time to OOM) is the same in every run and changes only with the
code. The demo plays the telemetry at 720x against the wall clock, so what depends on the
wall clock varies with the machine and its load: how long the page takes, and how many
Slack messages the notifier's groups make (when its event-time clock passes each group's
30-second wait). The docs quote ranges over the recorded runs.

Run: ``python bench/docs_numbers.py [--runs 3] [--healthy-runs 1]`` (~6 min on 2 cores:
a leak run ~10 s, ``all`` ~70 s, ``healthy`` ~70-150 s), or ``--docs-only`` to rewrite the
blocks from the results file without running anything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "docs-numbers.json"
README, COMMANDS = ROOT / "README.md", ROOT / "docs" / "commands.md"
RULES_DOC = ROOT / "docs" / "rules.md"
BLOCKS = {"leak": README, "scenarios": COMMANDS, "hints": RULES_DOC}
WIDTH = 92  # the README's sample block
# How far a fresh run may be from the recorded range (min - t, max + t) before the
# integration tests call the docs stale. Over the recorded runs, and 6 more with three
# demos at once on 2 cores (load 7: the page came after 12.7-14.2 s instead of ~7 s), the
# leak's numbers did not move: the rules run in event time on the same telemetry, so they
# change only with the code; the margins are one step of their printed rounding (two for
# the time to OOM). What does vary is what depends on the wall clock: how long the page
# takes, Slack's grouped messages (9-12 seen) and, by one, the bodies and PagerDuty events
# of a run that ends while the restarted worker's leak pages.
TOLERANCE = {
    "gb_per_hour": 0.02,
    "increase_gb": 0.02,
    "window_h": 0.1,
    "tte_h": 0.2,
    "expected": 0,
    "webhook_bodies": 1,
    "pagerduty_triggers": 1,
    "pagerduty_resolves": 1,
    "slack_messages": 3,
}

# ------------------------------------------------------------------ reading a demo's output

_NUM = r"(\d[\d,]*(?:\.\d+)?)"


def _f(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else None


def _receivers(err: str) -> dict[str, float | None]:
    m = re.search(
        r"receivers: webhook (\d+) bodies, Slack-like (\d+) messages, PagerDuty-like (\d+) "
        r"triggers \+ (\d+) resolves",
        err,
    )
    keys = ("webhook_bodies", "slack_messages", "pagerduty_triggers", "pagerduty_resolves")
    return dict(zip(keys, (float(x) for x in m.groups()), strict=True)) if m else {}


def firing_block(out: str, rule: str) -> str:
    """The first ``FIRING rule`` alert of a text-mode demo's stdout, with its annotations."""
    lines = out.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"FIRING {rule} ")), None)
    if start is None:
        return ""
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines)
    )
    return "\n".join(lines[start:end])


def numbers(scenario: str, out: str, err: str) -> dict[str, Any]:
    """What the docs quote from one run of ``ragwatch demo --scenario scenario``."""
    got: dict[str, Any] = {"ok": "[demo] logs kept in" not in err}
    got["seconds"] = _f(r"expected alert\(s\) delivered to the webhook and stored in Redis "
                        rf"\({_NUM}s\)", err)  # fmt: skip
    got |= _receivers(err)
    got["also_firing"] = sorted(set(re.findall(r"\[demo\] also firing: (\w+) ", err)))
    got["unexpected"] = sorted(set(re.findall(r"\[demo\] UNEXPECTED: (\w+) ", err)))
    if scenario == "leak":
        block = firing_block(out, "GpuMemoryLeak")
        got["gb_per_hour"] = _f(rf"grows {_NUM} GB/h", block)
        got["increase_gb"] = _f(rf"\+{_NUM} GB over the last", block)
        got["window_h"] = _f(rf"over the last {_NUM} h", block)
        got["tte_h"] = _f(rf"runs out of memory in ~{_NUM} h", block)
    if scenario == "all":
        got["expected"] = _f(rf"{_NUM} expected alert\(s\) delivered", err)
        got["fired"] = len(re.findall(r"^FIRING ", out, re.M))
        got["resolved"] = len(re.findall(r"^RESOLVED ", out, re.M))
    if scenario == "healthy":
        got["messages"] = _f(rf"healthy fleet: {_NUM} messages processed", err)
        got["pages"] = _f(rf"messages processed, {_NUM} page", err)
        got["seconds"] = _f(rf"page\(s\) in {_NUM}s", err)
    return got


# ------------------------------------------------------------------ running the demos


def run_demo(scenario: str) -> dict[str, Any]:
    """One text-mode run on its own embedded stack: its stdout, its ``[demo]`` lines and
    the numbers read from them."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAGWATCH_KAFKA_BOOTSTRAP", "RAGWATCH_REDIS_URL")
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ragwatch", "demo", "--scenario", scenario],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    wall = time.monotonic() - t0
    said = "\n".join(ln for ln in proc.stderr.splitlines() if ln.startswith("[demo] "))
    run = {"rc": proc.returncode, "wall_s": round(wall, 1), "stdout": proc.stdout, "said": said}
    run["numbers"] = numbers(scenario, proc.stdout, said)
    print(f"{scenario}: rc={proc.returncode} {wall:.1f}s {run['numbers']}", file=sys.stderr)
    return run


def code_version() -> dict[str, Any]:
    def git(*args: str) -> str:
        p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return p.stdout.strip()

    commit = git("rev-parse", "HEAD")
    return {"commit": commit, "dirty": bool(commit) and bool(git("status", "--porcelain"))}


def measure(runs: int, healthy_runs: int) -> dict[str, Any]:
    plan = {"leak": runs, "all": runs, "healthy": healthy_runs}
    return {
        "about": "bench/docs_numbers.py: the demo runs the docs quote",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "code": code_version(),
        "tolerance": TOLERANCE,
        "scenarios": {s: [run_demo(s) for _ in range(n)] for s, n in plan.items() if n},
    }


# ------------------------------------------------------------------ what the docs say


def spread(data: dict[str, Any], scenario: str, key: str) -> tuple[float, float]:
    """(min, max) of one number over the recorded runs of a scenario."""
    values = [r["numbers"][key] for r in data["scenarios"][scenario]]
    return min(values), max(values)


def _range(lo: float, hi: float, fmt: str) -> str:
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}-{b}"


def _wrap(line: str) -> list[str]:
    """A long output line as the README shows it: wrapped, continuations indented (a line
    that fits in 100 columns stays whole)."""
    if len(line) <= 100 and not line.startswith("  "):
        return [line]
    indent = "    " if line.startswith("  ") else "  "
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _para(text: str) -> str:
    return "\n".join(textwrap.wrap(text, WIDTH, break_on_hyphens=False))


def render_leak(data: dict[str, Any]) -> str:
    """README's block: the first leak run as a terminal shows it (without the lines that
    name temporary paths and ports), then the spread over the runs."""
    runs = data["scenarios"]["leak"]
    first = runs[0]
    said = [ln for ln in first["said"].splitlines() if "scenario leak" in ln]
    done = [
        ln
        for ln in first["said"].splitlines()
        if ln.startswith(("[demo] 1 expected alert", "[demo] receivers:"))
    ]
    shown = [*said, *firing_block(first["stdout"], "GpuMemoryLeak").splitlines(), *done]
    sample = "\n".join(w for line in shown for w in _wrap(line))
    rate = _range(*spread(data, "leak", "gb_per_hour"), ".2f")
    inc = _range(*spread(data, "leak", "increase_gb"), ".2f")
    hours = _range(*spread(data, "leak", "window_h"), ".1f")
    tte = _range(*spread(data, "leak", "tte_h"), ".1f")
    secs = _range(*spread(data, "leak", "seconds"), ".1f")
    tol = data["tolerance"]
    note = (
        f"That is one run. Over {len(runs)} runs on a {data['cpus']}-core machine "
        f"({data['date']}, `python bench/docs_numbers.py`) the page said {rate} GB/h "
        f"(+{inc} GB over {hours} h, full in ~{tte} h) and came {secs} s after the agent "
        "started. The rules run in event time on the same telemetry in every run, so what "
        "the alert says changes only with the code (the integration tests hold a fresh run "
        f"to it, within {tol['gb_per_hour']} GB/h); how long it takes depends on the "
        "machine and its load."
    )
    return f"```\n{sample}\n```\n\n" + _para(note)


def render_scenarios(data: dict[str, Any]) -> str:
    """commands.md's paragraph: what ``all`` and ``healthy`` delivered."""
    runs = data["scenarios"]["all"]
    n = len(runs)

    def r(key: str, fmt: str = ".0f") -> str:
        return _range(*spread(data, "all", key), fmt)

    also = re.findall(r"^\[demo\] also firing: (\w+) (.+?): (.+)$", runs[0]["said"], re.M)
    consequences = "; ".join(f"{rule} `{who}` ({why})" for rule, who, why in also)
    healthy = data["scenarios"]["healthy"]
    msgs = _range(*spread(data, "healthy", "messages"), ",.0f")
    pages = _range(*spread(data, "healthy", "pages"), ".0f")
    secs = _range(*spread(data, "healthy", "seconds"), ".0f")
    text = (
        f"Measured with `python bench/docs_numbers.py` ({n} runs of `all`, {len(healthy)} of "
        f"`healthy`, on a {data['cpus']}-core machine, {data['date']}; the numbers are in "
        "`bench/results/docs-numbers.json`): `ragwatch demo --scenario all` delivered its "
        f"{r('expected')} expected alerts (GpuMemoryLeak and GpuOomKill for pid 4011, "
        "TokensPerRequestDrop, RetrievalSlowdown and RequestOutlierCluster for rag-api-1 "
        f"only), each with a root-cause hint, in {r('seconds', '.1f')} s, waited for all of "
        "them to resolve, and checked the receivers: the webhook got each alert's firing "
        f"and resolution once ({r('webhook_bodies')} bodies: {r('fired')} firings and "
        f"{r('resolved')} resolutions), the PagerDuty-like receiver one trigger and one "
        "resolve per critical/error alert that resolved "
        f"({r('pagerduty_triggers')} triggers + {r('pagerduty_resolves')} resolves), Slack "
        f"{r('slack_messages')} grouped messages (how many depends on when the notifier's "
        "event-time clock passes each group's 30-second wait, which varies with the "
        f"machine's load). {len(also)} more alerts fired as consequences of the faults and "
        f"the demo said why: {consequences}. `--scenario healthy` processed {msgs} "
        f"messages with {pages} pages in {secs} s."
    )
    return _para(text)


HINTED = ("GpuMemoryLeak", "RetrievalSlowdown", "GpuOomKill")


def render_hints(data: dict[str, Any]) -> str:
    """docs/rules.md's sample of hints: those of the first ``all`` run."""
    out = data["scenarios"]["all"][0]["stdout"]
    lines = []
    for rule in HINTED:
        hint = re.search(r"^  hint: (.*)$", firing_block(out, rule), re.M)
        if hint:
            lines += textwrap.wrap(
                f"{rule}: {hint[1]}", WIDTH, subsequent_indent="  ", break_on_hyphens=False
            )
    return "```\n" + "\n".join(lines) + "\n```"


RENDER = {"leak": render_leak, "scenarios": render_scenarios, "hints": render_hints}


def block(text: str, name: str) -> str:
    """The content between ``<!-- demo:name -->`` and ``<!-- /demo:name -->``."""
    m = re.search(rf"<!-- demo:{name} -->\n(.*?)\n<!-- /demo:{name} -->", text, re.S)
    if m is None:
        raise SystemExit(f"no <!-- demo:{name} --> block")
    return m.group(1)


def write_docs(data: dict[str, Any]) -> list[str]:
    """Rewrite every block from ``data``; the names of those that changed."""
    changed = []
    for name, path in BLOCKS.items():
        text = path.read_text()
        new = RENDER[name](data)
        if block(text, name) != new:
            old = f"<!-- demo:{name} -->\n{block(text, name)}\n<!-- /demo:{name} -->"
            path.write_text(
                text.replace(old, f"<!-- demo:{name} -->\n{new}\n<!-- /demo:{name} -->")
            )
            changed.append(f"{path.relative_to(ROOT)}: {name}")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of leak and all (default 3)")
    ap.add_argument("--healthy-runs", type=int, default=1, help="runs of healthy (default 1)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    ap.add_argument(
        "--docs-only", action="store_true", help="rewrite the doc blocks from --out only"
    )
    args = ap.parse_args(argv)
    if args.docs_only:
        data = json.loads(args.out.read_text())
    else:
        data = measure(args.runs, args.healthy_runs)
        bad = [
            f"{s} run {i}"
            for s, runs in data["scenarios"].items()
            for i, r in enumerate(runs)
            if r["rc"] != 0
        ]
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        if bad:
            print(f"failed runs, docs left alone: {', '.join(bad)}", file=sys.stderr)
            return 1
    changed = write_docs(data)
    print(f"docs: {', '.join(changed) or 'unchanged'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
