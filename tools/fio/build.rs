//! Compiles `src/shim.c` against the configured fio source tree in `USNVME_FIO_SOURCE` (set by
//! `cargo xtask fio-engine`, which fetches the installed fio's exact version). Without it only
//! the Rust half is built (for its tests): the library then has no `ioengine` for fio to find.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=USNVME_FIO_SOURCE");
    println!("cargo:rerun-if-env-changed=USNVME_FIO_VERSION");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rustc-check-cfg=cfg(usnvme_fio_shim)");
    let Some(fio) = std::env::var_os("USNVME_FIO_SOURCE").map(PathBuf::from) else {
        return;
    };
    let config = fio.join("config-host.h");
    if !config.exists() {
        panic!(
            "{} is missing: USNVME_FIO_SOURCE must be a configured fio tree (cargo xtask fio-engine makes one)",
            config.display()
        );
    }
    // The fio version the engine expects to be loaded by ("fio-3.33"): the shim refuses others.
    let version = std::env::var("USNVME_FIO_VERSION").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rerun-if-changed={}", config.display());
    cc::Build::new()
        .file("src/shim.c")
        .include(&fio)
        // as fio's own Makefile compiles it: the same structure layouts
        .flag("-std=gnu99")
        .flag("-include")
        .flag(config.to_str().expect("a UTF-8 path"))
        .define("_GNU_SOURCE", None)
        .define("_LARGEFILE_SOURCE", None)
        .define("_FILE_OFFSET_BITS", "64")
        .define("FIO_INTERNAL", None)
        .define("BITS_PER_LONG", "64")
        .define("USNVME_FIO_VERSION", format!("\"{version}\"").as_str())
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(true)
        .compile("usnvme_fio_shim");
    println!("cargo:rustc-cfg=usnvme_fio_shim");
}
