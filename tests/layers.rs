//! The crate's layering (issue 26): every module of `src/lib.rs` sits in one layer of
//! [`LAYERS`], and a module imports only from its own layer and lower ones, never a higher one;
//! within a layer no modules import each other in a circle. The book's source layout page
//! (docs/src/reference/layout.md) lists the same layers, and the test checks that too, so the
//! table lives here and nowhere else.
//!
//! A module's imports are the `crate::` paths in its files (`use` lines, `use crate::{a, b}`
//! groups and paths written in code), read with comments, doc text, strings and character
//! literals blanked out. `crate::name!` is a macro exported at the crate root, not a module.
//!
//! Inside a module the same holds for its files (issue 45): no two submodules of `model/` (or
//! of any other module, but the cycles `KNOWN_CYCLES` lists, which may only shrink) import each
//! other in a circle, through `crate::m::x`, `super::x` paths or the items `m/mod.rs` re-exports.

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
    let paths = relative_paths(code).into_iter();
    paths
        .filter(|(_, path)| path.len() > 1 && path[0] == "crate" && path[1] != "self")
        .map(|(l, p)| (l, p[1].clone()))
        .collect()
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

/// For each import that closes a circle (`from` imports `to`, which leads back to `from`): the
/// import, and the circle.
fn circles(all: &[Import]) -> Vec<(&Import, Vec<String>)> {
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for import in all {
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
    let mut found = Vec::new();
    let mut reported = BTreeSet::new();
    for import in all {
        if !reported.insert((import.from.clone(), import.to.clone())) {
            continue;
        }
        if let Some(back) = path_back(&import.to, &import.from) {
            found.push((import, back));
        }
    }
    found
}

#[test]
fn no_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let all = imports(&src);
    let problems: Vec<String> = circles(&all)
        .into_iter()
        .map(|(import, back)| {
            format!(
                "{}: {} imports {}, and {} imports it back ({})",
                import.at,
                import.from,
                import.to,
                import.to,
                back.join(" -> ")
            )
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Circles of submodules not broken yet, each a module and the submodules in its circle. A
/// circle broken must leave this list (the test says so); none may be added. Two are types that
/// contain each other, which a circle states truthfully: a primitive's body is a graph of
/// primitives (`ir`), a mesh splits an array by a partition spec naming the mesh's axes
/// (`sharding`).
const KNOWN_CYCLES: &[(&str, &[&str])] = &[
    ("config", &["choices", "keys", "ranges", "registry"]),
    ("config", &["docs", "maxtext_keys", "value"]),
    ("data", &["chat", "documents", "error", "formats", "hub", "storage", "tokenizer"]),
    ("ir", &["graph", "prim"]),
    ("pjrt", &["buffer", "client", "compile_cache", "executable"]),
    ("sharding", &["mesh", "spec"]),
];

/// The paths in `code` that start at `crate::` (or a macro's `$crate::`), `super::` or
/// `self::`, as their segments (`super::{a::x, b}` gives `[super, a]` and `[super, b]`: a
/// group's items by their first name; `crate::name!` gives `[crate]`: a macro is no item), with
/// the line of each.
fn relative_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let chars: Vec<char> = code.chars().collect();
    let ident_at = |i: usize| -> String { chars[i..].iter().take_while(|&&c| is_ident(c)).collect() };
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        // `$crate::` (in macros) is the crate too; `mycrate::` and `a::super_x` are not paths.
        let path_start = (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'))
            && ["crate", "super", "self"].contains(&ident_at(i).as_str());
        if !path_start {
            i += 1;
            continue;
        }
        let line = chars[..i].iter().filter(|&&c| c == '\n').count() + 1;
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let name = ident_at(j);
            j += name.chars().count();
            segments.push(name);
            if !(chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':')) {
                // `path::name!`: a macro, not an item of the path.
                if chars.get(j) == Some(&'!') {
                    segments.pop();
                }
                found.push((line, segments));
                break;
            }
            j += 2;
            if chars.get(j) != Some(&'{') {
                continue;
            }
            // A group: the first name of each item at depth 1.
            let (mut depth, mut item_start) = (0, true);
            while j < chars.len() {
                match chars[j] {
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
                        let name = ident_at(j);
                        let mut path = segments.clone();
                        j += name.chars().count() - 1;
                        path.push(name);
                        found.push((line, path));
                        item_start = false;
                    }
                    _ => {}
                }
                j += 1;
            }
            break;
        }
        i = j.max(i + 1);
    }
    found
}

