"""The bound on restarting a dead engine core (api/core_process_handle.py): at once after a core
that lived, backing off after failures in a row, giving up after MAX_FAILURES; exit statuses in
words for the one log line."""

from scheduler_svc.api.core_process_handle import MAX_FAILURES, STABLE_S, RestartPolicy, describe_exit


def test_a_core_that_keeps_failing_is_retried_with_back_off_then_given_up():
    policy = RestartPolicy()
    policy.core_died(lived_s=STABLE_S + 1)
    delays = []
    while (delay := policy.next_delay()) is not None:
        delays.append(delay)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0] and len(delays) == MAX_FAILURES


def test_a_core_that_lived_starts_the_count_again_and_one_that_died_young_does_not():
    policy = RestartPolicy(max_failures=3)
    assert policy.next_delay() == 0.0  # first death: restarted at once
    policy.core_died(lived_s=1.0)  # the restarted core died young: a failure in a row
    assert policy.next_delay() == 1.0
    policy.core_died(lived_s=STABLE_S)  # this one lived: the count starts over
    assert policy.next_delay() == 0.0


def test_exit_statuses_in_words():
    assert describe_exit(-9) == "-9 (SIGKILL)"
    assert describe_exit(1) == "1" and describe_exit(0) == "0"
