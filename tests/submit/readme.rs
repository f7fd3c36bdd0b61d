//! The book's "Submitting to a cluster" examples (docs/src/guides/submit.md) are the outputs of
//! today's binary.

use super::common::{maxrs, repo, with_seed, IMAGE, VERTEX_2_NODES};

/// The fenced block that follows `<summary>{summary}</summary>` in the book's submit guide.
fn guide_block(summary: &str) -> String {
    let page = std::fs::read_to_string(repo().join("docs/src/guides/submit.md")).unwrap();
    let at = page.find(&format!("<summary>{summary}</summary>")).unwrap_or_else(|| panic!("no {summary} block"));
    let fence = at + page[at..].find("```").unwrap();
    let body = fence + page[fence..].find('\n').unwrap() + 1;
    let end = body + page[body..].find("\n```").unwrap();
    page[body..end].to_string()
}

#[test]
fn the_submit_guide_shows_the_current_dry_run_outputs() {
    let home = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<&str>); 3] = [
        ("the custom job JSON", [VERTEX_2_NODES, &["--dry-run"]].concat()),
        ("the sbatch script", vec!["submit", "slurm", "--nodes", "2", "--partition", "a3mega", "--dry-run"]),
        ("the JobSet manifest", vec!["submit", "gke", "--nodes", "2", "--image", IMAGE, "--dry-run"]),
    ];
    for (summary, args) in cases {
        let run = maxrs(&with_seed(&args), home.path(), &[]);
        assert!(run.ok, "{}", run.all());
        assert_eq!(
            guide_block(summary),
            run.stdout.trim_end(),
            "docs/src/guides/submit.md block `{summary}` is out of date"
        );
    }
}
