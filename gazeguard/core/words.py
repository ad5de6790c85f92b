"""Words for people: counts with their noun in the right number, and sentences that end once.

Every line gazeguard prints with a count goes through :func:`counted` (``1 chunk``, ``2 chunks``,
``0 chunks``), so that no line says "1 chunks".
"""

from __future__ import annotations

#: Nouns whose plural is not the singular plus "s".
IRREGULAR = {"person": "people", "entry": "entries", "class": "classes", "is": "are"}


def plural(noun: str, n: int) -> str:
    """``noun`` in the number of ``n``: itself for 1, else its plural (the last word's)."""
    if n == 1:
        return noun
    head, _, last = noun.rpartition(" ")
    many = IRREGULAR.get(last, last + "s")
    return f"{head} {many}" if head else many


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` in its number: ``counted(1, "chunk")`` is ``1 chunk``,
    ``counted(3, "tail step")`` is ``3 tail steps``."""
    return f"{n} {plural(noun, n)}"


def ended(text: str) -> str:
    """``text`` closed by a full stop, unless it already ends with one, a question or an
    exclamation mark (no "port?.")."""
    text = text.rstrip()
    return text if text.endswith((".", "?", "!")) else text + "."
