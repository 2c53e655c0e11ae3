"""Admission arithmetic and release order of the fully async rollouter, on the pure
controller, plus a simulated trainer/rollouter pair (random completion order, re-admissions)
that checks the staleness bound the module docstring proves, and that nothing deadlocks."""

import random
from collections import deque

import pytest

from fully_async_policy.admission import AdmissionController, window_budget
from recipe.utils.config_check import ConfigError


@pytest.mark.parametrize(
    ("per_step", "sync_every", "threshold", "budget"),
    [(16, 2, 0.5, 48), (16, 1, 0.0, 16), (10, 1, 0.1, 11), (4, 3, 0.25, 15), (8, 2, 1.0, 32)],
)
def test_window_budget_is_one_plus_threshold_times_the_window_demand(
    per_step, sync_every, threshold, budget
):
    assert window_budget(per_step, sync_every, threshold) == budget


def test_window_budget_rejects_a_zero_step():
    with pytest.raises(ConfigError, match="trigger_parameter_sync_step"):
        window_budget(4, 0, 0.5)


def _controller(budget=6, demand=4, max_fresh=None):
    return AdmissionController(budget=budget, window_demand=demand, max_fresh=max_fresh)


def test_each_window_admits_the_budget_minus_what_is_carried_over():
    ctrl = _controller(budget=6, demand=4)
    tickets = [ctrl.admit(f"p{i}") for i in range(6)]
    assert not ctrl.can_admit() and ctrl.num_admitted == 6
    for t in tickets:
        ctrl.complete(t.ticket, t.uid)
    # The trainer trained 4 of 6: 2 carried over, so window 1 admits 6 - 2 = 4.
    assert ctrl.open_window(1, num_trained=4) == 4
    assert [ctrl.admit(f"q{i}").window for i in range(4)] == [1, 1, 1, 1]
    assert not ctrl.can_admit()


def test_admission_stops_at_the_fresh_prompt_cap():
    ctrl = _controller(budget=6, demand=4, max_fresh=5)
    for i in range(5):
        ctrl.admit(f"p{i}")
    assert ctrl.allowance == 1 and not ctrl.can_admit() and ctrl.fresh_left() == 0
    with pytest.raises(RuntimeError, match="admit\\('p5'\\) without allowance"):
        ctrl.admit("p5")  # an exception, not an assert: python -O keeps the bound
    assert ctrl.admitted_uids == [f"p{i}" for i in range(5)]


def test_a_window_is_released_only_after_every_group_of_the_windows_before_it():
    ctrl = _controller(budget=4, demand=2)
    old = [ctrl.admit(f"old{i}") for i in range(4)]
    assert ctrl.complete(old[0].ticket, "old0") == ["old0"]
    assert ctrl.complete(old[3].ticket, "old3") == ["old3"]  # completion order within a window
    assert ctrl.open_window(1, num_trained=2) == 2
    new = [ctrl.admit(f"new{i}") for i in range(2)]
    assert ctrl.complete(new[0].ticket, "new0") == []  # window 0 still has stragglers
    assert ctrl.complete(old[2].ticket, "old2") == ["old2"]
    assert ctrl.complete(old[1].ticket, "old1") == ["old1", "new0"]
    assert [t.uid for t in ctrl.unreleased()] == ["new1"]
    assert ctrl.num_released == 5


def test_readmission_replaces_the_ticket_without_using_allowance():
    ctrl = _controller(budget=2, demand=2)
    a, b = ctrl.admit("a"), ctrl.admit("b")
    ctrl.open_window(1, num_trained=0)
    assert ctrl.allowance == 0
    again = ctrl.readmit(a.ticket, "a")
    assert again.window == 1 and again.ticket not in (a.ticket, b.ticket)
    assert ctrl.num_readmitted == 1 and ctrl.num_admitted == 2
    # The retired ticket no longer holds window 1 back.
    assert ctrl.complete(b.ticket, "b") == ["b"]
    assert ctrl.complete(again.ticket, "a") == ["a"]
    with pytest.raises(ValueError, match="not admitted or already released"):
        ctrl.complete(a.ticket, "a")


def test_open_window_rejects_more_trained_than_admitted():
    ctrl = _controller()
    ctrl.admit("p")
    with pytest.raises(ValueError, match="only 1 admitted"):
        ctrl.open_window(1, num_trained=2)


def _simulate(
    per_step,
    sync_every,
    threshold,
    windows,
    seed,
    readmit_prob=0.0,
    max_stale=None,
    filter_prob=0.0,
):
    """A trainer taking W groups per window from a FIFO fed by the controller, while groups
    finish in random order (some span syncs) and, with ``filter_prob``, some are filtered
    (their slots admit more at once). Returns (max staleness seen, controller)."""
    rng = random.Random(seed)
    demand = per_step * sync_every
    ctrl = AdmissionController(
        budget=window_budget(per_step, sync_every, threshold), window_demand=demand, max_fresh=None
    )
    in_flight: list = []
    fifo: deque = deque()
    trained = seen_max = 0
    for version in range(windows):
        ctrl.open_window(version, trained)
        while ctrl.can_admit():
            in_flight.append(ctrl.admit(f"p{ctrl.num_admitted}"))
        for _ in range(demand):
            while True:
                while not fifo:
                    assert in_flight, "deadlock: the trainer waits and nothing generates"
                    ticket = in_flight.pop(rng.randrange(len(in_flight)))
                    if rng.random() < filter_prob:
                        fifo.extend(ctrl.filter(ticket.ticket))
                        while ctrl.can_admit():
                            in_flight.append(ctrl.admit(f"p{ctrl.num_admitted}"))
                    else:
                        fifo.extend(ctrl.complete(ticket.ticket, ticket))
                group = fifo.popleft()
                too_old = max_stale is not None and version - group.window > max_stale
                if not too_old and rng.random() >= readmit_prob:
                    break
                in_flight.append(ctrl.readmit(group.ticket, group.uid))
            seen_max = max(seen_max, version - group.window)
            trained += 1
    return seen_max, ctrl


