//! `XLA_FLAGS`: parsed the way XLA parses it, merged from several sources, written back as an
//! environment value, and checked against the plugin file before the plugin is loaded — XLA ends
//! the whole process (exit 1) on an unknown flag instead of returning an error.

pub mod probe;
mod scan;

use std::fmt;
use std::path::Path;

use anyhow::{anyhow, bail, Result};

use crate::input;

/// The environment variable XLA reads its flags from (once per process, at client creation).
pub const ENV: &str = "XLA_FLAGS";
/// XLA's whitespace between flags.
const WS: &[char] = &[' ', '\t', '\r', '\n'];

/// One `--name[=value]`. A flag without value is a boolean set to true.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XlaFlag {
    pub name: String,
    pub value: Option<String>,
}

impl fmt::Display for XlaFlag {
    /// As XLA reads it back: a value with whitespace, or starting with a quote, is double-quoted
    /// with `\` escapes (XLA unquotes `--name="..."`); anything else is written as is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            None => write!(f, "--{}", self.name),
            Some(v) if v.contains(WS) || v.starts_with(['"', '\'']) => {
                write!(f, "--{}=\"{}\"", self.name, v.replace('\\', "\\\\").replace('"', "\\\""))
            }
            Some(v) => write!(f, "--{}={v}", self.name),
        }
    }
}

/// An ordered set of XLA flags, at most one per name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XlaFlags {
    flags: Vec<XlaFlag>,
}

impl XlaFlags {
    /// Parses whitespace-separated `--name=value`, `--name="quoted value"`, `--name='...'` or
    /// `--name`, as XLA's `parse_flags_from_env.cc` does. Where XLA would silently stop reading
    /// (a word that is not a flag) or treat the flag as unknown (one dash, a bare `--`), this is
    /// an error instead. A later flag of the same name wins, as in XLA.
    pub fn parse(text: &str) -> Result<Self> {
        let mut flags = Self::default();
        let mut rest = text.trim_start_matches(WS);
        while !rest.is_empty() {
            let (flag, after) = parse_one(rest)?;
            flags.set(&flag.name, flag.value.as_deref());
            rest = after.trim_start_matches(WS);
        }
        Ok(flags)
    }

    /// The flags in `$XLA_FLAGS`; like XLA, a value not starting with `-` names a file of flags.
    pub fn from_env() -> Result<Self> {
        let value = std::env::var(ENV).unwrap_or_default();
        let trimmed = value.trim_start_matches(WS);
        if trimmed.is_empty() || trimmed.starts_with('-') {
            return Self::parse(&value).map_err(|e| anyhow!("in {ENV}: {e:#}"));
        }
        let text = input::read_to_string(ENV, Path::new(&value), input::SETTINGS)
            .map_err(|e| anyhow!("{e} (a value not starting with `--` names a file of flags to XLA)"))?;
        Self::parse(&text).map_err(|e| anyhow!("in the flags file {value} named by {ENV}: {e:#}"))
    }

    pub fn iter(&self) -> impl Iterator<Item = &XlaFlag> {
        self.flags.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.flags.is_empty()
    }

    /// The value of flag `name`: `None` when absent, `Some(None)` when given without a value.
    pub fn get(&self, name: &str) -> Option<Option<&str>> {
        self.flags.iter().find(|f| f.name == name).map(|f| f.value.as_deref())
    }

    /// Sets `name` (replacing an earlier value in place, so the order stays stable).
    pub fn set(&mut self, name: &str, value: Option<&str>) {
        let value = value.map(str::to_string);
        match self.flags.iter_mut().find(|f| f.name == name) {
            Some(flag) => flag.value = value,
            None => self.flags.push(XlaFlag { name: name.to_string(), value }),
        }
    }

    /// Adds `later`'s flags; for a name present in both, `later`'s value wins.
    pub fn merge(&mut self, later: &XlaFlags) {
        for flag in &later.flags {
            self.set(&flag.name, flag.value.as_deref());
        }
    }

