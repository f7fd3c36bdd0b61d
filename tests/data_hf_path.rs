//! `hf_path` as MaxText passes it to `datasets.load_dataset` (`input_pipeline/
//! hf_data_processing.py` at MaxText e591f30): the packaged builders (`json`, `parquet`, `csv`,
//! `text`, `arrow`) read files whatever their names, and a Hub dataset is listed and streamed from
//! a local server that speaks the Hub's API (tree listing with pagination, `resolve` downloads,
//! a redirect to another host for a large file, 401 and 404), its split picked from the card's
//! `configs:` or the default file patterns; the token goes to the Hub's host only and is never
//! printed. The expected rows are written out here from the files' contents (the `text` builder's
//! lines are Python's `str.splitlines` of the file); a real `maxrs train` run reads `hf_path=json`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, Int64Array, LargeStringArray, RecordBatch, StringArray};
use maxrs::config::{self, Config};
use maxrs::data::documents::{read_file, Doc};
use maxrs::data::{self, ProcessShare, Split, TextTokenizer};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

fn tokenizer_path() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model").display().to_string()
}

fn load(args: &[String]) -> Result<Config, String> {
    let mut all = vec!["dataset_type=hf".to_string(), format!("tokenizer_path={}", tokenizer_path())];
    all.extend(args.iter().cloned());
    config::load(None, &all).map_err(|e| e.to_string())
}

/// The rows of `split` as the pipeline reads them: text, or `!why` for an undecodable row.
fn rows(c: &Config, split: Split) -> Result<Vec<String>, String> {
    let tokenizer = Arc::new(TextTokenizer::load(&tokenizer_path(), "sentencepiece", true, true).unwrap());
    let spec = data::text_spec(c, split, tokenizer, ProcessShare::SINGLE).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for path in &spec.files {
        for doc in read_file(spec.storage.as_ref(), path, &spec.column).map_err(|e| e.to_string())? {
            out.push(match doc.map_err(|e| e.to_string())? {
                Doc::Text(t) => t,
                Doc::Undecodable(why) => format!("!{why}"),
                Doc::Chat(_) | Doc::Pair(_) => unreachable!("pre-training rows"),
            });
        }
    }
    Ok(out)
}

fn train_rows(args: &[String]) -> Result<Vec<String>, String> {
    rows(&load(args)?, Split::Train)
}

fn arg(key: &str, value: impl std::fmt::Display) -> String {
    format!("{key}={value}")
}

