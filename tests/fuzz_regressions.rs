//! Replays the inputs saved from fuzzing (`fuzz/regressions/translate/`) through the fuzz target's own
//! checks (`fuzz/check.rs`): each file is a fuzz input that once crashed the target, named after what it
//! pins. Every file must pass; a new crash is added here before the core is fixed. To triage fresh crashes:
//! `FUZZ_REGRESSIONS_DIR=fuzz/artifacts/translate cargo test --test fuzz_regressions` (the panic hook
//! prints each panic's location).

#[path = "../fuzz/check.rs"]
mod check;

use std::path::Path;

#[test]
fn saved_fuzz_inputs_pass_the_fuzz_target_checks() {
    // FUZZ_REGRESSIONS_DIR points elsewhere to triage a batch of fresh crashes (fuzz/artifacts/translate).
    let dir = match std::env::var_os("FUZZ_REGRESSIONS_DIR") {
        Some(d) => Path::new(&d).to_path_buf(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/translate"),
    };
    // A missing or empty directory would make this pass without checking anything.
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no saved fuzz inputs in {}", dir.display());
    let mut failed = Vec::new();
    for path in &paths {
        let data = std::fs::read(path).expect("readable regression input");
        if let Err(e) = std::panic::catch_unwind(|| check::check(&data)) {
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