    /// The flags as one `XLA_FLAGS` value that XLA parses back to the same flags.
    pub fn to_env_string(&self) -> String {
        self.to_string()
    }

    /// Checks every flag name against the names in the plugin file (see `scan`), so that an
    /// unknown flag is an error here rather than the plugin ending the process at load time.
    pub fn validate_against_plugin(&self, plugin: &Path) -> Result<()> {
        if self.flags.is_empty() {
            return Ok(());
        }
        let known = scan::known_names(plugin)?;
        let problems: Vec<String> = self
            .flags
            .iter()
            .filter(|f| !known.contains(&f.name))
            .map(|f| match closest(&f.name, known.iter()) {
                Some(near) => format!("  --{}: did you mean --{near}?", f.name),
                None => format!("  --{}: no similar flag", f.name),
            })
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        bail!(
            "{} XLA flag{} unknown to the plugin {} (XLA would end the process on {}):\n{}\n\
             Remove or rename {} in {ENV} or the flags file; flags differ between XLA versions.",
            problems.len(),
            if problems.len() == 1 { " is" } else { "s are" },
            plugin.display(),
            if problems.len() == 1 { "it" } else { "them" },
            problems.join("\n"),
            if problems.len() == 1 { "it" } else { "them" },
        )
    }
}

impl fmt::Display for XlaFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, flag) in self.flags.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{flag}")?;
        }
        Ok(())
    }
}

/// Reads a flags file: flags separated by whitespace or newlines; lines whose first non-blank
/// character is `#` are comments (maxrs's own convention: XLA itself and `$(cat file)` do not
/// understand comments, which is why the files in `xla_flags/` have none).
pub fn load_flags_file(path: &Path) -> Result<XlaFlags> {
    let text = input::read_to_string("xla_flags_file", path, input::SETTINGS)?;
    let without_comments: String =
        text.lines().filter(|line| !line.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    XlaFlags::parse(&without_comments).map_err(|e| anyhow!("in XLA flags file {}: {e:#}", path.display()))
}

/// Reads one flag at the start of `s` (which starts with a non-blank); returns it and the rest.
fn parse_one(s: &str) -> Result<(XlaFlag, &str)> {
    let word_end = s.find(WS).unwrap_or(s.len());
    let word = &s[..word_end];
    if !s.starts_with('-') {
        bail!(
            "`{word}` is not a flag (flags look like --name=value); XLA would stop reading at it and \
             silently ignore everything after it"
        );
    }
    // XLA takes `--name="..."` as a quoted value only when the name is made of [-_A-Za-z0-9].
    let name_end = s.find(|c: char| !(c == '-' || c == '_' || c.is_ascii_alphanumeric())).unwrap_or(s.len());
    let quote = s[name_end..].strip_prefix('=').and_then(|v| v.chars().next()).filter(|c| *c == '"' || *c == '\'');
    let (arg, value, rest) = match quote {
        Some(quote) => {
            let (value, rest) = unquote(&s[name_end + 2..], quote)
                .ok_or_else(|| anyhow!("`{}` has no closing {quote}", &s[..name_end + 2]))?;
            (&s[..name_end], Some(value), rest)
        }
        None => match word.split_once('=') {
            Some((arg, value)) => (arg, Some(value.to_string()), &s[word_end..]),
            None => (word, None, &s[word_end..]),
        },
    };
    let name = match arg.strip_prefix("--") {
        Some(name) if !name.is_empty() && !name.starts_with('-') => name,
        Some(_) => {
            bail!("`{word}` is not a flag: a bare `--` or three dashes make XLA treat the rest as unknown flags")
        }
        None => bail!("`{word}` has one dash; XLA only knows flags written with two (--{})", &arg[1..]),
    };
    Ok((XlaFlag { name: name.to_string(), value }, rest))
}

/// The text up to the closing `quote` and the rest after it; inside double quotes a backslash
/// escapes the next character, inside single quotes it is literal (as in XLA).
fn unquote(s: &str, quote: char) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            c if c == quote => return Some((value, &s[i + c.len_utf8()..])),
            '\\' if quote == '"' => value.push(chars.next().map_or('\\', |(_, escaped)| escaped)),
            c => value.push(c),
        }
    }
    None
}

