//! Where the commands write files: never over anything before the whole output is ready.
//!
//! A regular file (or a new one) is written to a temporary file beside it and renamed over it
//! only by [`OutputFile::commit`]: a failure midway, or an error found before the first byte,
//! leaves what was there untouched and no partial file. A device or a FIFO (`/dev/null`, a
//! named pipe) is written in place, never replaced; `-` is standard output; a directory is
//! refused by name.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use synapse_gguf::files::{replace_with, special_kind, temp_beside};
use tempfile::NamedTempFile;

pub struct OutputFile {
    path: PathBuf,
    sink: Sink,
}

enum Sink {
    Temp(BufWriter<NamedTempFile>),
    InPlace(BufWriter<File>),
    Stdout(BufWriter<io::Stdout>),
}

impl OutputFile {
    /// Open the output `path` for writing (see the module's doc); call it after the inputs are
    /// checked, as a FIFO's reader sees the output begin here.
    pub fn create(path: &Path) -> Result<OutputFile> {
        let at = || path.display().to_string();
        let sink = if path.as_os_str() == "-" {
            Sink::Stdout(BufWriter::new(io::stdout()))
        } else {
            let meta = match std::fs::metadata(path) {
                Ok(meta) => Some(meta),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).with_context(at),
            };
            match meta {
                Some(meta) if meta.is_dir() => bail!("{}: is a directory", at()),
                Some(meta) if special_kind(&meta).is_some() => {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .open(path)
                        .with_context(at)?;
                    Sink::InPlace(BufWriter::with_capacity(1 << 20, f))
                }
                _ => Sink::Temp(BufWriter::with_capacity(
                    1 << 20,
                    temp_beside(path).with_context(at)?,
                )),
            }
        };
        Ok(OutputFile {
            path: path.to_path_buf(),
            sink,
        })
    }

    /// Whether the output goes to standard output (`-`).
    pub fn is_stdout(&self) -> bool {
        matches!(self.sink, Sink::Stdout(_))
    }

    /// Finish: flush, and put a temporary file in place of the target.
    pub fn commit(self) -> Result<()> {
        let at = || self.path.display().to_string();
        match self.sink {
            Sink::Temp(w) => {
                let tmp = w
                    .into_inner()
                    .map_err(|e| e.into_error())
                    .with_context(at)?;
                replace_with(tmp, &self.path).with_context(at)?;
            }
            Sink::InPlace(mut w) => w.flush().with_context(at)?,
            Sink::Stdout(mut w) => w.flush()?,
        }
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.sink {
            Sink::Temp(w) => w.write(buf),
            Sink::InPlace(w) => w.write(buf),
            Sink::Stdout(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Temp(w) => w.flush(),
            Sink::InPlace(w) => w.flush(),
            Sink::Stdout(w) => w.flush(),
        }
    }
}
