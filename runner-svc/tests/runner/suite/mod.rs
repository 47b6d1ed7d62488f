//! The runner's storage conformance suite, written once against a `common::Backend` passed in
//! and instantiated per backend by [`suite!`]: the seam's own contract (`backend_contract`), and
//! the mailbox, the event log and its cursors, retention, state counts, task workers and the
//! store check, which reach storage only through `store::Store`. Every case is a function of
//! its file taking the backend; `suite!` lists them all, so a backend cannot leave one out. A
//! new backend passes the suite by being a `Backend` and one more `suite!` line below.

pub mod backend_contract;
pub mod handoff;
pub mod interrupt;
pub mod lease_takeover;
pub mod mailbox_concurrency;
pub mod mailbox_model;
pub mod retention;
pub mod slow_subscriber;
pub mod state_counts;
pub mod store_races;
pub mod stream_reads;
pub mod tasks;
pub mod verify;

/// On sled, the embedded store: the full suite, the mailbox model with all its cases.
mod on_sled {
    super::suite!(Sled);
}

/// On PostgreSQL (a schema per test, on the shared throwaway cluster): the full suite, the
/// mailbox model on a sample of cases.
mod on_postgres {
    super::suite!(Postgres);
}

/// One test per case for the backend `$backend` (a variant of `common::Backend`), in a module per
/// file: `suite::on_sled::handoff::…`. A case is listed with the runtime it runs on: `sync`
/// (a plain `#[test]`), `current` (a current-thread runtime), `mt2` and `mt4` (a runtime with
/// that many worker threads).
macro_rules! suite {
    ($backend:ident) => {
        $crate::suite::suite!(@file $backend; backend_contract {
            sync lock_first_takes_the_first_present_keys_as_the_transaction_sees_them,
            sync racing_claimers_take_every_candidate_once,
            sync a_counter_sums_every_committed_add,
            mt2 durable_commits_are_answered_in_commit_order_and_then_read,
            mt4 racing_read_modify_writes_lose_no_update,
            sync scans_page_by_key_within_prefix_bounds,
            sync insert_new_writes_only_an_absent_key,
            sync next_id_never_hands_out_an_id_twice,
        });
        $crate::suite::suite!(@file $backend; handoff {
            mt2 a_submission_and_a_decision_hand_their_job_to_the_waiting_worker,
            mt2 a_job_whose_thread_is_busy_stays_queued_until_the_thread_is_free,
            mt2 a_timer_set_by_a_step_runs_when_due_after_its_worker_ran_something_else,
            mt2 a_hand_off_whose_caller_went_away_still_reaches_its_worker,
        });
        $crate::suite::suite!(@file $backend; interrupt {
            mt4 interrupt_supersedes_queued_work_and_cancels_the_running_run,
        });
        $crate::suite::suite!(@file $backend; lease_takeover {
            mt4 a_stalled_worker_loses_its_lease_and_its_late_write_is_refused,
        });
        $crate::suite::suite!(@file $backend; mailbox_concurrency {
            sync sixteen_claimers_take_every_job_exactly_once,
            sync a_second_ack_with_the_same_token_is_refused,
            mt2 pool_claims_sharing_batches_take_every_job_once,
            current a_lone_pool_claimer_takes_jobs_in_claim_order,
        });
        $crate::suite::suite!(@file $backend; mailbox_model {
            sync mailbox_matches_the_model,
            sync regression_dedupe_holder_after_interrupts_and_requeues,
        });
        $crate::suite::suite!(@file $backend; retention {
            mt2 acked_events_finished_runs_and_final_jobs_are_compacted,
            mt2 ended_tasks_are_compacted_and_waiting_ones_kept,
        });
        $crate::suite::suite!(@file $backend; slow_subscriber {
            mt2 a_subscriber_that_stops_reading_is_dropped_and_resumes_from_its_cursor,
        });
        $crate::suite::suite!(@file $backend; state_counts {
            mt2 counts_follow_runs_through_suspension_resume_cancel_and_retention,
        });
        $crate::suite::suite!(@file $backend; store_races {
            sync of_racing_writers_of_a_new_key_one_wins_and_the_others_get_its_value,
            sync racing_writers_of_different_keys_all_write,
            sync a_read_of_several_keys_answers_each_in_the_order_asked,
            sync a_scan_told_how_many_are_wanted_answers_the_same_entries,
            sync keys_read_with_a_prefix_answer_as_read_apart,
            mt2 a_body_reads_what_the_bodies_before_it_in_its_batch_left,
        });
        $crate::suite::suite!(@file $backend; stream_reads {
            mt2 a_stream_reads_the_events_this_process_just_committed_from_memory,
        });
        $crate::suite::suite!(@file $backend; verify {
            mt2 the_store_check_sees_no_damage_in_writes_made_while_it_reads,
        });
        mod tasks {
            $crate::suite::suite!(@file $backend; (tasks::cancellation) => cancellation {
                mt4 cancelling_a_run_cancels_its_queued_task_and_flags_its_leased_one,
                mt4 a_timeout_or_an_interrupt_cancels_a_leased_task,
            });
            $crate::suite::suite!(@file $backend; (tasks::dispatch) => dispatch {
                mt4 a_stream_holds_at_most_max_in_flight_tasks_and_every_run_gets_its_output,
                mt4 concurrent_completions_with_one_token_reach_the_run_once,
                mt4 a_long_poll_returns_once_a_task_is_queued_and_empty_after_its_wait,
                mt2 a_dispatch_whose_poller_went_away_is_streamed_at_once,
            });
            $crate::suite::suite!(@file $backend; (tasks::external) => external {
                mt4 an_external_node_is_a_task_that_a_worker_or_a_resolve_answers,
            });
            $crate::suite::suite!(@file $backend; (tasks::failures) => failures {
                mt4 a_retryable_failure_waits_out_its_backoff_then_the_next_attempt_succeeds,
                mt4 a_failure_that_is_not_retryable_fails_the_run_at_once,
                mt4 a_thrown_business_error_lands_on_the_blackboard_and_a_selector_falls_back,
            });
            $crate::suite::suite!(@file $backend; (tasks::fencing) => fencing {
                mt4 a_wrong_token_is_aborted_and_changes_nothing_and_bad_fields_are_invalid,
                mt4 an_expired_lease_is_tried_again_with_its_details_and_the_old_token_is_aborted,
                mt4 with_one_attempt_an_expired_lease_fails_the_run,
            });
            $crate::suite::suite!(@file $backend; (tasks::release) => release {
                mt4 a_released_task_is_taken_by_another_worker_on_the_same_attempt,
                mt4 a_release_by_anyone_but_the_lease_holder_is_refused_and_changes_nothing,
                mt4 a_release_after_the_lease_ran_out_or_the_run_cancelled_the_task_queues_nothing,
                mt4 a_page_size_above_the_maximum_is_clamped_not_refused,
            });
            $crate::suite::suite!(@file $backend; (tasks::restart) => restart {
                mt4 leased_and_queued_tasks_survive_a_runner_restart,
            });
        }
    };
    // A file of the suite whose module is `suite::$file`.
    (@file $backend:ident; $file:ident { $($kind:ident $case:ident),* $(,)? }) => {
        $crate::suite::suite!(@file $backend; ($file) => $file { $($kind $case),* });
    };
    // A file of the suite at `suite::$path` (a parenthesised path), its tests in the module `$name`.
    (@file $backend:ident; $path:tt => $name:ident {
        $($kind:ident $case:ident),* $(,)?
    }) => {
        mod $name {
            $( $crate::suite::suite!(@case $backend; $path; $kind $case); )*
        }
    };
    (@case $backend:ident; ($($path:ident)::+); sync $case:ident) => {
        #[test]
        fn $case() {
            $crate::suite::$($path::)+$case($crate::common::Backend::$backend)
        }
    };
    (@case $backend:ident; ($($path:ident)::+); current $case:ident) => {
        #[tokio::test]
        async fn $case() {
            $crate::suite::$($path::)+$case($crate::common::Backend::$backend).await
        }
    };
    (@case $backend:ident; ($($path:ident)::+); mt2 $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $crate::suite::$($path::)+$case($crate::common::Backend::$backend).await
        }
    };
    (@case $backend:ident; ($($path:ident)::+); mt4 $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            $crate::suite::$($path::)+$case($crate::common::Backend::$backend).await
        }
    };
}
pub(crate) use suite;
