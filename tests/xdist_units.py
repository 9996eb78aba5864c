"""How the suite is handed out to pytest-xdist's processes (``--dist loadfile``).

pytest-xdist's loadfile hands out whole files, one at a time, in the order they were
collected: a long file is a floor under the run's wall time (its tests run one after
another on one process while the others finish and sit idle), and a long file handed out
last ends the run alone. Here (tests/conftest.py's ``pytest_xdist_make_scheduler``):

- the files of SPLIT are not one unit of work but one per test (their tests share no
  module- or class-scoped fixture and do not depend on each other's order), but for the
  groups named there, which stay together;
- units start longest first (COSTS; the others after them: files with tests marked slow,
  then the rest by number of tests, most first), so that the last ones handed out are
  short (longest processing time first).
"""

from __future__ import annotations

from typing import Any

import pytest

#: Files whose tests are units of work of their own; a file maps a group's name to the
#: tests (function names) that stay one unit, those that share a module-scoped fixture.
SPLIT: dict[str, dict[str, tuple[str, ...]]] = {
    "tests/model/test_model_check.py": {},
    "tests/model/test_model_check_cluster.py": {},
    "tests/model/test_model_check_postgres.py": {},
    "tests/model/test_model_combined.py": {},
    "tests/model/test_model_combined_cluster.py": {},
    "tests/model/test_model_combined_pg.py": {},
    "tests/model/test_model_runs.py": {},
    "tests/postgres/test_pg_broker.py": {},
    "tests/process/test_cli.py": {},
    "tests/process/test_durable_batch.py": {},
    "tests/process/test_durable_faults.py": {},
    "tests/process/test_durable_faults_more.py": {},
    "tests/process/test_inspect.py": {},
    "tests/process/test_jobs_cli.py": {},
    "tests/process/test_limits_processes.py": {},
    "tests/process/test_network_faults.py": {},
    "tests/process/test_network_slow_links.py": {},
    "tests/process/test_redis_faults.py": {},
    "tests/process/test_supervisor.py": {},
    "tests/redis/test_redis_broker.py": {},
    "tests/tooling/test_first_app.py": {
        # The runs with the doc's mypy configuration share one cache (module-scoped).
        "mypy": ("test_mypy_command", "test_key_is_checked_only_with_the_plugin"),
    },
    "tests/tooling/test_stubs.py": {
        # Its three mypy runs share one cache (a module-scoped fixture).
        "mypy": (
            "test_generated_stub_with_aliases_and_nesting_is_ruff_and_mypy_clean",
            "test_stub_and_schema_of_list_inputs",
            "test_stub_of_emitting_tasks",
        ),
    },
}

