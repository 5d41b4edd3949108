# syntax=docker/dockerfile:1
# ragwatch worker + agent image. Configure it only through RAGWATCH_* environment
# variables (see `docker run --rm IMAGE settings`); e.g.
#   docker build -t ragwatch .
#   docker run --rm -e RAGWATCH_KAFKA_BOOTSTRAP=kafka:9092 ragwatch agent --speed 60
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Every dependency ships manylinux wheels for CPython 3.11, so no compiler is needed.
# README.md is optional in the context (the glob keeps COPY from failing without it).
COPY pyproject.toml README.md* ./
COPY ragwatch/ ragwatch/
COPY agents/ agents/
COPY streams/ streams/
COPY detectors/ detectors/
RUN pip install ".[agent,stream]" \
    && rm -rf /src/build /src/*.egg-info

# Run as an unprivileged user. Its home is the working directory because the Faust
# worker keeps a small data directory ("<app id>-data") in the current directory.
RUN groupadd --system --gid 10001 ragwatch \
    && useradd --system --uid 10001 --gid ragwatch --create-home \
        --home-dir /home/ragwatch --shell /usr/sbin/nologin ragwatch
USER 10001:10001
WORKDIR /home/ragwatch

ENTRYPOINT ["ragwatch"]
CMD ["--help"]