#[test]
fn the_builders_read_their_format_whatever_the_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    // json: JSON Lines, here in a file named .dat.
    std::fs::write(at("a.dat"), "{\"text\": \"one\", \"n\": 1}\n\n{\"text\": \"two\"}\n").unwrap();
    assert_eq!(
        train_rows(&[arg("hf_path", "json"), arg("hf_train_files", at("a.dat").display())]).unwrap(),
        ["one", "two"]
    );
    // A file that is one JSON list: the json builder reads it whole; by its name it is refused.
    std::fs::write(at("list.json"), "[\n  {\"text\": \"first\"},\n  {\"text\": null},\n  {\"text\": \"third\"}\n]\n")
        .unwrap();
    let listed = train_rows(&[arg("hf_path", "json"), arg("hf_train_files", at("list.json").display())]).unwrap();
    assert_eq!(listed, ["first", "!item 2: `text` is null", "third"]);
    let e = train_rows(&[arg("hf_train_files", at("list.json").display())]).unwrap_err();
    assert!(e.contains("holds a JSON array, not JSON Lines") && e.contains("hf_path=json"), "{e}");
    // Compressed: `.gz` files are read through gzip, by extension or with a builder.
    let mut gz = flate2::write::GzEncoder::new(File::create(at("g.jsonl.gz")).unwrap(), flate2::Compression::default());
    gz.write_all(b"{\"text\": \"zipped\"}\n").unwrap();
    gz.finish().unwrap();
    assert_eq!(train_rows(&[arg("hf_train_files", at("g.jsonl.gz").display())]).unwrap(), ["zipped"]);
    assert_eq!(
        train_rows(&[arg("hf_path", "json"), arg("hf_train_files", at("g.jsonl.gz").display())]).unwrap(),
        ["zipped"]
    );
    // text: one row per line, blank lines kept as empty rows, `\r\n` and `\r` end lines:
    // Python's "alpha\n\nbeta gamma\r\ndelta\repsilon".splitlines() == ["alpha", "", "beta gamma", "delta", "epsilon"].
    std::fs::write(at("b.md"), "alpha\n\nbeta gamma\r\ndelta\repsilon").unwrap();
    let lines = train_rows(&[arg("hf_path", "text"), arg("hf_train_files", at("b.md").display())]).unwrap();
    assert_eq!(lines, ["alpha", "", "beta gamma", "delta", "epsilon"]);
    // Without hf_path the same .md file is read by its name: paragraphs (maxrs's own).
    let paragraphs = train_rows(&[arg("hf_train_files", at("b.md").display())]).unwrap();
    assert_eq!(paragraphs, ["alpha", "beta gamma\ndelta\repsilon"]);
    // csv: a header row; quoted fields may hold commas, quotes and line breaks; empty is null.
    std::fs::write(
        at("c.txt"),
        "id,text\n1,plain\n2,\"with, comma and \"\"quote\"\"\nand a second line\"\n3,\n4,NA\n5,none\n",
    )
    .unwrap();
    let csv = train_rows(&[arg("hf_path", "csv"), arg("hf_train_files", at("c.txt").display())]).unwrap();
    // pandas reads "" and "NA" as NaN, "none" as text.
    assert_eq!(csv, ["plain", "with, comma and \"quote\"\nand a second line", "!row 2: null", "!row 3: null", "none"]);
    let e = train_rows(&[
        arg("hf_path", "csv"),
        arg("hf_train_files", at("c.txt").display()),
        "train_data_columns=body".into(),
    ])
    .unwrap_err();
    assert!(e.contains("no column `body`") && e.contains("id, text"), "{e}");
    // parquet, named .bin.
    write_parquet(&at("d.bin"), &["p0", "p1"]);
    assert_eq!(
        train_rows(&[arg("hf_path", "parquet"), arg("hf_train_files", at("d.bin").display())]).unwrap(),
        ["p0", "p1"]
    );
    // arrow: an IPC stream of two record batches, utf8 and large_utf8 columns, a null.
    write_arrow(&at("e.arrow"));
    let arrow = train_rows(&[arg("hf_path", "arrow"), arg("hf_train_files", at("e.arrow").display())]).unwrap();
    assert_eq!(arrow, ["a0", "!row 1: null", "a2"]);
    let large = train_rows(&[
        arg("hf_path", "arrow"),
        arg("hf_train_files", at("e.arrow").display()),
        "train_data_columns=big".into(),
    ])
    .unwrap();
    assert_eq!(large, ["b0", "b1", "b2"]);
    let e = train_rows(&[
        arg("hf_path", "arrow"),
        arg("hf_train_files", at("e.arrow").display()),
        "train_data_columns=id".into(),
    ])
    .unwrap_err();
    assert!(e.contains("`id`") && e.contains("Int64 values"), "{e}");
    let e = train_rows(&[arg("hf_path", "arrow"), arg("hf_train_files", at("a.dat").display())]).unwrap_err();
    assert!(e.contains("not a readable Arrow IPC stream"), "{e}");
}

/// A folder with a builder: its files' names give the splits (the library's default patterns).
#[test]
fn a_builder_over_hf_data_dir_finds_the_splits_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/train.jsonl"), "{\"text\": \"t\"}\n").unwrap();
    std::fs::write(dir.path().join("sub/validation.jsonl"), "{\"text\": \"v\"}\n").unwrap();
    let base = [arg("hf_path", "json"), arg("hf_data_dir", dir.path().display())];
    assert_eq!(train_rows(&base).unwrap(), ["t"]);
    let mut eval = base.to_vec();
    eval.extend(["hf_eval_split=validation".into(), "eval_interval=5".into()]);
    let c = load(&eval).unwrap();
    config::validate(&c, 1, 1).unwrap();
    assert_eq!(rows(&c, Split::Eval).unwrap(), ["v"]);
    // The folder itself as hf_path: read as a Hub repository's files would be.
    assert_eq!(train_rows(&[arg("hf_path", dir.path().display())]).unwrap(), ["t"]);
    let mut bad = base.to_vec();
    bad.push("train_split=trian".into());
    let e = train_rows(&bad).unwrap_err();
    assert!(e.contains("no split 'trian'; the splits are train, validation"), "{e}");
    // A data_files string is the one split `train`.
    let e = train_rows(&[arg("hf_path", "json"), arg("hf_train_files", "x.jsonl"), "train_split=train_sft".into()])
        .unwrap_err();
    assert!(e.contains("train_split=train_sft") && e.contains("'train'"), "{e}");
    let e = train_rows(&[arg("hf_path", "json")]).unwrap_err();
    assert!(e.starts_with("hf_path=json: ") && e.contains("hf_train_files") && e.contains("hf_data_dir"), "{e}");
    let e = train_rows(&[arg("hf_path", "./local/dir"), arg("hf_train_files", "x.jsonl")]).unwrap_err();
    assert!(e.contains("not a builder (json, parquet, csv, text, arrow), a local folder"), "{e}");
}

