//! The crate's layering (issue 26): every module of `src/lib.rs` sits in one layer of
//! [`LAYERS`], and a module imports only from its own layer and lower ones, never a higher one;
//! within a layer no modules import each other in a circle. The book's source layout page
//! (docs/src/reference/layout.md) lists the same layers, and the test checks that too, so the
//! table lives here and nowhere else.
//!
//! A module's imports are the `crate::` paths in its files (`use` lines, `use crate::{a, b}`
//! groups and paths written in code), read with comments, doc text, strings and character
//! literals blanked out. `crate::name!` is a macro exported at the crate root, not a module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. `cli` is the binary (`src/main.rs`, `src/cli/`), above everything.
const LAYERS: &[&[&str]] = &[
    &["sharding", "host", "files", "input", "net"],
    &["ir", "config"],
    &["tensor", "autodiff", "lower", "pjrt"],
    &["model", "train_state", "runtime", "storage", "output", "data", "cluster"],
    &["checkpoint"],
    &["train", "inference"],
    &["aot", "submit", "cli"],
];

/// The binary: its `crate::` is not the library's, and nothing sits above it.
const BINARY: &str = "cli";

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// `text` with comments, string, byte-string and character literals replaced by spaces (line
/// breaks kept, so positions keep their line numbers).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, piece: &[char]| {
        out.extend(piece.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        // `r"`, `b"` and `br"` open literals only at the start of a token (`for"` is no raw string).
        let token_start = i == 0 || !is_ident(chars[i - 1]);
        let starts = |s: &str| rest.iter().take(s.chars().count()).copied().eq(s.chars());
        let end = if starts("//") {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if starts("/*") {
            // Block comments nest.
            let (mut depth, mut j) = (0, 0);
            while j < rest.len() {
                if rest[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if let Some(len) = raw_string_len(rest).filter(|_| token_start) {
            len
        } else if rest[0] == '"' || (token_start && starts("b\"")) {
            let mut j = if rest[0] == '"' { 1 } else { 2 };
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            // An escaped character literal: '\n', '\'', '\u{..}' (the escaped character may be a quote).
            3 + rest[3..].iter().position(|&c| c == '\'').map_or(rest.len(), |p| p + 1)
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            3 // 'x' (a lifetime `'a` has no closing quote)
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        let end = end.min(rest.len());
        blank(&mut out, &rest[..end]);
        i += end;
    }
    out
}

/// The length of a raw (byte) string literal at the start of `s` (`r"..."`, `br#"..."#`).
fn raw_string_len(s: &[char]) -> Option<usize> {
    let start = match s {
        ['r', '"' | '#', ..] => 1,
        ['b', 'r', '"' | '#', ..] => 2,
        _ => return None,
    };
    let hashes = s[start..].iter().take_while(|&&c| c == '#').count();
    if s.get(start + hashes) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
    let body = start + hashes + 1;
    let end = (body..s.len()).find(|&j| s[j..].starts_with(&close)).map_or(s.len(), |j| j + close.len());
    Some(end)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The top-level modules `code` names after `crate::`, with the line of each: `crate::a::b`
/// gives `a`, `crate::{a::x, b}` gives `a` and `b`, `crate::name!` nothing (a macro).
fn crate_references(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::").map(|p| p + from) {
        from = at + "crate::".len();
        // `$crate::` (in macros) is the crate too; `mycrate::` is not.
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[from..];
        if rest.starts_with('{') {
            let (mut depth, mut item_start) = (0, true);
            let mut chars = rest.char_indices().peekable();
            while let Some((i, c)) = chars.next() {
                match c {
                    '{' => {
                        depth += 1;
                        item_start = depth == 1;
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && is_ident(c) => {
                        let name: String = rest[i..].chars().take_while(|&c| is_ident(c)).collect();
                        for _ in 1..name.chars().count() {
                            chars.next();
                        }
                        if name != "self" {
                            found.push((line + rest[..i].matches('\n').count(), name));
                        }
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() && !rest[name.len()..].starts_with('!') {
                found.push((line, name));
            }
        }
    }
    found
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The modules `src/lib.rs` declares.
fn library_modules(src: &Path) -> BTreeSet<String> {
    let lib = code_only(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|l| l.trim_end_matches(';').trim().to_string())
        .collect()
}

/// An import of module `to` by module `from`, at `file:line`.
struct Import {
    from: String,
    to: String,
    at: String,
}

/// Every import of one library module by another.
fn imports(src: &Path) -> Vec<Import> {
    let modules = library_modules(src);
    let mut found = Vec::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_str().unwrap();
        let module = first.trim_end_matches(".rs");
        if module == "lib" || module == "main" || module == BINARY {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        for (line, to) in crate_references(&code) {
            if to != module && modules.contains(&to) {
                let at = format!("src/{}:{line}", relative.display());
                found.push(Import { from: module.to_string(), to, at });
            }
        }
    }
    found
}

#[test]
fn every_module_is_in_one_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = library_modules(&src);
    let mut problems = Vec::new();
    for module in &modules {
        if layer_of(module).is_none() {
            problems.push(format!("src/lib.rs declares `{module}`, which is in no layer of tests/layers.rs's LAYERS"));
        }
    }
    let listed: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    for (i, name) in listed.iter().enumerate() {
        if listed[..i].contains(name) {
            problems.push(format!("LAYERS lists `{name}` twice"));
        }
        if *name != BINARY && !modules.contains(*name) {
            problems.push(format!("LAYERS lists `{name}`, which src/lib.rs does not declare"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_module_imports_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let all = imports(&src);
    assert!(all.iter().any(|i| i.from == "train" && i.to == "model"), "the scan finds imports");
    let mut problems = Vec::new();
    for import in &all {
        let (Some(from), Some(to)) = (layer_of(&import.from), layer_of(&import.to)) else { continue };
        if to > from {
            problems.push(format!(
                "{}: {} (L{from}) imports {} (L{to}), a higher layer",
                import.at, import.from, import.to
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let all = imports(&src);
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for import in &all {
        edges.entry(&import.from).or_default().insert(&import.to);
    }
    // A path from `start` back to `goal`, if the imports have one.
    let path_back = |start: &str, goal: &str| -> Option<Vec<String>> {
        let mut paths = vec![vec![start.to_string()]];
        let mut seen = BTreeSet::from([start.to_string()]);
        while !paths.is_empty() {
            let mut next = Vec::new();
            for path in paths {
                for &to in edges.get(path.last().unwrap().as_str()).into_iter().flatten() {
                    let mut longer = path.clone();
                    longer.push(to.to_string());
                    if to == goal {
                        return Some(longer);
                    }
                    if seen.insert(to.to_string()) {
                        next.push(longer);
                    }
                }
            }
            paths = next;
        }
        None
    };
    let mut problems = Vec::new();
    let mut reported = BTreeSet::new();
    for import in &all {
        if !reported.insert((import.from.clone(), import.to.clone())) {
            continue;
        }
        if let Some(back) = path_back(&import.to, &import.from) {
            problems.push(format!(
                "{}: {} imports {}, and {} imports it back ({})",
                import.at,
                import.from,
                import.to,
                import.to,
                back.join(" -> ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The modules of each layer line (`- **L0 ...**: **`sharding`** ...`) of the book's source layout
/// page, in order: its modules are the bold code spans.
fn listed_layers(page: &str) -> Vec<Vec<String>> {
    page.lines()
        .filter(|l| l.starts_with("- **L"))
        .map(|l| l.split("**`").skip(1).map(|s| s.split("`**").next().unwrap().to_string()).collect())
        .collect()
}

#[test]
fn the_book_lists_the_layers() {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/reference/layout.md");
    let page = std::fs::read_to_string(page).unwrap();
    let expected: Vec<Vec<String>> = LAYERS.iter().map(|layer| layer.iter().map(|m| m.to_string()).collect()).collect();
    assert_eq!(listed_layers(&page), expected, "docs/src/reference/layout.md must list tests/layers.rs's LAYERS");
}

#[test]
fn the_scan_reads_groups_and_skips_comments_and_strings() {
    let code = code_only(
        "use crate::{config::{self, Config}, pjrt};\n\
         // crate::train in a comment\n\
         /* crate::aot /* nested */ crate::cli */\n\
         let s = \"crate::submit\"; let r = r#\"crate::cluster\"#; let q = '\"';\n\
         let c = '\\''; let b = b\"crate::data\"; let e = br#\"crate::checkpoint\"#;\n\
         let x = crate::model::Model::new(); crate::pjrt_call!(p);\n\
         let l: &'static str = mycrate::other;",
    );
    let names: Vec<(usize, String)> = crate_references(&code);
    let expected = [(1, "config"), (1, "pjrt"), (6, "model")];
    assert_eq!(names, expected.map(|(l, n)| (l, n.to_string())));
}
