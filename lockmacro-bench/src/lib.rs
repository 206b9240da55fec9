//! Holds the benchmark only: see `benches/lock_bench`.
