//! Translation from cluster state to snapshot (placeholder).
