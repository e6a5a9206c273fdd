"""A store's URL as messages and logs show it: never with its password."""

from __future__ import annotations

import pytest

from qgmem.serving.storage.postgres import shown_url


@pytest.mark.parametrize("url, shown", [
    ("postgresql://ana:s3cr%40t@db:5432/mem", "postgresql://ana:***@db:5432/mem"),
    ("postgresql://ana@db/mem?password=s3cret&sslmode=require", "postgresql://ana@db/mem?password=***&sslmode=require"),
    ("postgresql://ana:one@db/mem?PASSWORD=two", "postgresql://ana:***@db/mem?PASSWORD=***"),
    ("postgresql://postgres@/postgres?host=/run/pg", "postgresql://postgres@/postgres?host=/run/pg"),
    ("postgresql://db/mem", "postgresql://db/mem"),
])
def test_the_password_is_masked_wherever_libpq_takes_it(url, shown):
    assert shown_url(url) == shown
    assert "s3cr" not in shown_url(url) and "two" not in shown_url(url)
