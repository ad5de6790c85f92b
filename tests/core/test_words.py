"""Counts in the right number, and sentences that end once (gazeguard.core.words)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gazeguard.core.words import counted, ended, plural


def test_counts_agree_with_their_nouns() -> None:
    assert counted(1, "chunk") == "1 chunk"
    assert counted(0, "chunk") == "0 chunks"
    assert counted(2, "label") == "2 labels"
    assert counted(1, "tail step") == "1 tail step"
    assert counted(3, "tail step") == "3 tail steps"
    assert counted(2, "person") == "2 people"
    assert counted(1, "time") == "1 time"
    assert plural("class", 4) == "classes"


@given(st.integers(min_value=0, max_value=10**6))
def test_only_one_is_singular(n: int) -> None:
    assert counted(n, "session").endswith("sessions") == (n != 1)


def test_a_sentence_ends_once() -> None:
    assert ended("is the broker running on that host and port?") == (
        "is the broker running on that host and port?"
    )
    assert ended("refused") == "refused."
    assert ended("done.") == "done."