#[test]
fn maxtext_defaults_of_the_hf_keys_are_accepted_and_the_token_is_redacted() {
    let defaults = ["hf_path=", "hf_name=", "hf_data_dir=", "hf_eval_split=", "hf_access_token=", "train_split=train"]
        .map(String::from);
    config::load(None, &defaults).unwrap();
    let out = maxrs_cli(&["train", "--print-config", "hf_access_token=hf_SeCrEt"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains("hf_SeCrEt"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("hf_access_token") && l.contains("<redacted>")), "{stdout}");
}

fn maxrs_cli(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_maxrs"));
    cmd.args(args).env_remove("MAXRS_PJRT_PLUGIN").env_remove("HF_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run maxrs")
}

/// `maxrs train dataset_type=hf hf_path=json` on a file without a JSON name: a few steps with
/// a finite loss, and MaxText's sft-style split keys at their defaults.
#[test]
fn train_reads_hf_path_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("corpus.data");
    let line =
        |i: usize| serde_json::json!({"text": format!("doc {i} shall I compare thee to a summer's day")}).to_string();
    std::fs::write(&file, (0..64).map(line).collect::<Vec<_>>().join("\n")).unwrap();
    let out = maxrs_cli(
        &[
            "train",
            &arg("base_output_directory", dir.path().display()),
            "enable_checkpointing=false",
            "dataset_type=hf",
            "hf_path=json",
            &arg("hf_train_files", file.display()),
            "train_split=train",
            &arg("tokenizer_path", tokenizer_path()),
            "max_target_length=64",
            "steps=3",
        ],
        &[],
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let losses: Vec<f64> = stdout
        .lines()
        .filter(|l| l.starts_with("completed step: "))
        .map(|l| l.split(", ").find_map(|f| f.strip_prefix("loss: ")).unwrap().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), 3, "{stdout}");
    assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0), "{losses:?}");
}

fn write_parquet(path: &Path, texts: &[&str]) {
    let schema = Arc::new(parse_message_type("message doc { OPTIONAL BYTE_ARRAY text (UTF8); }").unwrap());
    let mut writer =
        SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(WriterProperties::default())).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let mut col = group.next_column().unwrap().unwrap();
    let values: Vec<ByteArray> = texts.iter().map(|t| ByteArray::from(*t)).collect();
    col.typed::<ByteArrayType>().write_batch(&values, Some(&vec![1; texts.len()]), None).unwrap();
    col.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
}

fn write_arrow(path: &Path) {
    let batch = |ids: Vec<i64>, text: Vec<Option<&str>>, big: Vec<&str>| {
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("text", Arc::new(StringArray::from(text)) as ArrayRef),
            ("big", Arc::new(LargeStringArray::from(big)) as ArrayRef),
        ])
        .unwrap()
    };
    let first = batch(vec![0, 1], vec![Some("a0"), None], vec!["b0", "b1"]);
    let second = batch(vec![2], vec![Some("a2")], vec!["b2"]);
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(File::create(path).unwrap(), &first.schema()).unwrap();
    writer.write(&first).unwrap();
    writer.write(&second).unwrap();
    writer.finish().unwrap();
}

// ---- A Hub that speaks huggingface_hub's API --------------------------------------------------

/// A request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    target: String,
    auth: Option<String>,
    range: Option<String>,
}

type Reply = (u16, Vec<(String, String)>, Vec<u8>);
type Handler = Arc<dyn Fn(&str, Option<&str>) -> Reply + Send + Sync>;

/// An HTTP/1.1 server on `host` answering each request (one per connection) with `handler`.
fn serve(host: &str, handler: Handler) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{host}:{}", listener.local_addr().unwrap().port());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (handler, log) = (handler.clone(), log.clone());
            std::thread::spawn(move || answer(stream, &handler, &log));
        }
    });
    (base, seen)
}

