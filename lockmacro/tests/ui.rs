//! Compile-time behaviour of `#[redis_lock]`: for what it refuses, the exact message and where
//! it points (`ui/fail/*.stderr`). What it accepts (`ui/pass`) builds as test targets of their
//! own (`accepts_*` in Cargo.toml), so that trybuild only checks: its dependencies are checked,
//! not built, and every case goes in one cargo run.
//!
//! Compiler output drifts between releases, so this runs on the toolchain the `.stderr` files
//! were written with. Regenerate with `TRYBUILD=overwrite cargo test -p lockmacro --test ui`, then review.

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "ui .stderr files are written for rustc 1.95"
)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
