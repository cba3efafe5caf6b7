//! `threads::configure` makes its calling thread the first of rayon's global
//! pool (in a test binary of its own: the global pool is built once a
//! process).

use rayon::prelude::*;

#[test]
fn the_configuring_thread_runs_in_the_pool_and_other_threads_still_get_work_done() {
    assert_eq!(redline_core::threads::configure(Some(2)), 2);
    // A fork from this thread is a fork inside the pool: no hand-off.
    assert_eq!(rayon::current_thread_index(), Some(0));
    assert_eq!(rayon::current_num_threads(), 2);
    assert_eq!(rayon::join(|| 1, || 2), (1, 2));
    let sum: u64 = (0..100_000u64).into_par_iter().sum();
    assert_eq!(sum, 4_999_950_000);
    // Work submitted from a thread outside the pool is done by the other
    // pool thread (this one does not run the pool's stealing loop while it
    // waits here).
    let outside = std::thread::spawn(|| (0..1000u64).into_par_iter().sum::<u64>());
    assert_eq!(outside.join().ok(), Some(499_500));
}
