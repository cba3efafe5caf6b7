//! Test support for Redline: finds the external tools some tests check
//! against and runs them.
//!
//! - [`tools`]: where each tool is looked for, and what a test does when one is
//!   missing (skips with a note, or fails under `REDLINE_REQUIRE_TOOLS=1`);
//! - [`tensorboard`]: reads a log directory with TensorBoard's own
//!   `EventAccumulator`, so event files are checked against the real consumer;
//! - [`fuzz`]: a mutation fuzzer over a corpus of seed files, run for a time
//!   budget inside `cargo test`;
//! - [`chromium`]: opens a page in headless Chromium, reads what its on-load
//!   script reported, collects console output and takes a screenshot.
//!
//! `scripts/setup-test-tools.sh` installs both tools. This crate is a
//! dev-dependency only and is never published.

// Test support, not library code: when `REDLINE_REQUIRE_TOOLS=1` a missing
// tool must fail the calling test, and a panic is how a test fails.
#![allow(clippy::panic)]

pub mod chromium;
pub mod fuzz;
pub mod tensorboard;
pub mod tools;

pub use chromium::{check_page, PageCheck};
pub use tensorboard::{event_accumulator, Scalar};
