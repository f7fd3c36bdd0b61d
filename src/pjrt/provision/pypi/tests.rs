use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use super::*;

/// The start of PyPI's real page for the CPU plugin (captured), plus the forms mirrors use:
/// relative links, single quotes, entities, and a link without a hash (which must be skipped).
const HTML: &str = r#"<!DOCTYPE html>
<html>
<head><title>Links for lammps-jax-pjrt-cpu</title></head>
<body>
<h1>Links for lammps-jax-pjrt-cpu</h1>
<a href="https://files.pythonhosted.org/packages/e5/90/f04e5ea9e56f01965b4cd56bc3cf4801a563cd47b74d4ded5780f19c3a7c/lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl#sha256=1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1" data-requires-python="&gt;=3.10">lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl</a><br/>
<A HREF='../../files/demo-1.0-py3-none-manylinux2014_aarch64.whl?x=1&amp;y=2#sha256=ABCDEF'>demo-1.0-py3-none-manylinux2014_aarch64.whl</A>
<a href="nohash-1.0-py3-none-any.whl">nohash-1.0-py3-none-any.whl</a>
</body>
</html>
"#;

fn page() -> Url {
    Url::parse("https://mirror.example/simple/lammps-jax-pjrt-cpu/").unwrap()
}

#[test]
fn parses_pep503_html() {
    let files = parse_index(HTML, "text/html; charset=utf-8", &page()).unwrap();
    assert_eq!(
        files,
        vec![
            WheelFile {
                filename: "lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl".into(),
                url: "https://files.pythonhosted.org/packages/e5/90/f04e5ea9e56f01965b4cd56bc3cf4801a563cd47b74d4ded5780f19c3a7c/lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl".into(),
                sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1".into(),
            },
            WheelFile {
                filename: "demo-1.0-py3-none-manylinux2014_aarch64.whl".into(),
                url: "https://mirror.example/files/demo-1.0-py3-none-manylinux2014_aarch64.whl?x=1&y=2".into(),
                sha256: "abcdef".into(),
            },
        ]
    );
}

#[test]
fn parses_pep691_json() {
    let json = r#"{"meta":{"api-version":"1.1"},"name":"libtpu","files":[
        {"filename":"libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl","url":"https://files.example/a/libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl","hashes":{"sha256":"AA11"}},
        {"filename":"libtpu-0.0.1.tar.gz","url":"/b/libtpu-0.0.1.tar.gz","hashes":{}}]}"#;
    let files = parse_index(json, "application/vnd.pypi.simple.v1+json", &page()).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].sha256, "aa11");
    assert!(parse_index("{", "application/vnd.pypi.simple.v1+json", &page()).is_err());
}

fn file(name: &str) -> WheelFile {
    WheelFile { filename: name.into(), url: format!("https://x/{name}"), sha256: "00".into() }
}

#[test]
fn picks_pinned_linux_wheel_for_arch() {
    let files: Vec<_> = [
        "jax_cuda12_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
        "jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_aarch64.whl",
        "jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_x86_64.whl",
        "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "nvidia_cuda_nvcc-13.0.88-py3-none-win_amd64.whl",
        "libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl",
        "libtpu-0.0.52-cp312-cp312-manylinux_2_31_x86_64.whl",
        "mistral_common-1.13.1-py3-none-any.whl",
    ]
    .into_iter()
    .map(file)
    .collect();
    let name = |p: Option<&WheelFile>| p.map(|f| f.filename.clone());
    assert_eq!(
        name(pick(&files, "jax-cuda12-pjrt", "0.12.0.1", "x86_64")).as_deref(),
        Some("jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_x86_64.whl")
    );
    assert_eq!(
        name(pick(&files, "jax-cuda12-pjrt", "0.12.0.1", "aarch64")).as_deref(),
        Some("jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_aarch64.whl")
    );
    assert_eq!(
        name(pick(&files, "nvidia-cuda-nvcc", "13.0.88", "x86_64")).as_deref(),
        Some("nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    );
    assert_eq!(
        name(pick(&files, "libtpu", "0.0.52", "x86_64")).as_deref(),
        Some("libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl")
    );
    assert_eq!(pick(&files, "libtpu", "0.0.52", "aarch64"), None);
    assert_eq!(
        name(pick(&files, "mistral-common", "1.13.1", "aarch64")).as_deref(),
        Some("mistral_common-1.13.1-py3-none-any.whl"),
        "pure-Python wheels fit every machine"
    );
    assert_eq!(pick(&files, "jax-cuda12-pjrt", "0.12", "x86_64"), None);
}

/// Serves `body` once over plain HTTP on localhost; returns the URL.
fn serve_once(body: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
            line.clear();
        }
        let mut stream = stream;
        write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).unwrap();
        stream.write_all(body).unwrap();
    });
    format!("http://{addr}/demo-1.0-py3-none-any.whl")
}

