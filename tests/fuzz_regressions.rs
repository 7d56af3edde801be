//! Replays inputs saved from fuzzing through the fuzz targets' own checks, so the invariants hold in a plain
//! `cargo test` even without cargo-fuzz:
//!
//! - `translate` (`fuzz/check.rs`): every file of `fuzz/regressions/translate/`, each an input that once crashed
//!   the target, named after what it pins, and the committed seeds of `fuzz/corpus/translate/`;
//! - `edge` (`fuzz/check_edge.rs`): the committed seeds of `fuzz/corpus/edge/` and any `fuzz/regressions/edge/`.
//!
//! Every file must pass; a new crash is added here before the code is fixed. To triage fresh crashes:
//! `FUZZ_REGRESSIONS_DIR=fuzz/artifacts/translate cargo test --test fuzz_regressions` (the panic hook
//! prints each panic's location); `FUZZ_EDGE_DIR` does the same for the edge target.

#[path = "../fuzz/check.rs"]
mod check;
#[path = "../fuzz/check_edge.rs"]
mod check_edge;

use std::path::{Path, PathBuf};

use sse_gateway::translate::Dialect;

#[test]
fn saved_fuzz_inputs_pass_the_fuzz_target_checks() {
    // FUZZ_REGRESSIONS_DIR points elsewhere to triage a batch of fresh crashes (fuzz/artifacts/translate).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = match std::env::var_os("FUZZ_REGRESSIONS_DIR") {
        Some(d) => vec![Path::new(&d).to_path_buf()],
        None => vec![
            root.join("fuzz/corpus/translate"),
            root.join("fuzz/regressions/translate"),
        ],
    };
    replay(&dirs, check::check);
}

#[test]
fn dialect_seeds_run_under_the_dialect_they_name() {
    // fuzz/seed_dialects.py names each seed after its fixture, with the dialect first when it is not the
    // fixture's own (`auto_`, `cogency_other_`, `agent_sdk_other_`) and a setting before that.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/translate");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("the translate corpus") {
        let path = entry.expect("a corpus entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let named = name
            .trim_start_matches("budget256_")
            .trim_start_matches("require_done_");
        let want = if named.starts_with("auto_") {
            Dialect::Auto
        } else if named.starts_with("cogency") {
            Dialect::Cogency
        } else if named.starts_with("agent_sdk_") {
            Dialect::AgentSdk
        } else {
            continue;
        };
        let data = std::fs::read(&path).expect("readable seed");
        let header = data.first_chunk::<{ check::HEADER }>().expect("a seed holds a header");
        assert_eq!(check::options(header).0.dialect, want, "{name}");
        seen += 1;
    }
    assert!(seen > 0, "no dialect seeds in {}", dir.display());
}

#[test]
fn edge_seeds_and_saved_inputs_pass_the_edge_target_checks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = match std::env::var_os("FUZZ_EDGE_DIR") {
        Some(d) => vec![Path::new(&d).to_path_buf()],
        None => vec![root.join("fuzz/corpus/edge"), root.join("fuzz/regressions/edge")],
    };
    replay(&dirs, check_edge::check);
}

/// Runs `check` on every file of `dirs` (missing directories skipped, but not all of them: that would pass
/// without checking anything) and reports every failure at once.
fn replay(dirs: &[PathBuf], check: fn(&[u8])) {
    let mut paths: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no saved fuzz inputs in {dirs:?}");
    let mut failed = Vec::new();
    for path in &paths {
        let data = std::fs::read(path).expect("readable regression input");
        if let Err(e) = std::panic::catch_unwind(|| check(&data)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!(
                "{}: {}",
                path.display(),
                msg.lines().next().unwrap_or_default()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} saved fuzz inputs fail:\n{}",
        failed.len(),
        paths.len(),
        failed.join("\n")
    );
}
