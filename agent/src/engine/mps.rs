//! The engine's MPS operations: `mps status`, `mps limit` (which names the server it set
//! and records the override it made), the health check (daemons restarted, drifted limits
//! put back, drift logged once), and the live limits `status` shows.

use std::sync::Arc;

use gpushare_proto::MPS_THREAD_PERCENTAGE;
use gpushare_proto::types::{MpsLimitResult, MpsStatus};

use super::report::{self, MpsContext, limit_values};
use super::{Engine, EngineError, EngineEvent};
use crate::apply::Reads;
use crate::node::{LimitOverride, MpsServerDetail, NodeState, size_text};

impl Engine {
    /// The MPS servers with their clients and live limits (one control run per daemon).
    pub async fn mps_status(&self) -> Result<MpsStatus, EngineError> {
        let reads = Reads { timeslices: false, mps_clients: true };
        let node = self.core.node.observe(reads).await?;
        let restores = self.supervisor.restores();
        let cx = self.mps_context(&restores);
        Ok(MpsStatus {
            servers: node.mps.iter().map(|s| report::mps_server(s, &node, &cx)).collect(),
        })
    }

    /// What the MPS rows of a view need besides the node.
    pub(super) fn mps_context<'a>(
        &'a self,
        restores: &'a std::collections::HashMap<String, u32>,
    ) -> MpsContext<'a> {
        MpsContext {
            mps: &self.core.node.sharing.mps,
            restores,
            user_name: &crate::sys::unix::cached_user_name,
        }
    }

    /// `node` with the live limits of its MPS servers, and the clients of the servers on
    /// GPUs whose driver does not name MPS clients (`status` reads no clients otherwise).
    pub(super) async fn with_live_limits(
        &self,
        node: NodeState,
        with_clients: bool,
    ) -> Result<NodeState, EngineError> {
        let unnamed: Vec<u32> = node
            .gpus
            .iter()
            .filter(|g| with_clients && !g.mps_clients_named)
            .map(|g| g.index)
            .collect();
        Ok(self.core.node.read_live_limits(node, move |s| unnamed.contains(&s.gpu)).await?)
    }

    /// Sets the limits of the MPS server serving client `pid` (for its new clients), for
    /// a caller the transport does not name ([`Engine::mps_limit_as`]).
    pub async fn mps_limit(
        &self,
        pid: u32,
        threads: Option<u32>,
        memory_bytes: Option<u64>,
    ) -> Result<MpsLimitResult, EngineError> {
        self.mps_limit_as(None, pid, threads, memory_bytes).await
    }

    /// Sets the limits of the MPS server process serving client `pid` (MPS applies them to
    /// that server's new clients), reads them back, and records the override in the
    /// server's record with who asked (`caller`) and when: views show the server's limits
    /// as coming from `mps limit`, and the health check keeps them. The answer names the
    /// server process, its device, GPU and control daemon, what it had before and has now,
    /// whom it serves, and the daemon's defaults, which a server started later gets.
    pub async fn mps_limit_as(
        &self,
        caller: Option<u32>,
        pid: u32,
        threads: Option<u32>,
        memory_bytes: Option<u64>,
    ) -> Result<MpsLimitResult, EngineError> {
        self.gate.may_change()?;
        if let Some(t) = threads
            && !MPS_THREAD_PERCENTAGE.contains(&t)
        {
            let (low, high) = (MPS_THREAD_PERCENTAGE.start(), MPS_THREAD_PERCENTAGE.end());
            return Err(EngineError::InvalidArgument(format!(
                "threads must be from {low} to {high}, not {t}"
            )));
        }
        let sharing = Arc::clone(&self.core.node.sharing);
        let (record, server) =
            tokio::task::spawn_blocking(move || sharing.mps.server_of_client(pid))
                .await
                .map_err(|e| EngineError::Internal(crate::sys::task_failed(&e)))??;
        // A bench's server serves its replicas: its limits are the bench's setup.
        if let Some(claim) = self.gate.claims.of_gpu(record.gpu) {
            return Err(EngineError::Busy(Some(claim.holder())));
        }
        // A limit above the served device's memory would be taken and limit nothing.
        if let Some(bytes) = memory_bytes {
            let node = self.core.node.observe(Reads::GPUS_AND_SERVERS).await?;
            if let Some((memory, device)) = node.device_memory(record.gpu, record.placement_start)
                && bytes > memory
            {
                return Err(EngineError::InvalidArgument(format!(
                    "{device} serves PID {pid} through MPS: a pinned memory limit of {} exceeds its {}",
                    size_text(bytes),
                    size_text(memory)
                )));
            }
        }
        let sharing = Arc::clone(&self.core.node.sharing);
        let uuid = record.uuid.clone();
        let detail = MpsServerDetail::configured(record.spec(), record.overrides.clone());
        let (before, after) = tokio::task::spawn_blocking(move || {
            let mps = &sharing.mps;
            let read = mps.read_live_now(&uuid, &detail, false)?;
            let before = read.servers.iter().find(|(p, _)| *p == server).map(|&(_, l)| l);
            let current = before.unwrap_or(detail.expected(server));
            let after = mps.limit_server(&uuid, server, threads, memory_bytes, current)?;
            let running: Vec<u32> = read.servers.iter().map(|&(p, _)| p).collect();
            let made = LimitOverride {
                server_pid: server,
                active_thread_percentage: threads,
                pinned_memory_limit_bytes: memory_bytes,
                by_uid: caller,
                at_unix_seconds: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            };
            mps.record_override(&uuid, made, &running)?;
            Ok::<_, crate::sharing::SharingError>((before, after))
        })
        .await
        .map_err(|e| EngineError::Internal(crate::sys::task_failed(&e)))??;
        let by = caller.map_or_else(|| "a caller".to_string(), |uid| format!("uid {uid}"));
        tracing::info!(
            "MPS server {server} of {} (GPU {}) serving client {pid}: limits set by {by} to {}",
            record.uuid,
            record.gpu,
            crate::node::limits_text(after)
        );
        // Whom it serves, as views show it (a fresh read: the setting dropped the last one).
        let observed = self.core.node.observe(Reads::GPUS_AND_SERVERS).await?;
        let node = self.core.node.read_live_limits(observed, |_| false).await?;
        let live = node.mps_detail(&record.uuid).and_then(|d| d.live.clone());
        let served_by = live
            .as_ref()
            .and_then(|l| l.servers.iter().find(|s| s.pid == server))
            .and_then(|s| s.uid);
        let daemon_pid = node.mps.iter().find(|s| s.uuid == record.uuid).and_then(|s| s.pid);
        // The shares' limits follow the server's; listeners refresh.
        self.refresh_views().await;
        self.events.emit(EngineEvent::MpsChanged);
        Ok(MpsLimitResult {
            pid,
            server_pid: server,
            uuid: record.uuid.clone(),
            active_thread_percentage: threads,
            pinned_memory_limit_bytes: memory_bytes,
            gpu: Some(record.gpu),
            daemon_pid,
            before: before.map(limit_values),
            after: Some(limit_values(after)),
            daemon_defaults: live.map(|l| limit_values(l.defaults)),
            server_uid: served_by,
            server_user: served_by.and_then(crate::sys::unix::cached_user_name),
            multi_user: record.multi_user,
        })
    }

    /// Runs one health check of the MPS servers (see
    /// [`crate::sharing::supervisor::MpsSupervisor`]: daemons restarted, drifted limits put
    /// back); skipped while an apply, a probe or a transaction runs, and the servers of a
    /// benched GPU are left alone (neither asked nor restarted: they are the bench's setup,
    /// and a restart would change what it measures). Listeners hear of it either way.
    /// Returns what it did, one line per server.
    pub async fn supervise_mps(&self) -> Vec<String> {
        let moment = self.gate.try_moment("the MPS health check");
        let turn = moment.as_ref().and_then(|_| self.transactions.try_turn());
        let report = match (moment, turn) {
            (Some(_moment), Some(_turn)) => {
                let supervisor = Arc::clone(&self.supervisor);
                let sharing = Arc::clone(&self.core.node.sharing);
                let benched: Vec<u32> = self.gate.claims.all().iter().map(|c| c.gpu).collect();
                // A server is not started again where a fault lies, other than its own
                // death (issue 42).
                let faults: Vec<_> = (self.health().faults().into_iter())
                    .filter(|f| f.cause != crate::health::Cause::MpsServerDied)
                    .collect();
                let backend = Arc::clone(&self.core.node.backend);
                tokio::task::spawn_blocking(move || {
                    // Observed only when a MIG instance's server is down and a fault lies.
                    let placed = std::sync::OnceLock::new();
                    let unhealthy = |record: &crate::sharing::mps::ServerRecord| {
                        if !faults.iter().any(|f| f.gpu == record.gpu) {
                            return false;
                        }
                        let gi = record.placement_start.and_then(|start| {
                            let gpus = placed.get_or_init(|| backend.observe().ok());
                            let gpu = gpus.as_ref()?.iter().find(|g| g.index == record.gpu)?;
                            gpu.instance_at(start).map(|i| i.id)
                        });
                        faults.iter().any(|f| f.covers(record.gpu, gi))
                    };
                    supervisor.check(&sharing.mps, &benched, &unhealthy)
                })
                .await
                .unwrap_or_default()
            }
            _ => Default::default(),
        };
        self.servers_died(&report.down).await;
        // A share's limits are those its server gives: the spec follows a restore.
        if !report.restores.is_empty() {
            self.refresh_views().await;
        }
        self.events.emit(EngineEvent::HealthChecked);
        report.lines()
    }
}
