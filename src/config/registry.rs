//! The key registry: every configuration key is declared once, in `keys.rs`, with its type,
//! default, range or closed set of values, meaning, source (MaxText's or maxrs's own) and role.
//! Everything that needs to know keys asks the registry instead of keeping a list: loading (the
//! valid keys, their types, choices and the keys a model file may set), the range checks, the
//! keys each decoder family reads (`Model::config_keys`), the keys the AOT artifact and a
//! checkpoint's manifest record, the path keys `output::check_paths` checks, `--print-config`,
//! `configs/base.yml` and the book's key reference (both generated, `docs.rs`).
//!
//! The declarations are one `declare_keys!` invocation, a closed declarative macro (as candle and
//! zml declare their configs) rather than a table read through serde: it generates the typed
//! [`Config`](super::Config) and the table [`keys`] from the same tokens, so neither can drift;
//! a key's kind comes from its Rust type ([`KeyType`]) and its default text is checked against
//! that type when the defaults load.

use super::choices::LogicalAxisRule;
use super::ranges::Range;
use super::DecoderBlock;

/// The commit of MaxText's `src/maxtext/configs/base.yml` (and `types.py`) that the keys of
/// [`Origin::MaxText`] were compared with: main at e591f30cbbf2 (2026-08-22).
pub const MAXTEXT_BASE_YML: &str = "src/maxtext/configs/base.yml@e591f30";

/// Where a key comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// MaxText's key, with MaxText's name and meaning ([`MAXTEXT_BASE_YML`]).
    MaxText,
    /// maxrs's own key: MaxText main has no such key.
    Maxrs,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::MaxText => MAXTEXT_BASE_YML,
            Origin::Maxrs => "maxrs's own",
        }
    }
}

/// What a key does, which decides the lists derived from the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Model shape: the model reads it ([`Key::families`]); it is traced into every step, named
    /// by the AOT artifact and recorded in a checkpoint's manifest, which a run must match.
    Model,
    /// Compiled into the train step and named by the AOT artifact, but free to change between a
    /// checkpoint and the run restoring it: the training setup (batch, sequence, initialization,
    /// optimizer and schedule constants, mesh sizes) and, with [`Key::families`], the model's
    /// numerics, sharding and expert routing.
    Step,
    /// Shapes the compiled programs (mesh layout, pipeline, hardware, compile target, decoding)
    /// without being named by the AOT artifact, whose program fingerprint catches a change.
    Program,
    /// Names a file or directory a command reads or writes ([`Key::path`]).
    Path,
    /// Run-time only: how the configuration loads and what the run reads, logs, saves and waits for.
    Run,
}

/// What a command does with the file a path key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Reads,
    Writes,
    Ignores,
}

/// How `maxrs train` and `maxrs train-compile` use a path key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathUse {
    pub train: Access,
    pub train_compile: Access,
    /// A directory is a valid value: a checkpoint to read, the run's output directory.
    pub directory: bool,
    /// A `gs://` location is a valid value (checked when the config validates).
    pub remote: bool,
}

/// The decoder families (`decoder_block`) that read a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Families {
    /// The model does not read it.
    None,
    /// Every family (`ModelConfig` reads it).
    All,
    /// Only these families; the others refuse a non-default value.
    Only(&'static [DecoderBlock]),
}

impl Families {
    pub fn includes(self, block: DecoderBlock) -> bool {
        match self {
            Families::None => false,
            Families::All => true,
            Families::Only(blocks) => blocks.contains(&block),
        }
    }
}

/// The type of a key's values, as loading converts and checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Int,
    Float,
    Text,
    /// A string from a closed set.
    Choice(&'static [&'static str]),
    /// An integer or `None` (MaxText's spelling; `null` in YAML).
    IntOrNone,
    Texts,
    TextLists,
    /// `logical_axis_rules`' rows.
    AxisRules,
}

impl Kind {
    /// What a value must be, for errors.
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Bool => "a boolean (true or false)",
            Kind::Int => "an integer",
            Kind::Float => "a finite number",
            Kind::Text | Kind::Choice(_) => "a string",
            Kind::IntOrNone => "an integer or None",
            Kind::Texts => "a list of strings",
            Kind::TextLists => "a list of lists of strings",
            Kind::AxisRules => "a list of [logical axis name, mesh axis or list of mesh axes] rows",
        }
    }

    /// The closed set of values, if the key has one.
    pub fn choices(self) -> Option<&'static [&'static str]> {
        match self {
            Kind::Choice(values) => Some(values),
            _ => None,
        }
    }
}

