//! Where result files go. Every run's timestamped files are history: they go to a
//! directory outside the clone (`$SLUICE_CACHE/bench/results`, default
//! `~/.cache/sluice/bench/results`), so benchmark runs do not grow the repository. The
//! reference copies (`latest-*`: the newest run with the default dataplane flags) go to
//! `bench/results/` in the tree, where `bench/results/SUMMARY.md` tabulates them and the
//! scenario-2 plugin cost reads scenario 1's reference from.

use std::path::{Path, PathBuf};

use crate::BenchError;

/// The two destinations of a run's results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsDirs {
    /// Timestamped result files of every run (`--results-dir`; default
    /// [`default_history_dir`]).
    pub history: PathBuf,
    /// The `latest-*` reference copies: `<workspace>/bench/results`.
    pub latest: PathBuf,
}

impl ResultsDirs {
    /// `history` if given, else [`default_history_dir`]; `latest` in `workspace`.
    pub fn new(history: Option<PathBuf>, workspace: &Path) -> Self {
        Self {
            history: history.unwrap_or_else(default_history_dir),
            latest: workspace.join("bench").join("results"),
        }
    }

    /// Writes `text` to `history/name`, creating the directory. Returns the path.
    pub fn write_history(&self, name: &str, text: &str) -> Result<PathBuf, BenchError> {
        write_in(&self.history, name, text)
    }

    /// Writes `text` to `latest/name` (a reference copy), creating the directory.
    pub fn write_latest(&self, name: &str, text: &str) -> Result<PathBuf, BenchError> {
        write_in(&self.latest, name, text)
    }
}

/// `$SLUICE_CACHE/bench/results`, else `$HOME/.cache/sluice/bench/results`, else
/// `bench-results` under the system's temporary directory.
pub fn default_history_dir() -> PathBuf {
    history_dir_from(
        std::env::var_os("SLUICE_CACHE").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

fn history_dir_from(cache: Option<PathBuf>, home: Option<PathBuf>) -> PathBuf {
    cache
        .or_else(|| home.map(|h| h.join(".cache").join("sluice")))
        .map(|c| c.join("bench").join("results"))
        .unwrap_or_else(|| std::env::temp_dir().join("sluice-bench-results"))
}

fn write_in(dir: &Path, name: &str, text: &str) -> Result<PathBuf, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io("create dir", dir, e))?;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| BenchError::io("write", &path, e))?;
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn history_goes_to_the_cache_and_never_into_the_workspace() {
        let dirs = ResultsDirs {
            history: history_dir_from(Some("/c".into()), Some("/h".into())),
            latest: Path::new("/w").join("bench").join("results"),
        };
        assert_eq!(dirs.history, Path::new("/c/bench/results"));
        assert_eq!(
            history_dir_from(None, Some("/h".into())),
            Path::new("/h/.cache/sluice/bench/results")
        );
        assert_eq!(
            ResultsDirs::new(None, Path::new("/w")).latest,
            Path::new("/w/bench/results")
        );
    }

    #[test]
    fn writes_create_their_directory() {
        let root = std::env::temp_dir().join(format!("sluice-results-{}", std::process::id()));
        let dirs = ResultsDirs {
            history: root.join("h"),
            latest: root.join("l"),
        };
        let h = dirs.write_history("a.md", "x").unwrap();
        let l = dirs.write_latest("latest-a.md", "y").unwrap();
        assert_eq!(std::fs::read_to_string(h).unwrap(), "x");
        assert_eq!(std::fs::read_to_string(l).unwrap(), "y");
        std::fs::remove_dir_all(root).unwrap();
    }
}
