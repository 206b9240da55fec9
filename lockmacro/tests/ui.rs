//! Compile-time behaviour of `#[redis_lock]`: what it accepts (`ui/pass`) and, for what it
//! refuses, the exact message and where it points (`ui/fail/*.stderr`).
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
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