fn answer(mut stream: TcpStream, handler: &Handler, log: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let target = request_line.split(' ').nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    log.lock().unwrap().push(Seen {
        target: target.clone(),
        auth: headers.get("authorization").cloned(),
        range: range.clone(),
    });
    let (status, extra, body) = handler(&target, range.as_deref());
    let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&body));
}

/// A file's bytes, whole or from `bytes=N-`.
fn file_reply(bytes: &[u8], range: Option<&str>) -> Reply {
    match range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(from) => {
            let header = ("Content-Range".to_string(), format!("bytes {from}-{}/{}", bytes.len() - 1, bytes.len()));
            (206, vec![header], bytes[from..].to_vec())
        }
        None => (200, vec![], bytes.to_vec()),
    }
}

fn json_reply(status: u16, value: serde_json::Value) -> Reply {
    (status, vec![("Content-Type".into(), "application/json".into())], value.to_string().into_bytes())
}

#[test]
fn hub_datasets_are_listed_and_streamed_with_the_token_sent_to_the_hub_only() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("train.parquet"), &["hub p0", "hub p1", "hub p2"]);
    write_parquet(&dir.path().join("test.parquet"), &["hub test"]);
    let parquet: HashMap<&str, Vec<u8>> = [
        ("data/train-00000-of-00001.parquet", std::fs::read(dir.path().join("train.parquet")).unwrap()),
        ("data/test-00000-of-00001.parquet", std::fs::read(dir.path().join("test.parquet")).unwrap()),
    ]
    .into();
    // The CDN: another host name for the same machine.
    let cdn_files = Arc::new(parquet.clone());
    let (cdn, cdn_seen) = serve(
        "localhost",
        Arc::new(move |target: &str, range: Option<&str>| match cdn_files.get(target.trim_start_matches("/cdn/")) {
            Some(bytes) => file_reply(bytes, range),
            None => (404, vec![], vec![]),
        }),
    );
    let card = "---\nlicense: mit\nconfigs:\n- config_name: default\n  data_files:\n  - split: train_sft\n    path: sft/train-*\n  \
                - split: test_sft\n    path: sft/test-*\n---\n# A card\n";
    let texts: HashMap<&str, String> = [
        ("README.md", card.to_string()),
        ("sft/train-0.jsonl", "{\"text\": \"sft zero\"}\n{\"text\": \"sft one\"}\n".to_string()),
        ("sft/train-1.jsonl", "{\"text\": \"sft two\"}\n".to_string()),
        ("sft/test-0.jsonl", "{\"text\": \"sft test\"}\n".to_string()),
    ]
    .into();
    let listing = |files: Vec<(&str, usize)>| -> Vec<serde_json::Value> {
        let mut out = vec![serde_json::json!({"type": "directory", "oid": "0", "size": 0, "path": "data"})];
        out.extend(
            files.into_iter().map(|(p, s)| serde_json::json!({"type": "file", "oid": "1", "size": s, "path": p})),
        );
        out
    };
    let card_files: Vec<(&str, usize)> = texts.iter().map(|(p, t)| (*p, t.len())).collect();
    let plain_files: Vec<(&str, usize)> = parquet.iter().map(|(p, b)| (*p, b.len())).collect();
    let (card_list, plain_list) = (listing(card_files), listing(plain_files));
    let (hub, hub_seen) = serve(
        "127.0.0.1",
        Arc::new(move |target: &str, range: Option<&str>| {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            match path {
                // The card repository's listing comes in two pages.
                "/api/datasets/org/card/tree/main" if query.contains("cursor=2") => {
                    json_reply(200, serde_json::Value::Array(card_list[3..].to_vec()))
                }
                "/api/datasets/org/card/tree/main" => {
                    assert!(query.contains("recursive=true"), "{target}");
                    let next = format!("<{path}?recursive=true&expand=false&cursor=2>; rel=\"next\"");
                    let (status, mut headers, body) =
                        json_reply(200, serde_json::Value::Array(card_list[..3].to_vec()));
                    headers.push(("Link".into(), next));
                    (status, headers, body)
                }
                "/api/datasets/org/plain/tree/main" => json_reply(200, serde_json::Value::Array(plain_list.clone())),
                "/api/datasets/org/gated/tree/main" => {
                    json_reply(401, serde_json::json!({"error": "Access to dataset org/gated is restricted."}))
                }
                p if p.starts_with("/api/") => json_reply(404, serde_json::json!({"error": "Repository not found"})),
                p => match p.strip_prefix("/datasets/org/card/resolve/main/") {
                    Some(file) => {
                        texts.get(file).map(|t| file_reply(t.as_bytes(), range)).unwrap_or((404, vec![], vec![]))
                    }
                    None => match p.strip_prefix("/datasets/org/plain/resolve/main/") {
                        // Large files are served by the CDN, as the Hub does.
                        Some(file) => (302, vec![("Location".into(), format!("{cdn}/cdn/{file}"))], vec![]),
                        None => (404, vec![], vec![]),
                    },
                },
            }
        }),
    );
    // HF_ENDPOINT and HF_TOKEN are read by the library in this process: only this test sets them.
    std::env::set_var("HF_ENDPOINT", &hub);
    let token = "hf_test_token";
    let hub_args = |repo: &str, extra: &[&str]| {
        let mut args = vec![arg("hf_path", repo)];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };

    // The card's configs: its split names; the listing's two pages; the token on every request.
    let args = hub_args("org/card", &["train_split=train_sft", &arg("hf_access_token", token)]);
    let c = load(&args).unwrap();
    config::validate(&c, 1, 1).unwrap();
    assert_eq!(rows(&c, Split::Train).unwrap(), ["sft zero", "sft one", "sft two"]);
    let eval = load(&hub_args("org/card", &["hf_eval_split=test_sft", "eval_interval=2"])).unwrap();
    config::validate(&eval, 1, 1).unwrap();
    assert_eq!(rows(&eval, Split::Eval).unwrap(), ["sft test"]);
    {
        let seen = hub_seen.lock().unwrap();
        assert!(seen.iter().any(|s| s.target.contains("cursor=2")), "the second page is read: {seen:?}");
        let with_token: Vec<&Seen> = seen.iter().filter(|s| s.auth.is_some()).collect();
        assert!(!with_token.is_empty() && with_token.iter().all(|s| s.auth.as_deref() == Some("Bearer hf_test_token")));
    }
    let e = train_rows(&hub_args("org/card", &["train_split=trian"])).unwrap_err();
    assert_eq!(e, "hf_path=org/card: no split 'trian'; the splits are train_sft, test_sft");

    // Default patterns (sharded names), Parquet through the CDN: the token from HF_TOKEN goes to
    // the Hub, never to the CDN, and Parquet is read in ranges.
    hub_seen.lock().unwrap().clear();
    std::env::set_var("HF_TOKEN", token);
    let plain = train_rows(&hub_args("org/plain", &[]));
    let test = rows(&load(&hub_args("org/plain", &["hf_eval_split=test"])).unwrap(), Split::Eval);
    std::env::remove_var("HF_TOKEN");
    assert_eq!(plain.unwrap(), ["hub p0", "hub p1", "hub p2"]);
    assert_eq!(test.unwrap(), ["hub test"]);
    let hub_requests = hub_seen.lock().unwrap().clone();
    assert!(hub_requests.iter().all(|s| s.auth.as_deref() == Some("Bearer hf_test_token")), "{hub_requests:?}");
    let cdn_requests = cdn_seen.lock().unwrap().clone();
    assert!(!cdn_requests.is_empty() && cdn_requests.iter().all(|s| s.auth.is_none()), "{cdn_requests:?}");
    assert!(cdn_requests.iter().any(|s| s.range.is_some()), "ranged reads: {cdn_requests:?}");

    // Refusals: one line each, naming the dataset and what to do.
    let e = train_rows(&hub_args("org/gated", &[])).unwrap_err();
    assert!(e.starts_with("hf_path=org/gated: listing its files") && e.contains("401"), "{e}");
    assert!(e.contains("restricted") && e.contains("hf_access_token or HF_TOKEN") && !e.contains('\n'), "{e}");
    let e = train_rows(&hub_args("org/none", &[])).unwrap_err();
    assert!(e.starts_with("hf_path=org/none: no such dataset on http://127.0.0.1:"), "{e}");
    let e = train_rows(&hub_args("org/card", &["hf_name=other"])).unwrap_err();
    assert_eq!(e, "hf_path=org/card: hf_name=other: no such config; the configs are default");
    std::env::remove_var("HF_ENDPOINT");
}
