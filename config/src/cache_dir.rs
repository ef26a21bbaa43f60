//! The cache directory a config names: writable, or creatable, checked apart from parsing
//! (parsing alone must not touch the disk), and created only by `run`.

use crate::Config;
use crate::validate::{Invalid, invalid};

/// Whether checking the cache directory may create it: `run` does; `check` and `upgrade`, which
/// only say whether a start would work, create nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dirs {
    /// Create the directory if needed, and write into it.
    Create,
    /// Leave the disk as it is: the directory, or the nearest of its parents that exists, must
    /// let this user write (the directory would be created there).
    Untouched,
}

/// Checks the cache directory without touching the disk: it exists as a directory this user may
/// write and search, or the nearest parent that exists does (so `run` can create it).
fn check_cache_dir_untouched(dir: &std::path::Path) -> Result<(), Invalid> {
    let fail = |why: String| invalid("cache.path", why);
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if !m.is_dir() => {
                return Err(fail(format!(
                    "`{}` is not a directory{}",
                    at.display(),
                    if at == dir {
                        ""
                    } else {
                        ", so the cache directory cannot be created"
                    }
                )));
            }
            Ok(_) => {
                return nix::unistd::access(
                    at,
                    nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
                )
                .map_err(|e| {
                    let what = if at == dir {
                        "write into".to_string()
                    } else {
                        format!("create `{}` in", dir.display())
                    };
                    fail(format!("cannot {what} `{}`: {e}", at.display()))
                });
            }
            // A link to nothing: `run` could not create the directory where the link is.
            Err(_) if std::fs::symlink_metadata(at).is_ok_and(|m| m.is_symlink()) => {
                return Err(fail(format!(
                    "`{}` is a symbolic link to a path that does not exist",
                    at.display()
                )));
            }
            // Absent, or below a file: the nearest parent that exists says why.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => at = p,
                    // A relative path's first component: created in the working directory.
                    _ => at = std::path::Path::new("."),
                }
            }
            Err(e) => return Err(fail(format!("cannot read `{}`: {e}", at.display()))),
        }
    }
}

/// Checks the cache directory is writable, creating it first when `dirs` says so (a separate
/// step: parsing alone must not touch the disk).
pub fn check_cache_dir(config: &Config, dirs: Dirs) -> Result<(), Invalid> {
    if dirs == Dirs::Untouched {
        return check_cache_dir_untouched(&config.cache.path);
    }
    let dir = &config.cache.path;
    let fail = |what: &str, e: std::io::Error| {
        invalid(
            "cache.path",
            format!("cannot {what} `{}`: {e}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| fail("create", e))?;
    let probe = dir.join(format!(".zerocache-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| fail("write into", e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}
