//! What every task of a running controller shares, handed to each task whole instead of
//! as a list of positional arguments.

use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;

use crate::grpc::Hub;
use crate::metrics::Metrics;
use crate::rebuild::Rebuilt;
use crate::records::FleetView;
use crate::watch::Stores;

/// The shared parts of one running controller. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Metrics of this controller.
    pub metrics: Metrics,
    /// The snapshot channel and what each dataplane ACKed.
    pub hub: Arc<Hub>,
    /// What this replica knows of the dataplane fleet.
    pub fleet: FleetView,
    /// The reflector stores of every input kind.
    pub stores: Stores,
    /// The status side output of each rebuild (`None` until the first one).
    pub rebuilt: watch::Receiver<Option<Arc<Rebuilt>>>,
    /// Whether this replica leads (writes status and events).
    pub leader: watch::Receiver<bool>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("fleet", &self.fleet)
            .field("leader", &*self.leader.borrow())
            .finish_non_exhaustive()
    }
}
