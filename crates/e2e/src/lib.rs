//! e2e test support (the suite lands with the controller issue).
