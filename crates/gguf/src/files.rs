//! Paths checked before they are opened or replaced: a model must be a regular file, and an
//! output is written to a temporary file beside its target and renamed over it only once
//! complete, and only over a regular file.

use std::fs::Metadata;
use std::path::Path;

use crate::error::{GgufError, Result};

/// What kind of thing `meta` describes, in words, if not a regular file.
pub fn special_kind(meta: &Metadata) -> Option<&'static str> {
    let ty = meta.file_type();
    if ty.is_file() {
        return None;
    }
    if ty.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ty.is_char_device() {
            return Some("a character device");
        }
        if ty.is_block_device() {
            return Some("a block device");
        }
        if ty.is_fifo() {
            return Some("a FIFO");
        }
        if ty.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a file")
}

/// Ok if `path` is a regular file (following links), or absent where `absent_ok`; else an
/// error that names what it is.
pub fn expect_regular(path: &Path, absent_ok: bool) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) => match special_kind(&meta) {
            None => Ok(()),
            Some(what) => Err(GgufError::NotAFile {
                path: path.to_path_buf(),
                what,
            }),
        },
        Err(e) if absent_ok && e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(GgufError::Io {
            path: path.to_path_buf(),
            error,
        }),
    }
}

/// A temporary file in `target`'s directory, to be renamed over `target` once complete
/// ([`tempfile::NamedTempFile::persist`]); removed if dropped before. It gets `target`'s
/// permissions where `target` exists, else the usual ones for a new file (0666 less the
/// umask), not the 0600 of a temporary file.
pub fn temp_beside(target: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        let e = format!("{} is not a directory that exists", dir.display());
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, e));
    }
    let mut b = tempfile::Builder::new();
    b.prefix(".synapse-").suffix(".part");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let tmp = b.tempfile_in(dir)?;
    if let Ok(meta) = std::fs::metadata(target) {
        tmp.as_file().set_permissions(meta.permissions())?;
    }
    Ok(tmp)
}

/// Put a complete temporary file from [`temp_beside`] in place of `target`: synced first, so
/// that what the rename exposes is on disk.
pub fn replace_with(tmp: tempfile::NamedTempFile, target: &Path) -> std::io::Result<()> {
    tmp.as_file().sync_all()?;
    tmp.persist(target).map_err(|e| e.error)?;
    Ok(())
}
