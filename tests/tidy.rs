//! Checks of the source tree's shape that live in `cargo test` so they cannot be forgotten (in the spirit of
//! rust-analyzer's `tidy.rs`): imports run one way through the layers `src/lib.rs` declares, the sans-I/O core
//! names no I/O crate, and every module says what it owns.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules in the order `lib.rs` declares them: the lowest layer first.
fn layers() -> Vec<String> {
    declared(&src().join("lib.rs"))
}

/// The modules `file` declares with `pub mod`, in order.
fn declared(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("a module file");
    text.lines()
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
fn no_room_of_the_edge_imports_a_room_above_it() {
    let rooms = declared(&src().join("proxy").join("mod.rs"));
    assert!(
        rooms.len() > 4,
        "proxy/mod.rs declares its rooms with `pub mod`: {rooms:?}"
    );
    let mut upward = Vec::new();
    for (i, room) in rooms.iter().enumerate() {
        for file in rust_files(&src().join("proxy").join(room)) {
            let code = code_only(&std::fs::read_to_string(&file).expect("read"));
            for above in rooms.iter().skip(i + 1) {
                if code.contains(&format!("crate::proxy::{above}::")) {
                    upward.push(format!("{} ({room}) imports {above}", file.display()));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "the edge's rooms run one way ({}):\n{}",
        rooms.join(" < "),
        upward.join("\n")
    );
}

#[test]
fn the_core_names_no_io_crate() {
    let layers = layers();
    // The core ends with the frontends' encoders, above the translator's facade.
    let facade = layers.iter().position(|l| l == "frontend").expect("a frontend layer");
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

/// A source file's module path: `src/lib.rs` is `[]`, `src/a/mod.rs` and `src/a.rs` are `[a]`, `src/a/b.rs` is
/// `[a, b]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
        parts.pop();
    }
    parts
}

/// The code of `text` without comments and string literals, so neither is read as a path.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for n in chars.by_ref() {
                    match n {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
                out.push_str("\"\"");
            }
            // A char literal `'"'` would open a string above; lifetimes (`'a`) pass through.
            '\'' if chars.clone().nth(1) == Some('\'') => {
                chars.nth(1);
                out.push_str("' '");
            }
            '\'' if chars.peek() == Some(&'\\') => {
                for n in chars.by_ref() {
                    if n == '\'' {
                        break;
                    }
                }
                out.push_str("' '");
            }
            _ => out.push(c),
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Expands the paths a `use` tree or an expression names, from `at` (just after `word::`): `a::b`, `{a, b::c}`.
fn path_tails(code: &str) -> Vec<Vec<String>> {
    let code = code.trim_start();
    if let Some(group) = code.strip_prefix('{') {
        let mut depth = 0;
        let mut end = group.len();
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let inner = &group[..end];
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&inner[start..]);
        return parts.into_iter().flat_map(path_tails).collect();
    }
    let name: String = code.chars().take_while(|c| is_ident(*c)).collect();
    if name.is_empty() {
        return vec![Vec::new()];
    }
    let rest = &code[name.len()..];
    match rest.trim_start().strip_prefix("::") {
        Some(more) => path_tails(more)
            .into_iter()
            .map(|mut t| {
                t.insert(0, name.clone());
                t
            })
            .collect(),
        None => vec![vec![name]],
    }
}

/// The file that module path `path` (relative to the crate) lives in: the deepest module on it that has a file.
fn file_of(files: &std::collections::BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Option<PathBuf> {
    (0..=path.len()).rev().find_map(|n| files.get(&path[..n]).cloned())
}

/// The files each file of the crate refers to: through `crate::`, `super::`, `self::` and its own child modules.
/// An inline module (`mod tests { … }`) is part of its file.
fn file_imports() -> std::collections::BTreeMap<PathBuf, std::collections::BTreeSet<PathBuf>> {
    let all: Vec<PathBuf> = rust_files(&src())
        .into_iter()
        .filter(|f| !f.ends_with("main.rs"))
        .collect();
    let files: std::collections::BTreeMap<Vec<String>, PathBuf> =
        all.iter().map(|f| (module_path(f), f.clone())).collect();
    let mut graph = std::collections::BTreeMap::new();
    for file in &all {
        let here = module_path(file);
        let code = code_only(&std::fs::read_to_string(file).expect("read"));
        let children: Vec<String> = files
            .keys()
            .filter(|p| p.len() == here.len() + 1 && p.starts_with(&here))
            .map(|p| p[here.len()].clone())
            .collect();
        let mut targets = std::collections::BTreeSet::new();
        // Inline modules open at a brace depth; `super::` inside one first leaves them.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i] as char;
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
            let starts_word = is_ident(c) && (i == 0 || !is_ident(bytes[i - 1] as char) && bytes[i - 1] != b':');
            if !starts_word {
                i += 1;
                continue;
            }
            let word: String = code[i..].chars().take_while(|c| is_ident(*c)).collect();
            let after = &code[i + word.len()..];
            if word == "mod" {
                let name: String = after.trim_start().chars().take_while(|c| is_ident(*c)).collect();
                let rest = after.trim_start()[name.len()..].trim_start();
                if rest.starts_with('{') {
                    inline.push((name, depth));
                }
            }
            if let Some(tail) = after.strip_prefix("::") {
                let scope: Vec<String> = here
                    .iter()
                    .cloned()
                    .chain(inline.iter().map(|(n, _)| n.clone()))
                    .collect();
                for t in path_tails(tail) {
                    let mut base: Vec<String> = match word.as_str() {
                        "crate" => Vec::new(),
                        "self" => scope.clone(),
                        "super" => scope[..scope.len().saturating_sub(1)].to_vec(),
                        w if inline.is_empty() && children.iter().any(|c| c == w) => {
                            let mut p = here.clone();
                            p.push(w.to_owned());
                            p
                        }
                        _ => continue,
                    };
                    let mut t = t.as_slice();
                    while word == "super" && t.first().is_some_and(|s| s == "super") {
                        base.pop();
                        t = &t[1..];
                    }
                    let full: Vec<String> = base.into_iter().chain(t.iter().cloned()).collect();
                    if let Some(target) = file_of(&files, &full) {
                        if &target != file {
                            targets.insert(target);
                        }
                    }
                }
            }
            i += word.len().max(1);
        }
        graph.insert(file.clone(), targets);
    }
    graph
}

/// The circles of `graph` (Tarjan's strongly connected components of more than one file).
fn circles(graph: &std::collections::BTreeMap<PathBuf, std::collections::BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'g> {
        graph: &'g std::collections::BTreeMap<PathBuf, std::collections::BTreeSet<PathBuf>>,
        index: std::collections::HashMap<&'g PathBuf, (usize, usize)>,
        stack: Vec<&'g PathBuf>,
        on_stack: std::collections::HashSet<&'g PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g PathBuf) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.index[w].1.min(self.index[v].1);
                    self.index.get_mut(v).expect("visited").1 = low;
                } else if self.on_stack.contains(w) {
                    let low = self.index[w].0.min(self.index[v].1);
                    self.index.get_mut(v).expect("visited").1 = low;
                }
            }
            if self.index[v].0 == self.index[v].1 {
                let mut part = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    part.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: Default::default(),
        stack: Vec::new(),
        on_stack: Default::default(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn no_import_circle_between_files() {
    let graph = file_imports();
    let shown = |f: &PathBuf| f.strip_prefix(src()).unwrap_or(f).display().to_string();
    let found: Vec<String> = circles(&graph)
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|f| {
                    graph[f]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(move |t| format!("  {} -> {}", shown(f), shown(t)))
                })
                .collect();
            format!("{} files:\n{}", c.len(), edges.join("\n"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "files import each other in a circle (the type both need belongs in a file below both):\n{}",
        found.join("\n")
    );
}

#[test]
fn file_imports_are_read_in_every_form() {
    let tails = path_tails("{a, b::{c, d::E}, f}");
    assert_eq!(
        tails,
        [vec!["a"], vec!["b", "c"], vec!["b", "d", "E"], vec!["f"]]
            .map(|v| v.into_iter().map(String::from).collect::<Vec<_>>())
    );
    assert_eq!(
        code_only("let s = \"crate::x\"; // super::y\nlet c = '\"';"),
        "let s = \"\"; \nlet c = ' ';"
    );
    // The graph of this crate's own files sees `legacy/escape.rs` under `legacy/`.
    let graph = file_imports();
    let lib_sees = &graph[&src().join("translate").join("mod.rs")];
    assert!(lib_sees.iter().any(|f| f.ends_with("legacy/mod.rs")), "{lib_sees:?}");
}
