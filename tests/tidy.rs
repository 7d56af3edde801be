//! Checks of the source tree's shape that live in `cargo test` so they cannot be forgotten (in the spirit of
//! rust-analyzer's `tidy.rs`): imports run one way through the layers `src/lib.rs` declares, the sans-I/O core
//! names no I/O crate, and every module says what it owns.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules in the order `lib.rs` declares them: the lowest layer first.
fn layers() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').trim().to_owned())
        .collect()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The files of top-level module `m`: `src/m.rs` or everything under `src/m/`.
fn module_files(m: &str) -> Vec<PathBuf> {
    let dir = src().join(m);
    if dir.is_dir() {
        rust_files(&dir)
    } else {
        vec![src().join(format!("{m}.rs"))]
    }
}

/// The top-level modules `text` refers to through `crate::`: `crate::x::…`, `crate::x` and `crate::{x, y::…}`.
fn crate_refs(text: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let code = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    refs.push(name);
                }
            }
        } else {
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                refs.push(name);
            }
        }
        rest = after;
    }
    refs
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let layers = layers();
    assert!(
        layers.len() > 5,
        "lib.rs declares the layers with `pub mod`: {layers:?}"
    );
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut upward = Vec::new();
    for (i, m) in layers.iter().enumerate() {
        for file in module_files(m) {
            let text = std::fs::read_to_string(&file).expect("read");
            for r in crate_refs(&text) {
                match rank(&r) {
                    Some(j) if j > i => upward.push(format!("{} ({m}) imports {r}", file.display())),
                    _ => {}
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports must run down the layers of src/lib.rs ({}):\n{}",
        layers.join(" < "),
        upward.join("\n")
    );
}

#[test]
fn the_core_names_no_io_crate() {
    let layers = layers();
    let facade = layers.iter().position(|l| l == "translate").expect("a translate layer");
    let mut found = Vec::new();
    for m in &layers[..=facade] {
        for file in module_files(m) {
            let text = std::fs::read_to_string(&file).expect("read");
            for krate in ["tokio", "hyper", "http_body", "prometheus", "tracing"] {
                if text.contains(&format!("{krate}::")) {
                    found.push(format!("{} uses {krate}", file.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the sans-I/O core uses I/O crates:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_module_says_what_it_owns() {
    let undocumented: Vec<String> = rust_files(&src())
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            let tests_only = f.file_name().is_some_and(|n| n == "tests.rs");
            !tests_only && !text.trim_start().starts_with("//!")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "modules without a `//!` doc:\n{}",
        undocumented.join("\n")
    );
}

#[test]
fn crate_references_are_read_in_every_form() {
    let refs = crate_refs("use crate::a::B;\nuse crate::{b, c::D};\nlet x = crate::d::f();\n// crate::commented");
    assert_eq!(refs, ["a", "b", "c", "d"]);
}
