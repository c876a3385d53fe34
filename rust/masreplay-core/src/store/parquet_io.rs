//! Parquet files in the canonical layout. The Arrow schema is embedded, so dictionary columns
//! come back as dictionaries; files are written beside the target and renamed into place, so a
//! failed write never leaves a half file under the final name.

use std::fs::File;
use std::path::Path;

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{MasreplayError, Result};

fn io_error(path: &Path, source: std::io::Error) -> MasreplayError {
    MasreplayError::Io { path: path.display().to_string(), source }
}

pub fn write_parquet(batch: &RecordBatch, path: &Path) -> Result<()> {
    let partial = path.with_extension("parquet.partial");
    let write = || -> Result<()> {
        let file = File::create(&partial).map_err(|e| io_error(&partial, e))?;
        let properties = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties))?;
        writer.write(batch)?;
        writer.close()?;
        std::fs::rename(&partial, path).map_err(|e| io_error(path, e))
    };
    let outcome = write();
    if outcome.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    outcome
}

/// Reads one Parquet file, all of its row groups.
pub fn read_parquet(path: &Path) -> Result<Vec<RecordBatch>> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)?.with_batch_size(8192);
    // The reader's batches drop the schema metadata that the file keeps; put it back.
    let schema = builder.schema().clone();
    let reader = builder.build()?;
    reader.map(|batch| Ok(batch?.with_schema(schema.clone())?)).collect()
}
