//! `gs://` datasets against the GCS emulator (fake-gcs-server, tests/common/gcs_emulator.rs):
//! - JSON Lines conversations and a Parquet file of several row groups read from a bucket give
//!   the same documents as the local files (read in ranges through the storage seam);
//! - `maxrs train` on an SFT dataset in a bucket, through a loopback proxy that cuts the
//!   connection in the middle of ranged reads: the reads are retried, and after a SIGKILL the
//!   same command resumes at the next document: every step's loss equals the uninterrupted
//!   run's (which read the bucket directly).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maxrs::data::documents::{read_conversations, Doc};
use maxrs::data::storage::{GcsFiles, LocalFiles, Storage};
use maxrs::files::Location;
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use crate::data_sft::repeat_conversations;

const BUCKET: &str = "maxrs-datasets";
const MAXRS: &str = env!("CARGO_BIN_EXE_maxrs");

fn upload(key: &str, bytes: &[u8]) -> String {
    let at = format!("gs://{BUCKET}/{key}");
    maxrs::storage::write(&Location::parse(&at).unwrap(), bytes).unwrap();
    at
}

/// Question/answer pairs as Parquet, `per_group` rows per row group.
fn write_parquet(path: &Path, pairs: &[(String, String)], per_group: usize) {
    let schema = "message qa { REQUIRED BYTE_ARRAY question (UTF8); REQUIRED BYTE_ARRAY answer (UTF8); }";
    let props = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
    let schema = Arc::new(parse_message_type(schema).unwrap());
    let mut writer = SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    for chunk in pairs.chunks(per_group) {
        let mut group = writer.next_row_group().unwrap();
        for column in [0, 1] {
            let mut col = group.next_column().unwrap().unwrap();
            let values: Vec<ByteArray> =
                chunk.iter().map(|p| ByteArray::from(if column == 0 { p.0.as_str() } else { p.1.as_str() })).collect();
            col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
            col.close().unwrap();
        }
        group.close().unwrap();
    }
    writer.close().unwrap();
}

fn docs(storage: &dyn Storage, path: &Path, columns: &[&str]) -> Vec<Doc> {
    let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
    read_conversations(storage, path, &columns).unwrap().map(Result::unwrap).collect()
}

#[test]
fn bucket_files_read_like_local_files() {
    let Some(_emulator) = crate::common::gcs_emulator::start(&[BUCKET]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let (lines, pairs) = repeat_conversations(300, 7);
    let local_jsonl = dir.path().join("chat.jsonl");
    std::fs::write(&local_jsonl, &lines).unwrap();
    let remote_jsonl = upload("same/chat.jsonl", lines.as_bytes());
    let local_parquet = dir.path().join("qa.parquet");
    write_parquet(&local_parquet, &pairs, 64);
    let remote_parquet = upload("same/qa.parquet", &std::fs::read(&local_parquet).unwrap());

    let want = docs(&LocalFiles, &local_jsonl, &["messages"]);
    assert_eq!(want.len(), 300);
    assert_eq!(docs(&GcsFiles, Path::new(&remote_jsonl), &["messages"]), want);
    let want = docs(&LocalFiles, &local_parquet, &["question", "answer"]);
    assert!(matches!(&want[299], Doc::Chat(m) if m[1].content == pairs[299].1));
    assert_eq!(docs(&GcsFiles, Path::new(&remote_parquet), &["question", "answer"]), want);
    // Globs list the bucket under their literal prefix.
    let files = GcsFiles.glob("hf_train_files", &format!("gs://{BUCKET}/same/*.jsonl")).unwrap();
    assert_eq!(files, [PathBuf::from(&remote_jsonl)]);
    let e = GcsFiles.glob("hf_train_files", &format!("gs://{BUCKET}/same/*.txt")).unwrap_err().to_string();
    assert!(e.contains("matches no file"), "{e}");
}

/// A loopback proxy to `upstream` that cuts the connection `bytes_in` bytes into the body of
/// each of the first `cuts` ranged-read responses (`206 Partial Content`).
fn cutting_proxy(upstream: String, bytes_in: usize, cuts: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let done = Arc::new(AtomicUsize::new(0));
    let counter = done.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(&upstream) else { return };
            let (mut client_in, mut server_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client_in, &mut server_out);
                let _ = server_out.shutdown(Shutdown::Write);
            });
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                let mut armed: Option<usize> = None;
                loop {
                    let n = match server.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let chunk = &buf[..n];
                    if armed.is_none() && counter.load(Ordering::SeqCst) < cuts {
                        if let Some(at) = chunk.windows(12).position(|w| w == b"HTTP/1.1 206") {
                            armed = Some(at + bytes_in);
                        }
                    }
                    match armed {
                        Some(left) if left < n => {
                            let _ = client.write_all(&chunk[..left]);
                            counter.fetch_add(1, Ordering::SeqCst);
                            let _ = client.shutdown(Shutdown::Both);
                            let _ = server.shutdown(Shutdown::Both);
                            return;
                        }
                        Some(left) => armed = Some(left - n),
                        None => {}
                    }
                    if client.write_all(chunk).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(Shutdown::Both);
            });
        }
    });
    (url, done)
}

