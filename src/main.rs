//! The `sse-gateway` binary: see `cli` for the commands.
// The library forbids `unsafe`; the binary has one call that needs it, the allocator setting below.
#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    one_malloc_arena();
    sse_gateway::cli::main()
}

/// Has glibc's malloc serve every thread from its one main arena (`M_ARENA_MAX` = 1), unless the operator chose
/// otherwise with `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES=glibc.malloc.arena_max=…`.
///
/// Why: glibc gives each thread that allocates an arena of its own, and grows such an arena a page at a time,
/// each page one `mprotect` call. Held events (resumption) grow the heap for as long as streams fill their
/// buffers: 9,000 `mprotect` calls in a 4 s paced phase, a tenth of the CPU per event that resumption costs
/// (BENCHMARKS.md, eleventh session). The main arena grows by `brk`, 128 KiB at a time. Small blocks come from
/// each thread's cache (tcache) either way, so the arena's lock is seldom taken; saturation throughput did not
/// drop.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn one_malloc_arena() {
    let tuned = std::env::var_os("GLIBC_TUNABLES")
        .is_some_and(|t| t.to_string_lossy().contains("glibc.malloc.arena_max"));
    if tuned || std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: `mallopt` only sets a parameter of the allocator; this runs first in `main`, before any other
    // thread exists. A refusal (0) leaves glibc's default, which is correct, only slower.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn one_malloc_arena() {}
