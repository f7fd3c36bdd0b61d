//! The storage seam (`maxrs::storage`) on both backends: a local temporary directory and a real
//! GCS emulator (fake-gcs-server, started here). The same checks run on each: atomic writes,
//! streaming multi-part uploads, listing, staged directories and deletion.

use std::io::{Read, Write};

use maxrs::files::Location;
use maxrs::input::SETTINGS;
use maxrs::storage::{self, StagedDir};

fn exercise(root: &Location) {
    let file = root.join("a/b/file.bin");
    storage::write(&file, b"hello").unwrap();
    assert_eq!(storage::read(&file, SETTINGS).unwrap(), b"hello");
    assert!(storage::is_file(&file).unwrap());
    assert!(!storage::is_file(&root.join("a/b/absent")).unwrap());

    // A streamed file larger than one upload part (32 MiB), written in uneven pieces.
    let big: Vec<u8> = (0..(40u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut writer = storage::create(&root.join("a/big.bin")).unwrap();
    for piece in big.chunks(3 << 20) {
        writer.write_all(piece).unwrap();
    }
    // Not visible before it is finished.
    assert!(!storage::is_file(&root.join("a/big.bin")).unwrap());
    assert_eq!(writer.finish().unwrap(), big.len() as u64);
    let mut back = Vec::new();
    storage::open_read(&root.join("a/big.bin")).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == big, "the big file reads back as written");

    // An abandoned writer leaves nothing.
    let mut writer = storage::create(&root.join("a/abandoned.bin")).unwrap();
    writer.write_all(b"partial").unwrap();
    drop(writer);
    let names: Vec<String> = storage::list_dir(&root.join("a")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["b", "big.bin"], "listing of {}", root.join("a"));

    // A staged directory appears (committed) under its final name.
    let target = root.join("dirs/7");
    let staged = StagedDir::start(&target, "manifest.json").unwrap();
    storage::write(&staged.path().join("data.bin"), b"data").unwrap();
    storage::write(&staged.path().join("manifest.json"), b"{}").unwrap();
    let committed = staged.commit().unwrap();
    assert_eq!(committed, target);
    assert_eq!(storage::read(&target.join("data.bin"), SETTINGS).unwrap(), b"data");
    let dirs = storage::list_dir(&root.join("dirs")).unwrap();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].is_dir && dirs[0].name == "7");
    assert!(StagedDir::start(&target, "manifest.json").is_err(), "a committed directory is not overwritten");

    storage::remove_all(&root.join("a")).unwrap();
    assert!(storage::list_dir(&root.join("a")).unwrap().is_empty());
    assert!(storage::read(&root.join("a/b/file.bin"), SETTINGS).is_err());
}

#[test]
fn local_files() {
    let dir = tempfile::tempdir().unwrap();
    exercise(&Location::Local(dir.path().to_path_buf()));
    // A local staged directory is a `.maxrs-tmp` sibling until committed.
    let target = Location::Local(dir.path().join("ckpt/3"));
    let staged = StagedDir::start(&target, "manifest.json").unwrap();
    assert!(dir.path().join("ckpt/3.maxrs-tmp").is_dir());
    staged.abandon().unwrap();
    assert!(!dir.path().join("ckpt/3.maxrs-tmp").exists());
}

#[test]
fn gcs_emulator() {
    let Some(_emulator) = crate::common::gcs_emulator::start(&["maxrs-storage-test"]) else { return };
    exercise(&Location::parse("gs://maxrs-storage-test/run").unwrap());
}

#[test]
fn locations_parse_and_join() {
    let gs = Location::parse("gs://bucket/some/dir/").unwrap();
    assert_eq!(gs, Location::Gcs { bucket: "bucket".into(), key: "some/dir".into() });
    assert_eq!(gs.join("x/y").to_string(), "gs://bucket/some/dir/x/y");
    assert_eq!(gs.join("x").parent(), Some(gs.clone()));
    assert_eq!(gs.join("x").file_name(), "x");
    assert!(Location::parse("gs:///key").unwrap_err().to_string().contains("bucket"));
    assert!(Location::parse("s3://b/k").unwrap_err().to_string().contains("not supported"));
    assert_eq!(Location::parse("rel/path").unwrap(), Location::Local("rel/path".into()));
}
