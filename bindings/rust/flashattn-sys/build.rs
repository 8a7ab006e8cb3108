//! Links libflashattn. The bindings themselves are pre-generated (src/bindings.rs), so building
//! needs no libclang. The library is looked for in FLASHATTN_LIB_DIR, else where
//! `pkg-config flashattn` says (PKG_CONFIG and PKG_CONFIG_PATH are honoured), else in the
//! linker's default paths. Crates depending on this one read the folder as DEP_FLASHATTN_LIB_DIR.
use std::env;
use std::process::Command;

fn pkg_config_libdir() -> Option<String> {
    let exe = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_owned());
    let out = Command::new(exe).args(["--variable=libdir", "flashattn"]).output().ok()?;
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !dir.is_empty()).then_some(dir)
}

fn main() {
    for var in ["FLASHATTN_LIB_DIR", "PKG_CONFIG", "PKG_CONFIG_PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let dir = env::var("FLASHATTN_LIB_DIR").ok().filter(|d| !d.is_empty()).or_else(pkg_config_libdir);
    match dir {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:lib_dir={dir}");
        }
        None => println!(
            "cargo:warning=libflashattn not found through FLASHATTN_LIB_DIR or pkg-config; \
             relying on the linker's default paths"
        ),
    }
    println!("cargo:rustc-link-lib=dylib=flashattn");
}