#: Seconds of a unit of work, measured in one run of the suite (2-core box at a load of
#: ~12, ``--junitxml``; issue 25): a file, or in a file of SPLIT a group or a test (by
#: function name: a parametrized one's mean). Only their order matters: units start
#: longest first. Units not listed (under 10 s there) start after these.
COSTS: dict[str, float] = {
    "tests/tooling/test_typing_extras.py": 166,
    "tests/tooling/test_stubs.py::mypy": 113,  # its three mypy runs share a cache
    "tests/tooling/test_first_app.py::mypy": 115,
    "tests/tooling/test_typing.py": 105,
    "tests/tooling/test_typing_pyright.py": 104,
    "tests/redis/test_redis_broker.py::test_function_flush_mid_run_is_invisible": 99,
    "tests/tooling/test_first_app.py::test_key_is_unchecked_without_the_plugin": 86,
    "tests/process/test_redis_faults.py::test_two_worker_processes_run_each_job_exactly_once": 85,
    "tests/contract/test_workflows.py": 84,
    "tests/process/test_jobs_cli.py::test_lists_dry_runs_retries_and_removes_by_filter": 81,
    "tests/postgres/test_pg_broker.py::test_terminated_connections_lose_no_job_and_run_none_twice": 80,
    "tests/process/test_cli_broker.py": 76,
    "tests/contract/test_paging.py": 76,
    "tests/contract/test_fair.py": 69,
    "tests/process/test_cli_verify.py": 67,
    "tests/process/test_jobs_cli.py::test_an_interrupted_run_is_resumed_by_running_it_again": 62,
    "tests/process/test_observability.py": 61,
    "tests/cluster/test_redis_cluster.py": 59,
    "tests/contract/test_broker_observability.py": 55,
    "tests/process/test_network_slow_links.py::test_latency": 51,
    "tests/process/test_network_faults.py::test_cut_all_connections_every_200ms": 50,
    "tests/redis/test_worker_reliability.py": 48,
    "tests/process/test_inspect.py::test_cli_on_redis_counts_lists_and_acts": 45,
    "tests/process/test_network_faults.py::test_dropped_replies": 45,
    "tests/tooling/test_dashboard_browser.py": 44,
    "tests/tooling/test_bench_flows.py": 43,
    "tests/model/test_model_combined_cluster.py::test_cluster_agrees_where_features_meet": 43,  # x16
    "tests/process/test_inspect_flow.py": 42,
    "tests/process/test_shutdown_process.py": 40,
    "tests/process/test_jobs_cli.py::test_thousands_retried_in_batches_while_a_worker_runs_each_once": 40,
    "tests/process/test_flow_faults.py": 39,
    "tests/contract/test_limits.py": 39,
    "tests/model/test_model_combined.py::test_brokers_agree_where_features_meet": 38,  # x16
    "tests/contract/test_worker_faults.py": 37,
    "tests/process/test_limits_processes.py::test_a_killed_workers_concurrency_slot_frees_with_its_lease": 37,
    "tests/contract/test_broker_leases.py": 36,
    "tests/contract/test_worker.py": 34,
    "tests/contract/test_broker_decisions.py": 34,
    "tests/tooling/test_bench_latency.py": 34,
    "tests/process/test_network_slow_links.py::test_blackholes": 33,
    "tests/model/test_model_check_postgres.py::test_postgres_follows_the_reference": 32,  # x6
    "tests/postgres/test_pg_plans.py": 31,
    "tests/contract/test_flow_control.py": 31,
    "tests/process/test_inspect.py::test_cli_shows_a_flow": 31,
    "tests/process/test_network_faults.py::test_client_kill_every_200ms_figures": 30,
    "tests/process/test_durable_batch.py::test_a_batch_of_runs_survives_repeated_sigkills": 30,  # x3
    "tests/process/test_poison_pill.py": 29,
    "tests/contract/test_durable_runs.py": 29,
    "tests/contract/test_schedules.py": 29,
    "tests/contract/test_broker_queueing.py": 28,
    "tests/process/test_fair_processes.py": 27,
    "tests/process/test_supervisor.py::test_group_metrics_add_up_the_children_after_a_mixed_run": 25,
    "tests/process/test_quickstart.py": 24,
    "tests/contract/test_bulk.py": 24,
    "tests/process/test_durable_faults_more.py::test_a_run_whose_turn_keeps_killing_its_worker_ends": 24,  # x2
    "tests/process/test_durable_faults.py::test_sigkill_after_a_step_completed_with_no_turn_worker": 24,  # x8
    "tests/process/test_limits_processes.py::test_a_rate_limit_holds_where_handlers_start_across_two_processes": 24,
    "tests/process/test_durable_faults.py::test_sigkill_between_a_steps_completion_and_its_handoff_on_cluster": 23,  # x2
    "tests/process/test_supervisor.py::test_a_child_restarted_during_an_outage_waits_and_the_group_survives": 23,
    "tests/cluster/test_cluster_sigkill.py": 23,
    "tests/process/test_redis_faults.py::test_workers_resume_after_a_redis_restart": 22,
    "tests/model/test_model_check_cluster.py::test_cluster_follows_the_reference": 22,  # x6
    "tests/model/test_model_check.py::test_broker_follows_the_reference": 22,  # x6
    "tests/postgres/test_pg_limit_batches.py": 22,
    "tests/process/test_tracing.py": 22,
    "tests/redis/test_redis_reliability.py": 21,
    "tests/process/test_cli.py::test_a_queue_no_task_uses_is_refused_in_one_line": 21,
    "tests/process/test_supervisor.py::test_a_killed_child_is_restarted_and_the_group_keeps_working": 20,
    "tests/contract/test_events.py": 20,
    "tests/process/test_durable_faults.py::test_sigkill_between_enqueueing_a_step_and_logging_it": 20,  # x6
    "tests/process/test_redis_faults.py::test_sigkilled_worker_jobs_rerun_elsewhere_once": 20,
    "tests/process/test_supervisor.py::test_children_that_give_up_on_the_broker_are_restarted_until_it_answers": 19,
    "tests/model/test_model_combined_pg.py::test_postgres_agrees_where_features_meet": 19,  # x16
    "tests/process/test_redis_faults.py::test_redis_restart_without_persistence_is_reported_once": 19,
    "tests/process/test_supervisor.py::test_children_stop_when_the_supervisor_is_killed": 18,
    "tests/process/test_cli.py::test_env_defaults_and_the_flag_wins": 18,
    "tests/process/test_cli.py::test_stubs_printed_then_saved_regenerate_from_their_header": 18,
    "tests/redis/test_dashboard_http.py": 18,
    "tests/contract/test_job_streams.py": 18,
    "tests/contract/test_flow_views.py": 18,
    "tests/contract/test_parked_jobs.py": 18,
    "tests/process/test_cli_signals.py": 18,
    "tests/process/test_dashboard_cli.py": 17,
    "tests/process/test_redis_faults.py::test_function_flush_with_worker_processes": 17,
    "tests/process/test_limits_processes.py::test_a_rate_limit_holds_across_two_worker_processes": 16,
    "tests/model/test_model_check_postgres.py::test_postgres_fair_shares_follow_the_reference": 16,  # x12
    "tests/process/test_webapp_api.py": 16,
    "tests/process/test_schedule_processes.py": 16,
    "tests/model/test_model_check_cluster.py::test_cluster_fair_shares_follow_the_reference": 15,  # x12
    "tests/process/test_supervisor.py::test_a_restarted_childs_status_2_does_not_stop_the_healthy_ones": 15,
    "tests/tooling/test_layers.py": 15,
    "tests/contract/test_broker_retention.py": 15,
    "tests/process/test_inspect_output.py": 14,
    "tests/model/test_model_check.py::test_fair_shares_follow_the_reference": 14,  # x12
    "tests/tooling/test_first_app.py::test_pytest_command": 14,
    "tests/tooling/test_dashboard_flow_browser.py": 14,
    "tests/process/test_durable_faults_more.py::test_sigkill_during_a_signal_delivery": 14,  # x2
    "tests/process/test_flow_control_processes.py": 13,
    "tests/process/test_workflows_example.py": 13,
    "tests/contract/test_verify.py": 13,
    "tests/process/test_inspect_runs.py": 13,
    "tests/contract/test_worker_blocked_loop.py": 13,
    "tests/process/test_durable_faults_more.py::test_every_worker_sigkilled_while_the_run_sleeps": 13,  # x2
    "tests/postgres/test_within.py": 12,
    "tests/redis/test_redis_purge_chunks.py": 12,
    "tests/contract/test_prefetch.py": 12,
    "tests/process/test_supervisor.py::test_a_childs_usage_error_stops_the_group_without_a_restart_loop": 12,
    "tests/contract/test_fingerprint_counts.py": 12,
    "tests/process/test_supervisor.py::test_sigterm_stops_every_child_gracefully": 11,
    "tests/contract/test_worker_errors.py": 11,
    "tests/redis/test_redis_memory.py": 11,
    "tests/redis/test_producer_reliability.py": 11,
    "tests/process/test_durable_faults.py::test_sigkill_in_the_turn_that_read_a_step_outcome": 10,  # x7
    "tests/contract/test_partitions.py": 10,
}