@pytest.mark.parametrize(
    ("per_step", "sync_every", "threshold", "bound"),
    [(4, 1, 0.0, 0), (4, 2, 0.5, 1), (3, 2, 1.0, 1), (4, 1, 1.5, 2), (2, 3, 0.3, 1)],
)
def test_random_completion_order_never_exceeds_the_staleness_bound(
    per_step, sync_every, threshold, bound
):
    worst = 0
    for seed in range(30):
        seen, ctrl = _simulate(per_step, sync_every, threshold, windows=12, seed=seed)
        assert ctrl.staleness_bound == bound
        assert seen <= bound
        worst = max(worst, seen)
    assert worst == bound  # the bound is reached, so it is the tight one


def test_readmissions_keep_the_bound_and_never_deadlock():
    for seed in range(20):
        seen, ctrl = _simulate(4, 2, 0.5, windows=10, seed=seed, readmit_prob=0.2)
        assert seen <= ctrl.staleness_bound and ctrl.num_readmitted > 0


def test_max_staleness_zero_turns_off_policy_groups_into_readmissions():
    seen, ctrl = _simulate(4, 2, 0.5, windows=10, seed=3, max_stale=0)
    assert seen == 0 and ctrl.num_readmitted > 0


@pytest.mark.parametrize(("threshold", "filter_prob"), [(0.0, 0.3), (0.5, 0.5), (1.5, 0.2)])
def test_filtered_groups_give_their_slots_back_and_keep_the_bound(threshold, filter_prob):
    for seed in range(20):
        seen, ctrl = _simulate(4, 2, threshold, windows=10, seed=seed, filter_prob=filter_prob)
        assert seen <= ctrl.staleness_bound and ctrl.num_filtered > 0
        # every admitted prompt: trained (10 windows x 8), filtered, or still live
        assert ctrl.num_admitted >= 80 + ctrl.num_filtered


def test_a_filtered_group_frees_its_slot_releases_later_windows_and_spares_fresh_prompts():
    ctrl = _controller(budget=2, demand=1, max_fresh=4)
    first, second = ctrl.admit("a"), ctrl.admit("b")
    assert ctrl.complete(second.ticket, "B") == ["B"] and not ctrl.can_admit()
    assert ctrl.open_window(1, num_trained=1) == 1  # a is still live
    third = ctrl.admit("c")
    assert ctrl.complete(third.ticket, "C") == []  # window 0's a holds it back
    assert ctrl.filter(first.ticket) == ["C"] and ctrl.can_admit()  # a's slot is back
    assert ctrl.filtered_uids == ["a"] and ctrl.num_filtered_in_window == 1
    assert ctrl.fresh_left() == 2  # 3 admitted, 1 of them filtered
    assert ctrl.open_window(2, num_trained=2) == 2 and ctrl.num_filtered_in_window == 0
    with pytest.raises(ValueError, match="ticket 0"):
        ctrl.filter(first.ticket)
    restored = _controller(budget=2, demand=1, max_fresh=4)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.filtered_uids == ["a"] and restored.fresh_left() == 2


def test_the_first_step_of_a_window_trains_the_last_finishers_of_the_window_before():
    """What each step of a window trains, with the defaults T = 2, staleness_threshold = 0.5
    (B - W = R): the first step the R groups of the window before that finished last (one
    version old), the second the R of its own window that finished first. Where the longer
    responses are the worse ones, the training reward zigzags from step to step
    (``python -m recipe.tools.study.zigzag`` measures it); every group is still trained once."""
    per_step, sync_every = 4, 2
    ctrl = AdmissionController(
        budget=window_budget(per_step, sync_every, 0.5),
        window_demand=per_step * sync_every,
        max_fresh=None,
    )
    rng = random.Random(0)
    queue: deque = deque()  # the message queue: FIFO
    steps, admitted_by_window, num_trained = [], [], 0
    for window in range(5):
        if window:
            ctrl.open_window(window, num_trained)
        admitted = []
        while ctrl.can_admit():
            admitted.append((ctrl.admit(f"w{window}-{len(admitted)}"), rng.random()))
        admitted_by_window.append(sorted(admitted, key=lambda a: a[1]))  # by generation time
        for ticket, _ in admitted_by_window[-1]:  # all start at once: shortest finishes first
            queue.extend(ctrl.complete(ticket.ticket, ticket.uid))
        for _ in range(sync_every):
            steps.append({queue.popleft() for _ in range(per_step)})
            num_trained += per_step
    for window in range(1, 5):
        before, this = admitted_by_window[window - 1], admitted_by_window[window]
        assert len(this) == per_step * sync_every  # B minus the R carried over
        assert steps[2 * window] == {t.uid for t, _ in before[-per_step:]}  # last to finish
        assert steps[2 * window + 1] == {t.uid for t, _ in this[:per_step]}  # first to finish
