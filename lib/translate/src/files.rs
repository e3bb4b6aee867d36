//! Reading YAML files and directories into a [`ClusterState`]: the one loader behind the
//! dataplane's standalone mode and `kubectl sluice`, so both see the same objects.
//!
//! - A path is a file (read whatever its name) or a directory, walked recursively for
//!   `*.yaml`/`*.yml`, skipping hidden entries, in sorted order.
//! - A file that is not YAML fails the whole load ([`SourceError::Yaml`]): a caller reloading
//!   configuration keeps its last good state.
//! - A document that is YAML but not a valid object is left out with a [`DocumentError`]; the
//!   others load.

use std::path::{Path, PathBuf};

use crate::state::{ClusterState, DocumentError};

/// Why a configuration source could not be read as a whole.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A file or directory could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid YAML.
    #[error("{0}")]
    Yaml(String),
}

/// The outcome of reading configuration files.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Objects read.
    pub state: ClusterState,
    /// Documents left out, each with file, object, field and reason.
    pub errors: Vec<DocumentError>,
    /// Informational lines (skipped kinds, replaced duplicates): worth logging, not errors.
    pub notes: Vec<String>,
}

/// Lists the YAML files of `path` (itself if a file), sorted, skipping hidden entries.
pub fn list_files(path: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let io = |source| SourceError::Io {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| SourceError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                files.push(p);
            }
        }
    }
    files.sort();
    Ok(files)
}

impl Loaded {
    /// Reads every file of `path` (see [`list_files`]) into [`Loaded::state`].
    pub fn load_path(&mut self, path: &Path) -> Result<(), SourceError> {
        for file in list_files(path)? {
            let text = std::fs::read_to_string(&file).map_err(|source| SourceError::Io {
                path: file.display().to_string(),
                source,
            })?;
            self.load_text(&file.display().to_string(), &text)?;
        }
        Ok(())
    }

    /// Loads one YAML text named `source` in messages (`-` for standard input).
    pub fn load_text(&mut self, source: &str, text: &str) -> Result<(), SourceError> {
        let report = self
            .state
            .load_yaml(source, text)
            .map_err(|e| SourceError::Yaml(e.to_string()))?;
        self.notes.extend(report.notes);
        self.errors.extend(report.errors);
        Ok(())
    }
}

/// Reads every file of `path` into a [`ClusterState`].
pub fn load(path: &Path) -> Result<Loaded, SourceError> {
    let mut loaded = Loaded::default();
    loaded.load_path(path)?;
    Ok(loaded)
}