/// The known name most similar to `name`, if any is reasonably close.
fn closest<'a>(name: &str, known: impl Iterator<Item = &'a String>) -> Option<&'a str> {
    known
        .map(|k| (strsim::jaro_winkler(name, k), k))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.as_str())
}

#[cfg(test)]
mod tests;

/// Adds the flags of the config key `xla_flags_file` (a path, or the name of a built-in set as in
/// `xla_flags/`: `a3mega-N`, `h100`, `cpu`, and `a3mega`, which picks the `a3mega-N` set for the
/// run's `nodes`, see `a3mega_for_nodes`) to `XLA_FLAGS`; flags already in `XLA_FLAGS` win.
pub fn apply_flags_file(name: &str, nodes: u32) -> Result<()> {
    if name.is_empty() {
        return Ok(());
    }
    let picked = match name.strip_prefix("xla_flags/").unwrap_or(name).trim_end_matches(".flags") {
        "a3mega" => a3mega_for_nodes(nodes),
        _ => name,
    };
    let mut flags = match builtin_flags_file(picked) {
        Some(text) => XlaFlags::parse(text)?,
        // Anything at the path is read as a file, so that a FIFO or folder is named for what it is.
        None if Path::new(name).symlink_metadata().is_ok() => load_flags_file(Path::new(name))?,
        None => bail!(
            "xla_flags_file={name}: no such file, and not a built-in set (valid: a3mega, {})",
            BUILTIN_FLAGS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        ),
    };
    flags.merge(&XlaFlags::from_env()?);
    // Set before the plugin is loaded (XLA reads XLA_FLAGS once, at its first use).
    std::env::set_var("XLA_FLAGS", flags.to_env_string());
    Ok(())
}

/// The A3 Mega set for a job of `nodes` hosts: MaxText's llama2-7b GPU scripts
/// (`src/maxtext/configs/gpu/a3/llama_2_7b/{1,2,4,8,16}vm.sh`, main at e591f30) differ only in the
/// combine thresholds: all-reduce 128 MiB on 1 node, 64 MiB on 2, 512 MiB on 4, 1 GiB on 8 and
/// 16 (and reduce-scatter 128 MiB on 16). Other node counts take the largest listed size below.
pub fn a3mega_for_nodes(nodes: u32) -> &'static str {
    match nodes {
        0 | 1 => "a3mega-1",
        2 | 3 => "a3mega-2",
        4..=7 => "a3mega-4",
        8..=15 => "a3mega-8",
        _ => "a3mega-16",
    }
}

/// The tuned flag sets of `xla_flags/`, built in so the binary works from any directory.
const BUILTIN_FLAGS: &[(&str, &str)] = &[
    ("a3mega-1", include_str!("../../../xla_flags/a3mega-1.flags")),
    ("a3mega-2", include_str!("../../../xla_flags/a3mega-2.flags")),
    ("a3mega-4", include_str!("../../../xla_flags/a3mega-4.flags")),
    ("a3mega-8", include_str!("../../../xla_flags/a3mega-8.flags")),
    ("a3mega-16", include_str!("../../../xla_flags/a3mega-16.flags")),
    ("h100", include_str!("../../../xla_flags/h100.flags")),
    ("cpu", include_str!("../../../xla_flags/cpu.flags")),
];

/// A built-in flag set of `xla_flags/` by name (`a3mega`, `h100`, `cpu`), parsed.
pub fn builtin_flag_set(name: &str) -> Option<XlaFlags> {
    builtin_flags_file(name).map(|text| XlaFlags::parse(text).expect("the built-in flag sets parse (tests check)"))
}

fn builtin_flags_file(name: &str) -> Option<&'static str> {
    let stem = name.strip_prefix("xla_flags/").unwrap_or(name);
    let stem = stem.strip_suffix(".flags").unwrap_or(stem);
    BUILTIN_FLAGS.iter().find(|(n, _)| *n == stem).map(|(_, text)| *text)
}
