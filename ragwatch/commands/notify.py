"""``ragwatch notify`` (the notifier process) and ``ragwatch silence add|list|expire``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import signal
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

import orjson

from ragwatch.config import Settings, redact_url
from ragwatch.console.status import blocking_redis
from ragwatch.errors import ConfigError

if TYPE_CHECKING:
    from ragwatch.streams.notifier.routing import NotifyConfig

log = logging.getLogger("ragwatch.notify")


def notify_config(settings: Settings, env: Mapping[str, str]) -> NotifyConfig:
    """The notify file if one is set; else one webhook receiver per RAGWATCH_WEBHOOK_URLS,
    with the webhook timeout, attempts and HMAC secret of the settings."""
    from ragwatch.streams.notifier.routing import default_config, load_config

    if settings.notify_file is not None:
        return load_config(settings.notify_file, env)
    return default_config(
        settings.webhook_urls,
        hmac_secret=settings.webhook_hmac_secret.get(),
        timeout_s=settings.webhook_timeout,
        max_attempts=settings.webhook_max_attempts,
    )


def run_notifier(settings: Settings, environ: Mapping[str, str] | None = None) -> int:
    """Run until SIGTERM/SIGINT. A bad notify file fails before anything connects."""
    import os

    from ragwatch.kafka_admin import check_kafka, ensure_topics
    from ragwatch.streams.notifier.service import Notifier

    # a bad receiver fails here, before anything connects: load_config checks each one
    # (naming its file and line); the default ones are made of settings checked already
    config = notify_config(settings, os.environ if environ is None else environ)
    check_kafka(settings, "notify")
    if not config.receivers:
        log.warning("notify: no receivers (set RAGWATCH_WEBHOOK_URLS or RAGWATCH_NOTIFY_FILE)")
    ensure_topics(settings, command="notify")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Notifier(settings, config).run(stop)

    asyncio.run(main())
    return 0


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def silence_command(
    args: argparse.Namespace, settings: Settings, environ: Mapping[str, str], *, out: TextIO
) -> int:
    from redis.exceptions import RedisError

    from ragwatch.silences import Silence, decode_all, parse_matchers
    from ragwatch.store import Keys

    keys = Keys(settings.redis_prefix)
    client = blocking_redis(settings)
    now = time.time()
    try:
        if args.action == "add":
            author = args.author or environ.get("USER") or getpass.getuser()
            s = Silence.new(
                parse_matchers(args.match),
                comment=args.comment,
                author=author,
                now=now,
                duration_s=args.duration,
                cron=args.cron,
            )
            client.hset(keys.silences, s.id, orjson.dumps(s.to_dict()))
            until = f"windows '{s.cron}' of {args.duration:g}s" if s.cron else _when(s.ends_at)
            out.write(f"{s.id}  silenced until {until}\n")
            return 0
        silences = decode_all(client.hgetall(keys.silences))
        if args.action == "expire":
            match = [s for s in silences if s.id == args.id]
            if not match:
                raise ConfigError(f"silence {args.id!r} does not exist")
            d = {**match[0].to_dict(), "expired_at": now}
            client.hset(keys.silences, args.id, orjson.dumps(d))
            out.write(f"{args.id}  expired\n")
            return 0
        shown = [s for s in silences if args.all or s.state(now) != "expired"]
        if args.json:
            out.write(
                orjson.dumps(
                    [{**s.to_dict(), "state": s.state(now)} for s in shown],
                    option=orjson.OPT_INDENT_2,
                ).decode()
                + "\n"
            )
            return 0
        if not shown:
            out.write("no silences\n")
        for s in shown:
            matchers = ",".join(f"{m.name}{'=~' if m.regex else '='}{m.value}" for m in s.matchers)
            until = (
                f"cron '{s.cron}' for {s.duration_s:g}s" if s.cron else f"until {_when(s.ends_at)}"
            )
            out.write(f"{s.id}  {s.state(now):8} {matchers}  {until}  by {s.author}: {s.comment}\n")
        return 0
    except RedisError as exc:
        raise ConfigError(
            f"cannot reach Redis at {redact_url(settings.redis_url)}: {exc}"
        ) from None
    finally:
        client.close()