def unit_of(nodeid: str) -> str:
    """The unit of work of test ``nodeid``: its file, its group of a SPLIT file, or itself."""
    path, _, test = nodeid.partition("::")
    groups = SPLIT.get(path)
    if groups is None:
        return path
    name = test.partition("[")[0]
    for group, names in groups.items():
        if name in names:
            return f"{path}::{group}"
    return nodeid


def cost_of(unit: str) -> float | None:
    """The unit's cost (COSTS), None if it is not listed."""
    path, _, test = unit.partition("::")
    name = test.partition("[")[0]
    return COSTS.get(f"{path}::{name}" if name else path)


def order_items(items: list[pytest.Item]) -> None:
    """Sorts ``items`` so that units start in COSTS' order (longest first), then the
    units of files with tests marked ``slow``, then the rest by number of tests, most
    first. A unit's tests keep their order (the sort is stable), and so do units that
    rank alike."""
    per_file: dict[str, int] = {}
    slow: set[str] = set()
    for item in items:
        path = item.nodeid.partition("::")[0]
        per_file[path] = per_file.get(path, 0) + 1
        if item.get_closest_marker("slow") is not None:
            slow.add(path)

    def rank(nodeid: str) -> tuple[int, float, int]:
        cost = cost_of(unit_of(nodeid))
        if cost is not None:
            return (0, -cost, 0)
        path = nodeid.partition("::")[0]
        return (1, path not in slow, -per_file[path])

    items.sort(key=lambda item: rank(item.nodeid))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``--dist loadfile`` scheduler with unit_of's units instead of files."""
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class UnitScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)
