"""Benchmark date strings → ISO-8601."""

from __future__ import annotations

import pytest

from qgmem.data.dates import to_iso


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("1:56 pm on 8 May, 2023", "2023-05-08T13:56:00"),
        ("10:37 am on 27 June, 2023", "2023-06-27T10:37:00"),
        ("12:09 am on 13 Sep, 2023", "2023-09-13T00:09:00"),
        ("2023/05/20 (Sat) 02:21", "2023-05-20T02:21:00"),
        ("2023-05-20", "2023-05-20T00:00:00"),
        ("May 8 2023 3:00 PM", "2023-05-08T15:00:00"),
    ],
)
def test_to_iso(text, iso):
    assert to_iso(text) == iso


@pytest.mark.parametrize("text", ["yesterday", "not a date", ""])
def test_to_iso_rejects_vague_or_garbled(text):
    with pytest.raises(ValueError):
        to_iso(text)
