//! Observing the node: the GPUs through the GPU backend, the sharing on them through the
//! sharing tools, put together into one [`NodeState`].

use std::sync::Arc;

use crate::gpu::{ErrorCode, GpuBackend, GpuError};
use crate::node::NodeState;
use crate::sharing::SharingTools;

/// The node as the agent reaches it: its GPUs through the backend, the sharing set up on
/// them through the sharing tools.
#[derive(Clone)]
pub struct NodeAccess {
    /// The hardware.
    pub backend: Arc<dyn GpuBackend>,
    /// MPS and time-slicing.
    pub sharing: Arc<SharingTools>,
}

impl NodeAccess {
    /// A fresh observation: the GPUs, the MPS servers, and `with_timeslices` the
    /// time-slice intervals (one nvidia-smi run; unknown when it fails).
    pub async fn observe(&self, with_timeslices: bool) -> Result<NodeState, GpuError> {
        let sharing = Arc::clone(&self.sharing);
        blocking(&self.backend, move |b| {
            let mut node = NodeState::of_gpus(b.observe()?);
            node.mps = sharing.mps_servers();
            if with_timeslices {
                match sharing.timeslices() {
                    Ok(intervals) => node.timeslices = intervals,
                    Err(e) => tracing::debug!("time-slice intervals unknown: {e}"),
                }
            }
            Ok(node)
        })
        .await
    }
}

/// Runs a blocking backend call on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    backend: &Arc<dyn GpuBackend>,
    call: impl FnOnce(&dyn GpuBackend) -> Result<T, GpuError> + Send + 'static,
) -> Result<T, GpuError> {
    let backend = Arc::clone(backend);
    tokio::task::spawn_blocking(move || call(backend.as_ref())).await.unwrap_or_else(|e| {
        Err(GpuError::new("backend", None, ErrorCode::Unknown)
            .with_detail(format!("the backend call panicked: {e}")))
    })
}