/// Every import of one submodule of `module` (a folder `src/<module>/`) by another: the paths
/// of its files' code outside their tests (`#[cfg(test)]` on), resolved from the file's place,
/// an item `mod.rs` re-exports (`pub use x::{A, B}`) counting as its submodule `x`.
fn submodule_imports(src: &Path, module: &str) -> Vec<Import> {
    let dir = src.join(module);
    if !dir.is_dir() {
        return vec![];
    }
    let is_submodule = |name: &str| dir.join(format!("{name}.rs")).is_file() || dir.join(name).is_dir();
    let facade = code_only(&std::fs::read_to_string(dir.join("mod.rs")).unwrap_or_default());
    let mut reexported: BTreeMap<String, String> = BTreeMap::new();
    for (_, path) in relative_paths(&facade.replace("pub use ", "pub use self::")) {
        if let [first, sub, item, ..] = path.as_slice() {
            if first == "self" && is_submodule(sub) {
                reexported.insert(item.clone(), sub.clone());
            }
        }
    }
    let mut found = Vec::new();
    for file in rust_files(&dir) {
        let relative = file.strip_prefix(src).unwrap();
        let mut place: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_str().unwrap().trim_end_matches(".rs").to_string())
            .collect();
        if place.last().is_some_and(|l| l == "mod") {
            place.pop();
        }
        let Some(from) = place.get(1).cloned() else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        let code = code_only(&text);
        let code = &code[..code.find("#[cfg(test)]").unwrap_or(code.len())];
        for (line, path) in relative_paths(code) {
            let Some(first) = path.first() else { continue };
            let absolute: Vec<String> = match first.as_str() {
                "crate" => path[1..].to_vec(),
                "self" => place.iter().chain(&path[1..]).cloned().collect(),
                _ => {
                    let ups = path.iter().take_while(|s| *s == "super").count();
                    let base = &place[..place.len().saturating_sub(ups)];
                    base.iter().chain(&path[ups..]).cloned().collect()
                }
            };
            let [top, name, ..] = absolute.as_slice() else { continue };
            if top != module {
                continue;
            }
            let to = match is_submodule(name) {
                true => name.clone(),
                false => match reexported.get(name) {
                    Some(sub) => sub.clone(),
                    None => continue,
                },
            };
            if to != from {
                found.push(Import { from: from.clone(), to, at: format!("src/{}:{line}", relative.display()) });
            }
        }
    }
    found
}

#[test]
fn no_submodules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let model = submodule_imports(&src, "model");
    assert!(model.iter().any(|i| i.from == "llama" && i.to == "family"), "the scan finds super:: imports");
    assert!(model.iter().any(|i| i.from == "decoder" && i.to == "config"), "and mod.rs's re-exports");
    let known = |module: &str, a: &str, b: &str| {
        KNOWN_CYCLES.iter().any(|(m, subs)| *m == module && subs.contains(&a) && subs.contains(&b))
    };
    let mut problems = Vec::new();
    let mut still_known = BTreeSet::new();
    for module in library_modules(&src) {
        let all = submodule_imports(&src, &module);
        for (import, back) in circles(&all) {
            if known(&module, &import.from, &import.to) {
                still_known.insert((module.clone(), import.from.clone()));
                continue;
            }
            problems.push(format!(
                "{}: {module}::{} imports {module}::{}, which leads back ({})",
                import.at,
                import.from,
                import.to,
                back.join(" -> ")
            ));
        }
    }
    for (module, subs) in KNOWN_CYCLES {
        if subs.iter().any(|s| !still_known.contains(&(module.to_string(), s.to_string()))) {
            problems.push(format!(
                "KNOWN_CYCLES lists {module}::{{{}}}, which are no longer (all) in a circle: list what is left",
                subs.join(", ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn relative_paths_read_groups_and_climbs() {
    let code = code_only(
        "use super::attention::{rope, LayerContext};\n\
         use super::{blocks, family::Family};\n\
         let x = super::super::model::Model::new(); use crate::ir::DType; let y = a::super_thing;",
    );
    let paths: Vec<(usize, String)> = relative_paths(&code).into_iter().map(|(l, p)| (l, p.join("::"))).collect();
    let expected = [
        (1, "super::attention::rope"),
        (1, "super::attention::LayerContext"),
        (2, "super::blocks"),
        (2, "super::family"),
        (3, "super::super::model::Model::new"),
        (3, "crate::ir::DType"),
    ];
    assert_eq!(paths, expected.map(|(l, p)| (l, p.to_string())));
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