fn local_client() -> Client {
    Client::builder().no_proxy().build().unwrap()
}

const BODY: &[u8] = b"wheel bytes";
/// A well-formed hash that is not BODY's.
const WRONG_SHA: &str = "0e5b64ae5dba4d2d8f4e1d3ff1ab8d9f35c3d6c3ab6b1d5c63fc9e5bc1a46a8f";

fn body_sha() -> String {
    Sha256::digest(BODY).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn download_keeps_verified_file() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = WheelFile { filename: "demo".into(), url: serve_once(BODY), sha256: body_sha() };
    let tmp = download(&local_client(), &wheel, dir.path()).unwrap();
    assert_eq!(std::fs::read(tmp.path()).unwrap(), BODY);
}

#[test]
fn sha256_mismatch_is_refused_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    assert_ne!(WRONG_SHA, body_sha(), "the test needs a wrong hash");
    let wheel = WheelFile { filename: "demo".into(), url: serve_once(BODY), sha256: WRONG_SHA.into() };
    let err = download(&local_client(), &wheel, dir.path()).unwrap_err().to_string();
    assert!(err.contains("sha256 mismatch") && err.contains(WRONG_SHA) && err.contains(&body_sha()), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a rejected download must leave nothing");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, failure_persistence: None, ..Default::default() })]

    /// Index pages are untrusted bytes from the network (or a mirror): any body parses to a
    /// list or an error, never a panic.
    #[test]
    fn index_pages_never_panic(body in "(<[aA] [hH][rR][eE][fF]=['\"]?[^>]{0,40}>?[^<]{0,20}(</a>)?|[^<]{0,10}|&[a-z#0-9]{0,5};?){0,8}") {
        let _ = parse_index(&body, "text/html", &page());
        let _ = parse_index(&body, PEP691_JSON, &page());
    }
}

#[test]
fn the_index_url_is_checked_and_its_password_never_shown() {
    let page = index_page("https://user:s3cret@mirror.example/simple/", "Jax-Cuda12-PJRT").unwrap();
    assert_eq!(page.as_str(), "https://user:s3cret@mirror.example/simple/jax-cuda12-pjrt/");
    assert_eq!(shown(&page), "https://user:***@mirror.example/simple/jax-cuda12-pjrt/");
    // A query stays a query: the package goes into the path.
    assert_eq!(
        index_page("http://127.0.0.1:8080/simple?x=1", "demo").unwrap().as_str(),
        "http://127.0.0.1:8080/simple/demo/?x=1"
    );
    for bad in ["mirror.example/simple", "file:///etc/simple", "ftp://mirror/simple", "https://"] {
        let e = index_page(bad, "demo").unwrap_err().to_string();
        assert!(e.starts_with(&format!("MAXRS_PYPI_INDEX={bad:?}")) && e.contains("http(s) URL"), "{e}");
    }
    let e = index_page("ftp://user:s3cret@mirror/simple", "demo").unwrap_err().to_string();
    assert!(!e.contains("s3cret"), "{e}");
}
