//! Finding an up-to-date `strata` binary.
//!
//! `env!("CARGO_BIN_EXE_strata")` exists only for tests inside the `strata` package, and a
//! bin-only package cannot be a dependency, so this crate builds the binary itself: once per
//! test process (a `OnceLock`), `cargo build -p strata` into the same target directory and
//! profile as the running test. Why this way and not the alternatives:
//!
//! - Cargo releases its build lock before it runs test binaries, so the nested build does not
//!   deadlock, and when the binary is fresh it is a no-op of well under a second.
//! - Building here rather than only in `.ci/run` means a plain `cargo test --workspace` (or
//!   `cargo test -p strata-tests`) from a clean clone works, and can never test a stale binary
//!   left by some earlier build after the server's code changed.
//! - `escargot` does the same thing with more machinery (and would need its own target dir).
//!
//! `STRATA_BIN=/path/to/strata` skips the build and tests that binary instead (for example a
//! release build, or one built with a `--target` triple, whose path this module cannot guess).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

static STRATA_BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The path of a `strata` binary built from the current sources. Panics with the build's
/// output if it does not compile.
pub fn strata_binary() -> &'static Path {
    match STRATA_BINARY.get_or_init(locate_or_build) {
        Ok(path) => path,
        Err(why) => panic!("no strata binary to test: {why}"),
    }
}

fn locate_or_build() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("STRATA_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("STRATA_BIN={} is not a file", path.display()))
        };
    }
    let layout = TargetLayout::of_running_test()?;
    build_strata(&layout)?;
    let binary = layout
        .profile_dir
        .join(format!("strata{}", std::env::consts::EXE_SUFFIX));
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!(
            "cargo build -p strata succeeded but {} does not exist",
            binary.display()
        ))
    }
}

/// Where the running test binary was built, so the broker is built to match it.
struct TargetLayout {
    target_dir: PathBuf,
    profile_dir: PathBuf,
    /// The cargo profile whose output directory is `profile_dir` (`debug` holds `dev`).
    profile: String,
}

impl TargetLayout {
    /// A test binary runs from `<target>/<profile dir>/deps/`, a binary of the workspace (the
    /// fault-injection harness) from `<target>/<profile dir>/`, whatever `CARGO_TARGET_DIR` or
    /// `--release` said, so the layout is read off its own path.
    fn of_running_test() -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let exe_dir = exe
            .parent()
            .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
        let profile_dir = if exe_dir.ends_with("deps") {
            exe_dir.parent().ok_or("deps/ has no parent")?
        } else {
            exe_dir
        };
        let target_dir = profile_dir.parent().ok_or("profile dir has no parent")?;
        let dir_name = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("profile dir has no UTF-8 name")?;
        let profile = if dir_name == "debug" { "dev" } else { dir_name };
        Ok(Self {
            target_dir: target_dir.to_path_buf(),
            profile_dir: profile_dir.to_path_buf(),
            profile: profile.to_string(),
        })
    }
}

fn build_strata(layout: &TargetLayout) -> Result<(), String> {
    // Cargo sets CARGO for the processes it runs; the compile-time value covers running the
    // test binary by hand.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let workspace_root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("strata-tests has no parent directory")?;
    let started = Instant::now();
    let output = Command::new(cargo)
        .current_dir(workspace_root)
        .args(["build", "--quiet", "--package", "strata", "--bin", "strata"])
        .arg("--profile")
        .arg(&layout.profile)
        .arg("--target-dir")
        .arg(&layout.target_dir)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build -p strata failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    eprintln!(
        "strata-tests: cargo build -p strata ({}) took {:.1?}",
        layout.profile,
        started.elapsed()
    );
    Ok(())
}
