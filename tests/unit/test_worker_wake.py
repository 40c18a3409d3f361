"""When a worker claims next and whether it listens (``tunefleet.worker.wake``): polling with
jittered backoff, listening only while its device waits, wake-ups spread."""

from __future__ import annotations

import random

from tunefleet.worker.wake import POLL_FIRST_S, WAKE_SPREAD_S, Wakeups


def test_a_full_claim_claims_again_at_once_and_never_listens() -> None:
    w = Wakeups(poll_s=5.0, listen=True, rng=random.Random(1))
    assert w.after_claim(10.0, got=1, asked=1, ready=2) == 10.0
    assert not w.wants_listen(ready=0)  # no short claim yet


def test_a_busy_worker_backs_off_and_never_listens() -> None:
    w = Wakeups(poll_s=5.0, listen=True, rng=random.Random(1))
    nxt = w.after_claim(10.0, got=0, asked=1, ready=1)  # it still times a trial
    assert 10.0 + POLL_FIRST_S / 2 <= nxt <= 10.0 + POLL_FIRST_S
    assert not w.wants_listen(ready=1)


def test_an_idle_worker_listens_at_once_is_woken_soon_and_unlistens_once_busy() -> None:
    w = Wakeups(poll_s=5.0, listen=True, rng=random.Random(1))
    assert w.after_claim(10.0, got=0, asked=2, ready=0) == 10.0  # claim again now, LISTEN first
    assert w.wants_listen(ready=0)
    w.listening = True  # the LISTEN went through with that claim
    nxt = w.after_claim(10.0, got=0, asked=2, ready=0)
    assert 10.0 + 2.5 <= nxt <= 15.0  # the fallback poll: a notification comes first
    assert 11.0 <= w.woken(11.0) <= 11.0 + WAKE_SPREAD_S
    assert not w.wants_unlisten(ready=0)
    assert w.after_claim(11.0, got=2, asked=2, ready=2) == 11.0
    assert w.wants_unlisten(ready=2)
    w.listening = False
    assert not w.wants_listen(ready=0)  # until a claim comes back short again


def test_a_lost_session_listens_to_nothing() -> None:
    w = Wakeups(poll_s=5.0, listen=True, listening=True, short_claims=2)
    w.lost_session()
    assert not w.listening and w.wants_listen(ready=0)


def test_without_listen_short_claims_back_off_with_jitter_to_the_polling_interval() -> None:
    w = Wakeups(poll_s=5.0, listen=False, rng=random.Random(7))
    waits = []
    for _ in range(8):
        waits.append(w.after_claim(0.0, got=0, asked=1, ready=0))
        assert not w.wants_listen(ready=0)
    bases = [min(5.0, POLL_FIRST_S * 2**i) for i in range(8)]
    assert all(b / 2 <= x <= b for x, b in zip(waits, bases, strict=True)), waits
    assert max(waits) <= 5.0 and waits[-1] >= 2.5
    assert w.after_claim(0.0, got=1, asked=1, ready=1) == 0.0 and w.short_claims == 0  # reset


def test_jitter_spreads_workers_that_found_the_queue_empty_or_were_woken_together() -> None:
    fleet = [Wakeups(poll_s=5.0, listen=False, rng=random.Random(i)) for i in range(200)]
    waits = [w.after_claim(0.0, got=0, asked=1, ready=0) for w in fleet]
    assert len({round(x, 6) for x in waits}) > 190
    assert min(waits) >= POLL_FIRST_S / 2 and max(waits) <= POLL_FIRST_S
    woken = [w.woken(0.0) for w in fleet]
    assert len({round(x, 6) for x in woken}) > 190 and max(woken) <= WAKE_SPREAD_S
