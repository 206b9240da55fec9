//! The conformance suite: the behaviours every deployment promises, written once (`suite.rs`)
//! and run against each deployment from the same code.

mod several_keys;
mod suite;

/// One test per behaviour of `suite.rs`, against the deployment `$start` builds, each under
/// `#[tokio::test($runtime)]`.
macro_rules! conformance {
    ($deployment:ident, $start:expr, $($runtime:tt)*) => {
        mod $deployment {
            use super::{several_keys, suite};

            conformance!(@tests $start, ($($runtime)*), several_keys;
                several_keys_are_taken_all_or_none,
                opposite_orders_never_deadlock,
                a_waiter_for_several_keys_is_woken_by_the_release_of_either,
                losing_one_key_loses_the_whole_lock,
                equal_keys_count_once_and_a_lease_lists_its_keys,
                at_most_sixty_four_keys_checked_before_any_io,
                a_nested_call_on_some_of_the_keys_reenters,
                a_forced_release_of_any_key_of_a_list_reaches_its_holder_at_once,
            );
            conformance!(@tests $start, ($($runtime)*), suite;
                busy_key_fails_fast_and_the_work_never_runs,
                the_key_holds_a_fresh_random_token_with_the_ttl,
                released_before_returning_after_ok_and_err,
                released_after_a_panic,
                released_when_the_caller_drops_the_future,
                released_when_a_timeout_cancels_the_call,
                renewals_keep_a_short_lease_alive,
                renewals_exhausted_after_exactly_max_renewals,
                zero_renewals_means_at_most_one_ttl,
                lost_when_the_key_is_replaced_and_the_new_owner_keeps_it,
                a_lapsed_holder_never_deletes_the_next_owners_key,
                a_waiter_gives_up_as_busy_when_its_wait_runs_out,
                a_waiter_is_woken_by_the_release,
                no_waiter_sleeps_on_a_lock_freed_after_a_hand_over,
                fenced_waiters_of_one_client_follow_each_other_at_once,
                a_nested_call_reenters_and_only_the_outer_releases,
                a_spawned_task_is_another_owner,
                fencing_tokens_strictly_increase,
                invalid_keys_fail_before_any_io,
                readers_share_and_exclude_writers,
                each_reader_is_renewed_and_released_on_its_own,
                a_dead_reader_blocks_a_writer_at_most_its_ttl,
                permits_admit_at_most_their_number,
                a_waiting_writer_is_not_starved_by_readers,
                a_writer_handed_the_key_keeps_no_readers_out,
                a_writer_that_gives_up_keeps_no_readers_out,
                a_writers_release_wakes_every_waiting_reader,
                a_reader_kept_out_by_a_waiting_writer_hears_its_release,
                fair_waiters_are_served_in_arrival_order,
                a_fair_waiter_that_gives_up_gives_its_place_to_the_next_at_once,
                nested_kinds_reenter_or_are_refused,
                shutdown_cancels_work_releases_leases_and_refuses_later_calls,
                inspect_shows_holders_time_left_fencing_and_waiters,
                list_shows_every_lock_under_a_prefix_once,
                force_release_wakes_the_waiter_and_the_holder_loses,
                force_release_keeps_the_fair_queue_in_order,
                lost_says_the_key_was_gone_when_it_was_removed,
                a_forced_release_reaches_its_holder_at_once_whatever_its_ttl,
                watch_reports_every_holder_and_release,
                watch_sees_holds_shorter_than_its_poll,
                a_hold_keeps_the_key_after_the_work_until_it_has_passed,
                a_hold_is_kept_after_an_error_a_panic_and_a_drop,
                waiters_take_the_key_once_the_hold_has_passed,
                a_hold_passed_or_nested_releases_as_usual,
                a_shared_holders_hold_keeps_its_place,
                a_waiter_elsewhere_wakes_at_the_holds_end_not_the_leases,
                a_shared_holders_short_hold_frees_the_key_at_its_end,
                waiters_are_the_callers_waiting_never_a_watch,
                a_key_that_holds_no_lock_is_never_written,
                inspect_says_who_holds_a_lock_and_since_when,
                a_busy_client_cannot_keep_a_key_to_itself,
            );
        }
    };
    (@tests $start:expr, $runtime:tt, $module:ident; $($behaviour:ident),* $(,)?) => {
        $(
            #[tokio::test $runtime]
            async fn $behaviour() {
                let deployment = $start;
                $module::$behaviour(&deployment).await;
            }
        )*
    };
}

conformance!(
    single,
    testkit::SingleRedis::start(),
    flavor = "multi_thread",
    worker_threads = 2
);
conformance!(
    sentinel,
    testkit::Sentinel::start(),
    flavor = "multi_thread",
    worker_threads = 2
);
conformance!(
    cluster,
    testkit::Cluster::start(),
    flavor = "multi_thread",
    worker_threads = 2
);
conformance!(
    redlock,
    testkit::Redlock::start(3),
    flavor = "multi_thread",
    worker_threads = 2
);
// Under paused time: the in-memory deployment follows tokio's clock, so leases of seconds pass in
// no time at all, and the suite's timings hold exactly.
conformance!(memory, testkit::InMemory::start(), start_paused = true);
