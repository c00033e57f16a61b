"""The wait before a call is asked again: the server's Retry-After within its cap, else the backoff."""

from __future__ import annotations

from workloads.training_run.access import call_bounds


def test_retry_delay_honours_retry_after_within_its_cap_else_backs_off():
    assert call_bounds.retry_delay(1, "2") == 2.0
    assert call_bounds.retry_delay(1, "3600") == call_bounds.RETRY_AFTER_MAX_S
    assert call_bounds.retry_delay(1, None) == call_bounds.BACKOFF_S
    assert call_bounds.retry_delay(2, "Wed, 21 Oct 2015 07:28:00 GMT") == 2 * call_bounds.BACKOFF_S
    assert call_bounds.retry_delay(10, None) == call_bounds.BACKOFF_MAX_S