fn losses(metrics: &Path) -> BTreeMap<u64, f64> {
    std::fs::read_to_string(metrics)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_f64().unwrap() as u64, v["learning/loss"].as_f64().unwrap())
        })
        .collect()
}

fn train(args: &[String], emulator: &str, log: &Path) -> Child {
    let (out, err) =
        (File::create(log.with_extension("out")).unwrap(), File::create(log.with_extension("err")).unwrap());
    Command::new(MAXRS)
        .arg("train")
        .args(args)
        .env("STORAGE_EMULATOR_HOST", emulator)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap()
}

fn finish(mut child: Child, log: &Path) {
    let status = child.wait().unwrap();
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    assert!(status.success(), "{}{err}", std::fs::read_to_string(log.with_extension("out")).unwrap_or_default());
}

#[test]
fn sft_run_reads_its_bucket_through_cut_connections_and_resumes_after_a_kill() {
    let Some(emulator) = crate::common::gcs_emulator::start(&[BUCKET]) else { return };
    let (lines, _) = repeat_conversations(240, 3);
    let lines: Vec<&str> = lines.lines().collect();
    upload("sft/train-0.jsonl", (lines[..120].join("\n") + "\n").as_bytes());
    upload("sft/train-1.jsonl", (lines[120..].join("\n") + "\n").as_bytes());
    let d = tempfile::tempdir().unwrap();
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat/qwen3");
    let args = |metrics: &str, extra: &[String]| -> Vec<String> {
        // The small model with room for the chat tokenizer's 515 tokens and a conversation.
        let mut a: Vec<String> = crate::common::small_model(&[])
            .into_iter()
            .filter(|a| !a.starts_with("vocab_size=") && !a.starts_with("max_target_length="))
            .collect();
        a.extend(
            [
                "per_device_batch_size=4",
                "vocab_size=1024",
                "max_target_length=64",
                "dataset_type=hf",
                "use_sft=true",
                "sft_train_on_completion_only=true",
                "train_data_columns=[messages]",
                "tokenizer_type=huggingface",
                "steps=14",
                "enable_tensorboard=false",
                "gcs_metrics=false",
                "save_config_to_gcs=false",
            ]
            .map(String::from),
        );
        a.push(format!("hf_train_files=gs://{BUCKET}/sft/train-*.jsonl"));
        a.push(format!("tokenizer_path={}", tokenizer.display()));
        a.push(format!("metrics_file={}", d.path().join(metrics).display()));
        a.extend(extra.iter().cloned());
        a
    };
    let log = d.path().join("whole");
    finish(train(&args("whole.jsonl", &[]), &emulator.url, &log), &log);
    let want = losses(&d.path().join("whole.jsonl"));
    assert_eq!(want.len(), 14);

    let (proxy, cuts) = cutting_proxy(emulator.url.trim_start_matches("http://").to_string(), 1500, 3);
    let ckpt = [
        format!("base_output_directory={}", d.path().join("out").display()),
        "run_name=r".into(),
        "enable_checkpointing=true".into(),
        "checkpoint_period=4".into(),
        "async_checkpointing=false".into(),
    ];
    let resumable = args("run.jsonl", &ckpt);
    let log = d.path().join("killed");
    let mut child = train(&resumable, &proxy, &log);
    let manifest = d.path().join("out/r/checkpoints/4/manifest.json");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !manifest.exists() {
        assert!(child.try_wait().unwrap().is_none(), "maxrs exited before its checkpoint of step 4");
        assert!(Instant::now() < deadline, "no checkpoint of step 4 within 300 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let log = d.path().join("rerun");
    finish(train(&resumable, &proxy, &log), &log);
    let stdout = std::fs::read_to_string(log.with_extension("out")).unwrap();
    assert!(stdout.contains("resuming from the checkpoint of step"), "{stdout}");
    assert!(cuts.load(Ordering::SeqCst) >= 1, "the proxy cut no ranged read");
    assert_eq!(losses(&d.path().join("run.jsonl")), want, "the cut, killed and resumed run's losses");
}

#[test]
fn a_token_file_in_a_bucket_is_read_row_by_row() {
    let Some(_emulator) = crate::common::gcs_emulator::start(&[BUCKET]) else { return };
    use maxrs::data::TokensFile;
    let rows: Vec<i32> = (0..5 * 9).map(|i| (i * 7) % 50).collect();
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    let remote = upload("tokens/t.bin", &bytes);
    let file = TokensFile::open_at(&remote, 8, 50).unwrap();
    assert_eq!(file.num_rows(), 5);
    for r in 0..5 {
        assert_eq!(file.row(r).unwrap(), rows[9 * r as usize..9 * (r as usize + 1)]);
    }
    let ragged = upload("tokens/ragged.bin", &bytes[..bytes.len() - 4]);
    let e = TokensFile::open_at(&ragged, 8, 50).unwrap_err().to_string();
    assert!(e.contains("ragged.bin") && e.contains("row size 36 bytes"), "{e}");
    let e = TokensFile::open_at(&format!("gs://{BUCKET}/tokens/missing.bin"), 8, 50).unwrap_err().to_string();
    assert!(e.contains("dataset_path") && e.contains("no such object"), "{e}");
}
