"""The per-check exporter benchmark's quick mode runs end to end (no timing assertions): 2,000
checks make two capped pages of 1,000, each scraped and compared with the raised cap's page."""

from __future__ import annotations

import pytest
from support.benches import run_bench


@pytest.mark.slow
def test_metrics_bench_quick_mode_scrapes_every_capped_page():
    result = run_bench("metrics_bench", "--quick", timeout=120)
    assert result["pages"] == 2
    pages = result["capped pages"]
    assert [p["page"] for p in pages] == [
        "capped page 0 (1,000 checks)",
        "capped page 1 (1,000 checks)",
    ]
    for page in pages:
        assert page["bytes"] > 0 and 0 < page["best_s"] <= page["first_s"], page
    assert result["worst_capped_s"] == max(p["first_s"] for p in pages)
    assert result["raised_s"] > 0 and result["raised_bytes"] > max(p["bytes"] for p in pages)
    assert result["uid_read_s"] > 0
