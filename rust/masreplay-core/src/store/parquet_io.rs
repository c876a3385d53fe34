//! Parquet files in the canonical layout. The Arrow schema is embedded, so dictionary columns
//! come back as dictionaries. Writes go to a temporary file of a unique name beside the target,
//! are synced to disk, then renamed into place: a failed or killed write never leaves a half
//! file under the final name, and two writes at once never share a temporary file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

use super::{WellFormed, batches_or_empty};
use crate::error::{MasreplayError, Result};

fn io_error(path: &Path, source: std::io::Error) -> MasreplayError {
    MasreplayError::Io { path: path.display().to_string(), source }
}

/// Temporary files end so; their names start with `.{target name}.`.
const TEMPORARY_SUFFIX: &str = ".masreplay-partial";

/// A temporary file older than this whose writer no longer holds its lock is left over from a
/// killed write. The age spares a file that another writer has created but not yet locked.
const LEFTOVER_AGE: Duration = Duration::from_secs(60);

fn temporary_prefix(path: &Path) -> Option<String> {
    path.file_name().map(|name| format!(".{}.", name.to_string_lossy()))
}

/// A name no other write of this or another process uses: pid, a per-process counter, time.
fn temporary_path(path: &Path) -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = temporary_prefix(path)
        .ok_or_else(|| MasreplayError::InvalidArgument(format!("{} does not name a file", path.display())))?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or_default();
    let unique = format!("{}-{}-{nanos:08x}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    Ok(path.with_file_name(format!("{prefix}{unique}{TEMPORARY_SUFFIX}")))
}

/// Removes the temporary files that killed writes to `path` left behind. A file is left over
/// when no writer holds its lock (the lock dies with its process) and it is not brand new.
fn remove_leftovers(path: &Path) {
    let (Some(prefix), Some(folder)) = (temporary_prefix(path), path.parent()) else { return };
    let folder = if folder.as_os_str().is_empty() { Path::new(".") } else { folder };
    let Ok(entries) = std::fs::read_dir(folder) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(&prefix) && name.ends_with(TEMPORARY_SUFFIX)) {
            continue;
        }
        let old = entry.metadata().ok().and_then(|m| m.modified().ok()).and_then(|m| m.elapsed().ok());
        if old.is_none_or(|age| age < LEFTOVER_AGE) {
            continue;
        }
        if let Ok(file) = File::open(entry.path())
            && file.try_lock().is_ok()
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Refuses a target that exists and is neither a file nor a link: the rename would put a
/// Parquet file in the place of a folder's entry for a device, a pipe or a socket (as root,
/// `/dev/null` itself).
fn check_replaceable(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(found) if !(found.is_file() || found.is_symlink()) => {
            let what = if found.is_dir() { "a folder" } else { "not a regular file (a device, a pipe or a socket)" };
            let reason = format!("is {what}; a write replaces a regular file only");
            Err(io_error(path, std::io::Error::new(std::io::ErrorKind::InvalidInput, reason)))
        }
        _ => Ok(()),
    }
}

pub fn write_parquet(batch: &RecordBatch, path: &Path) -> Result<()> {
    check_replaceable(path)?;
    let partial = temporary_path(path)?;
    let write = || -> Result<()> {
        let mut file = File::create_new(&partial).map_err(|e| io_error(&partial, e))?;
        // Held until the file is renamed: it tells a later write that this one is alive.
        file.lock().map_err(|e| io_error(&partial, e))?;
        let properties = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
        let mut writer = ArrowWriter::try_new(&mut file, batch.schema(), Some(properties))?;
        writer.write(batch)?;
        writer.close()?;
        file.flush().map_err(|e| io_error(&partial, e))?;
        file.sync_all().map_err(|e| io_error(&partial, e))?;
        std::fs::rename(&partial, path).map_err(|e| io_error(path, e))?;
        // The rename is durable once the folder's entry is on disk too.
        if let Some(folder) = path.parent().filter(|f| !f.as_os_str().is_empty())
            && let Ok(folder) = File::open(folder)
        {
            let _ = folder.sync_all();
        }
        Ok(())
    };
    let outcome = write();
    if outcome.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    remove_leftovers(path);
    outcome
}

/// Reads one Parquet file, all of its row groups. Any failure, including a panic of the
/// Parquet decoder on a corrupted file (caught here as a last resort), names the file.
pub fn read_parquet(path: &Path) -> Result<WellFormed> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let named = |reason: String| MasreplayError::DataFormat { path: path.display().to_string(), reason };
    let read = move || -> Result<WellFormed> {
        let parquet = |e: ParquetError| named(e.to_string());
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet)?.with_batch_size(8192);
        // The reader's batches drop the schema metadata that the file keeps; put it back.
        let schema = builder.schema().clone();
        let reader = builder.build().map_err(parquet)?;
        let batches = reader
            .map(|batch| {
                crate::interrupt::checkpoint()?;
                batch.and_then(|b| b.with_schema(schema.clone())).map_err(|e| named(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let batches = batches_or_empty(batches, schema);
        // A decoder is only as sound as the file: prove the arrays well-formed here, where the
        // error can name the file.
        WellFormed::check(&batches).map_err(|e| named(e.to_string()))
    };
    match crate::error::catch_panic(read) {
        Ok(outcome) => outcome,
        Err(message) => Err(named(format!(
            "the file is corrupted: the Parquet decoder panicked on it ({message}); a panic caught is a bug, \
             please report it to masreplay"
        ))),
    }
}
