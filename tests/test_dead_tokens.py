"""The recently-dead-token table shared by a consumer's pollers (reference_impl/dead_tokens.py):
remembered for a while, forgotten after, and seen across a fork."""

from __future__ import annotations

import multiprocessing

from reference_impl.dead_tokens import DeadTokens


def test_a_dead_token_is_remembered_for_a_while_then_forgotten():
    now = [100.0]
    table = DeadTokens(remember_seconds=60, clock=lambda: now[0])
    assert not table.dead("t0", "u1#d1")
    table.add("t0", "u1#d1")
    assert table.dead("t0", "u1#d1")
    assert not table.dead("t1", "u1#d1")  # per tenant
    assert not table.dead("t0", "u1#d2")
    now[0] += 59
    assert table.dead("t0", "u1#d1")
    now[0] += 2
    assert not table.dead("t0", "u1#d1")  # the deactivated record decides from here on
    table.add("t0", "u1#d1")
    assert table.dead("t0", "u1#d1")


def test_many_dead_tokens_are_all_remembered():
    table = DeadTokens()
    for n in range(5000):
        table.add("t0", f"u{n}#d")
    assert all(table.dead("t0", f"u{n}#d") for n in range(5000))
    assert not any(table.dead("t0", f"v{n}#d") for n in range(5000))


def _add_in_child(table: DeadTokens) -> None:
    table.add("t0", "child#d")


def test_a_forked_worker_sees_what_another_added():
    table = DeadTokens()
    child = multiprocessing.get_context("fork").Process(target=_add_in_child, args=(table,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert table.dead("t0", "child#d")