/// The Rust types a key may have, and their [`Kind`].
pub trait KeyType {
    const KIND: Kind;
}

macro_rules! key_types {
    ($($ty:ty => $kind:ident),* $(,)?) => {
        $(impl KeyType for $ty {
            const KIND: Kind = Kind::$kind;
        })*
    };
}

key_types!(
    bool => Bool,
    i64 => Int,
    f64 => Float,
    String => Text,
    Option<i64> => IntOrNone,
    Vec<String> => Texts,
    Vec<Vec<String>> => TextLists,
    Vec<LogicalAxisRule> => AxisRules,
);

/// One key's declaration.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    pub name: &'static str,
    /// Its field of `Config` (the name but for a nested mapping's field: `lora.lora_rank` is
    /// `lora_rank`).
    pub field: &'static str,
    pub kind: Kind,
    /// The default, as `configs/base.yml` writes it (YAML).
    pub default: &'static str,
    /// The declaration's doc comment: the first line is the meaning, the others notes.
    doc: &'static [&'static str],
    /// The title of the group of keys it belongs to.
    pub section: &'static str,
    pub origin: Origin,
    pub role: Role,
    /// The decoder families that read it (`Families::None` unless the model does).
    pub families: Families,
    /// How the commands use it, for [`Role::Path`].
    pub path: Option<PathUse>,
    /// The values a number may take; every numeric key has one.
    pub range: Option<Range>,
    /// A model file (`models/<name>.yml`) may set it.
    pub model_file: bool,
}

/// A group of keys, with what its keys share.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    pub title: &'static str,
    pub doc: &'static [&'static str],
}

impl Section {
    pub fn doc(&self) -> impl Iterator<Item = &'static str> {
        self.doc.iter().map(|line| line.strip_prefix(' ').unwrap_or(line))
    }
}

impl Key {
    /// What the key means, in one line.
    pub fn meaning(&self) -> &'static str {
        self.doc.first().map_or("", |line| line.trim())
    }

    /// The lines that explain the key further (`configs/base.yml` shows them above it).
    pub fn notes(&self) -> impl Iterator<Item = &'static str> {
        self.doc.iter().skip(1).map(|line| line.strip_prefix(' ').unwrap_or(line))
    }

    /// Whether `block`'s model reads it.
    pub fn read_by(&self, block: DecoderBlock) -> bool {
        self.families.includes(block)
    }

    /// Fills in what the `declare_keys!` invocation knows of a key declared as `decl`.
    pub(crate) const fn declared(
        self,
        (name, field): (&'static str, &'static str),
        kind: Kind,
        default: &'static str,
        doc: &'static [&'static str],
        section: &'static str,
    ) -> Key {
        Key { name, field, kind, default, doc, section, ..self }
    }

    /// Model shape, read by `families`.
    pub(crate) const fn model(self, families: Families) -> Key {
        Key { role: Role::Model, families, ..self }
    }

    pub(crate) const fn step(self) -> Key {
        Key { role: Role::Step, ..self }
    }

    pub(crate) const fn program(self) -> Key {
        Key { role: Role::Program, ..self }
    }

    /// A path key: what `train` and `train-compile` do with it.
    pub(crate) const fn path(self, train: Access, train_compile: Access) -> Key {
        let path = PathUse { train, train_compile, directory: false, remote: false };
        Key { role: Role::Path, path: Some(path), ..self }
    }

    /// A path key whose value may be a directory.
    pub(crate) const fn directory(self) -> Key {
        match self.path {
            Some(path) => Key { path: Some(PathUse { directory: true, ..path }), ..self },
            None => panic!("only a path key names a directory"),
        }
    }

    /// A path key whose value may be a `gs://` location.
    pub(crate) const fn remote(self) -> Key {
        match self.path {
            Some(path) => Key { path: Some(PathUse { remote: true, ..path }), ..self },
            None => panic!("only a path key names a location"),
        }
    }

    /// A [`Role::Step`] key that `families`' model reads too.
    pub(crate) const fn read_by_model(self, families: Families) -> Key {
        Key { families, ..self }
    }

    pub(crate) const fn range(self, range: Range) -> Key {
        Key { range: Some(range), ..self }
    }

    pub(crate) const fn model_file(self) -> Key {
        Key { model_file: true, ..self }
    }
}

impl Origin {
    /// A key of this origin, run-time only until a builder says otherwise.
    pub(crate) const fn run(self) -> Key {
        Key {
            name: "",
            field: "",
            kind: Kind::Text,
            default: "",
            doc: &[],
            section: "",
            origin: self,
            role: Role::Run,
            families: Families::None,
            path: None,
            range: None,
            model_file: false,
        }
    }

