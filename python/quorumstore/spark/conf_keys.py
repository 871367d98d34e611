"""The one list of ``spark.quorumstore.*`` settings, and the warning for any other.

Spark accepts any key, so a misspelled setting (``spark.quorumstore.replicationfactor``)
would otherwise be ignored and its default used without a word. The list lives in
``conf_keys.txt`` because the state store provider, which runs in the JVM, reads the same
file from its jar (quorumstore/spark/jar_build.py copies it) and warns the same way.

>>> unknown_key_warnings({"spark.quorumstore.node": "5", "spark.app.name": "x"})
['unknown setting spark.quorumstore.node (ignored); did you mean spark.quorumstore.nodes?']
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from importlib import resources

from quorumstore.spark.config import PREFIX

#: Where a user finds the settings when no known key resembles theirs.
SETTINGS_DOCS = "docs/running-on-spark.md (hosting) and docs/state-store.md (state store)"

log = logging.getLogger(__name__)


def _read_known_keys() -> frozenset[str]:
    text = resources.files("quorumstore.spark").joinpath("conf_keys.txt").read_text()
    lines = (line.strip() for line in text.splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


KNOWN_KEYS = _read_known_keys()
#: Known keys by their lower-cased part after PREFIX, which suggestions are matched on:
#: with the shared prefix every key would look close to every other.
_BY_SUFFIX = {key.removeprefix(PREFIX).lower(): key for key in KNOWN_KEYS}


def _suggestion(key: str) -> str | None:
    suffix = key.removeprefix(PREFIX).lower()
    leaf = suffix.rsplit(".", 1)[-1]
    same_leaf = [known for known in _BY_SUFFIX if known.rsplit(".", 1)[-1] == leaf]
    close = same_leaf or difflib.get_close_matches(suffix, _BY_SUFFIX, n=1, cutoff=0.75)
    return _BY_SUFFIX[close[0]] if close else None


def unknown_key_warnings(keys: Iterable[str]) -> list[str]:
    """One message per ``spark.quorumstore.*`` key in `keys` that quorumstore never reads."""
    messages = []
    for key in sorted(k for k in keys if k.startswith(PREFIX) and k not in KNOWN_KEYS):
        suggestion = _suggestion(key)
        hint = (
            f"did you mean {suggestion}?" if suggestion else f"the settings are in {SETTINGS_DOCS}"
        )
        messages.append(f"unknown setting {key} (ignored); {hint}")
    return messages


def warn_unknown_keys(keys: Iterable[str], source: str) -> None:
    """Logs a warning per unknown ``spark.quorumstore.*`` key among `keys`, read from `source`."""
    for message in unknown_key_warnings(keys):
        log.warning("%s: %s", source, message)
