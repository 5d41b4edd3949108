"""YAML configuration files read with their line numbers, and the value checks the rules
file and the notify file share.

A syntax error is one line, ``FILE:LINE:COL: problem`` (PyYAML's own message names
``<unicode string>`` over six lines); so is a key given twice in one mapping (PyYAML keeps
the last one silently). :meth:`YamlDoc.locate` puts the file and line in front of a
:class:`~ragwatch.errors.ConfigError` whose message starts with the path of the bad node
(``rules[3].expr: ...``), so the parsers of the files name paths and this module finds
their lines. PyYAML is imported when a file is read: the core imports this module, and
the agent's minimal install has no PyYAML.

>>> doc = parse("rules:\\n  - name: A\\n    expr: x > 1e999\\n", "rules.yaml")
>>> doc.data
{'rules': [{'name': 'A', 'expr': 'x > 1e999'}]}
>>> str(doc.locate(ConfigError("rules[0].expr: the threshold must be a finite number")))
'rules.yaml:3:11: rules[0].expr: the threshold must be a finite number'
>>> parse("route: {continue: true, continue: false}", "notify.yaml")
Traceback (most recent call last):
ragwatch.errors.ConfigError: notify.yaml:1:25: duplicate key 'continue' (first at 1:9)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragwatch.errors import ConfigError

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # Prometheus' rule for label names
_PATH = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+|\[\d+\])*(?=: |$)")
_LAST = re.compile(r"(?:\.[^.\[\]]+|\[\d+\])$")
_BOOLS = ("true", "false", "yes", "no", "on", "off")


@dataclass(frozen=True)
class YamlDoc:
    """A decoded YAML document, with where each node starts (``path -> (line, col)``)."""

    data: Any
    source: str
    marks: Mapping[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def where(self, path: str) -> str:
        """``FILE:LINE:COL`` of the node at ``path``, or of its nearest ancestor that has
        one (``FILE`` alone for the document itself)."""
        while path and path not in self.marks:
            path = _LAST.sub("", path) if _LAST.search(path) else ""
        if not path:
            return self.source
        line, col = self.marks[path]
        return f"{self.source}:{line}:{col}"

    def locate(self, exc: ConfigError) -> ConfigError:
        """``exc`` with the file and line of the path its message starts with."""
        message = str(exc)
        m = _PATH.match(message)
        return ConfigError(f"{self.where(m.group(0) if m else '')}: {message}")


def read(path: Path, what: str) -> YamlDoc:
    """The YAML file at ``path``; ``what`` ("rules file") names it in reading errors."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 text (byte {exc.start})") from None
    return parse(text, str(path))


def parse(text: str, source: str) -> YamlDoc:
    """Decode ``text`` (YAML 1.1, safe types only); errors are ``SOURCE:LINE:COL: ...``."""
    import yaml

    loader = None
    try:
        loader = _loader_class()(text)  # the reader checks the characters here
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_syntax_error(source, exc)) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise ConfigError(
            f"{source}:{line}:{col}: character #x{exc.character:04x} is not allowed in YAML"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {' '.join(str(exc).split())}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return YamlDoc(data, source, _marks(node) if node is not None else {})


def _syntax_error(source: str, exc: Any) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    problem = exc.problem or exc.context or "invalid YAML"
    context = exc.context if exc.problem else None
    cm = exc.context_mark
    if context and cm is not None and (mark is None or cm.line != mark.line):
        problem += f" ({context} at {cm.line + 1}:{cm.column + 1})"
    elif context:
        problem += f" ({context})"
    return f"{where}: {problem}"


@functools.cache
def _loader_class() -> type[Any]:
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice in one mapping."""

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                        key_node, yaml.ScalarNode
                    ):
                        continue
                    key = self.construct_object(key_node)
                    if key in seen:
                        first = seen[key]
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"duplicate key {key!r} (first at {first.line + 1}:{first.column + 1})",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark
            return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]

    return Loader


def _marks(root: Any) -> dict[str, tuple[int, int]]:
    """Where each node starts, by path (``a.b[2].c``); a node reached again through an
    alias is not walked twice (aliases can nest exponentially)."""
    import yaml

    out: dict[str, tuple[int, int]] = {}
    walked: set[int] = set()
    todo: list[tuple[str, Any]] = [("", root)]
    while todo:
        path, node = todo.pop()
        out.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if id(node) in walked:
            continue
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    todo.append((f"{path}.{key.value}" if path else str(key.value), value))
        elif isinstance(node, yaml.SequenceNode):
            todo += [(f"{path}[{i}]", value) for i, value in enumerate(node.value)]
    return out


# ---------------------------------------------------------------- values of config files


def shown(v: Any) -> str:
    """A decoded YAML value as the user wrote it, for error messages.

    >>> shown(None), shown(True), shown("false"), shown(3), shown([1])
    ('null', 'true', "the string 'false'", '3', 'a list')
    """
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"the string {v!r}"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, Mapping):
        return "a mapping"
    return "a list" if isinstance(v, list) else type(v).__name__


def boolean(v: Any, where: str) -> bool:
    """A YAML boolean; a quoted ``"false"`` is refused (it would be a true string).

    >>> boolean("false", "routes[0].continue")
    Traceback (most recent call last):
    ragwatch.errors.ConfigError: routes[0].continue: expected true or false, got the string 'false' (write false without quotes)
    """  # noqa: E501
    if isinstance(v, bool):
        return v
    hint = ""
    if isinstance(v, str) and v.strip().lower() in _BOOLS:
        hint = f" (write {v.strip().lower()} without quotes)"
    raise ConfigError(f"{where}: expected true or false, got {shown(v)}{hint}")


def label_name(v: Any, where: str) -> str:
    """A label name: letters, digits and ``_``, not starting with a digit (Prometheus)."""
    if not isinstance(v, str):
        raise ConfigError(f"{where}: expected a label name, got {shown(v)}")
    if not LABEL_NAME.match(v):
        raise ConfigError(
            f"{where}: {v!r} is not a label name (letters, digits and _, not starting with a digit)"
        )
    return v


def label_names(v: Any, where: str, *, wildcard: str | None = None) -> tuple[str, ...]:
    """A list of distinct label names (``[a-zA-Z_][a-zA-Z0-9_]*``); ``wildcard`` (``...``)
    is allowed alone.

    >>> label_names(["host", "gpu"], "equal")
    ('host', 'gpu')
    >>> label_names([None, 3], "inhibit_rules[0].equal")
    Traceback (most recent call last):
    ragwatch.errors.ConfigError: inhibit_rules[0].equal[0]: expected a label name, got null
    """
    if not isinstance(v, list):
        raise ConfigError(f"{where}: expected a list of label names, got {shown(v)}")
    for i, x in enumerate(v):
        if x != wildcard or not isinstance(x, str):
            label_name(x, f"{where}[{i}]")
        if x in v[:i]:
            raise ConfigError(f"{where}[{i}]: {x!r} is listed twice")
    if wildcard in v and len(v) > 1:
        raise ConfigError(f"{where}: {wildcard!r} (every label) goes alone, without other names")
    return tuple(v)


def label_map(v: Any, where: str) -> dict[str, str]:
    """A mapping of label (or annotation) names to strings; null is an empty mapping."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where}: expected a mapping of names to strings, got {shown(v)}")
    for k, x in v.items():
        label_name(k, where)
        if not isinstance(x, str):
            raise ConfigError(f"{where}.{k}: expected a string, got {shown(x)}")
    return dict(v)