    pub(crate) const fn model(self, families: Families) -> Key {
        self.run().model(families)
    }

    pub(crate) const fn step(self) -> Key {
        self.run().step()
    }

    pub(crate) const fn program(self) -> Key {
        self.run().program()
    }

    pub(crate) const fn path(self, train: Access, train_compile: Access) -> Key {
        self.run().path(train, train_compile)
    }
}

/// Declares every key: generates [`Config`](super::Config) (one field per key, documented by the
/// declaration's doc comment), `KEYS` (the registry table, in declaration order) and `SECTIONS`.
/// Each key is `name: RustType = default => declaration`: the default is written as YAML would
/// write it (it is `configs/base.yml`'s text), the declaration a [`Key`] built from its
/// [`Origin`] (`MaxText.model(ALL).range(...)`). `#[key = "lora.lora_rank"]` names a key whose
/// name is not its field's (the fields of MaxText's nested mappings, `config::nested`).
macro_rules! declare_keys {
    ($(
        $(#[doc = $section_doc:literal])*
        section $title:literal {
            $(
                $(#[key = $key:literal])?
                $(#[serde($($serde:tt)*)])?
                $(#[doc = $doc:literal])*
                $name:ident: $ty:ty = $default:expr => $decl:expr
            ),* $(,)?
        }
    )*) => {
        /// Every configuration key, with MaxText's names; each is declared once in `keys.rs` with
        /// its default, range, meaning, source and role (`config::registry`).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub struct Config {
            $($(
                $(#[serde(rename = $key)])?
                $(#[serde($($serde)*)])?
                $(#[doc = $doc])*
                pub $name: $ty,
            )*)*
        }

        /// The groups of keys, in declaration order.
        pub(crate) const SECTIONS: &[Section] = &[$(Section { title: $title, doc: &[$($section_doc),*] }),*];

        /// Every key, in declaration order (`Config`'s field order).
        pub(crate) const KEYS: &[Key] = &[$($(
            $decl.declared(($crate::config::registry::key_name!($name $(, $key)?), stringify!($name)), <$ty as KeyType>::KIND, stringify!($default), &[$($doc),*], $title)
        ),*),*];
    };
}
pub(crate) use declare_keys;

/// A key's name: its field's, or the `#[key = "..."]` a declaration gives (a field of one of
/// MaxText's nested mappings, `lora.lora_rank`, whose name is no Rust identifier).
macro_rules! key_name {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident, $key:literal) => {
        $key
    };
}
pub(crate) use key_name;

/// Every key, in declaration order.
pub fn keys() -> &'static [Key] {
    super::keys::KEYS
}

/// The groups of keys, in declaration order.
pub fn sections() -> &'static [Section] {
    super::keys::SECTIONS
}

/// Key `name`'s declaration, if it is a key.
pub fn key(name: &str) -> Option<&'static Key> {
    keys().iter().find(|k| k.name == name)
}

/// The keys of `role`, in declaration order.
pub fn keys_with(role: Role) -> impl Iterator<Item = &'static Key> {
    keys().iter().filter(move |k| k.role == role)
}

/// The keys `block`'s model reads: traced into its steps (`Model::config_keys`).
pub fn model_keys(block: DecoderBlock) -> impl Iterator<Item = &'static str> {
    keys().iter().filter(move |k| k.read_by(block)).map(|k| k.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_consistent() {
        for k in keys() {
            let numeric = matches!(k.kind, Kind::Int | Kind::Float | Kind::IntOrNone);
            assert_eq!(numeric, k.range.is_some(), "{}: a range exactly for numbers", k.name);
            assert_eq!(k.role == Role::Path, k.path.is_some(), "{}: path use exactly for path keys", k.name);
            if k.role == Role::Model {
                assert_ne!(k.families, Families::None, "{}: a model-shape key names its families", k.name);
            }
            if k.families != Families::None {
                assert!(matches!(k.role, Role::Model | Role::Step), "{}: a key the model reads is compiled", k.name);
            }
            assert!(!k.meaning().is_empty() && !k.meaning().ends_with(':'), "{}: a one-line meaning", k.name);
            assert_eq!(keys().iter().filter(|other| other.name == k.name).count(), 1, "{}", k.name);
            assert!(super::super::refused::not_supported_yet(k.name).is_none(), "{} is refused", k.name);
        }
    }
}
