//! The one place where the agent's errors become D-Bus errors: each kind of
//! [`EngineError`] has its `io.gpushare.Agent1.Error.*` name here and nowhere else, and a
//! call that fails for a reason of the bus's own vocabulary (an unknown method, arguments
//! of the wrong types, too many calls) gets that standard `org.freedesktop.DBus.Error.*`.

use gpushare_proto::AgentError;
use zbus::DBusError;

use crate::apply::transaction::TransactionError;
use crate::engine::EngineError;
use crate::plan::PlanError;

impl From<EngineError> for AgentError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        of_kind(e, message)
    }
}

/// The D-Bus error of `e`'s kind, saying `message`.
fn of_kind(e: EngineError, message: String) -> AgentError {
    match e {
        EngineError::UnknownProfile(_) => AgentError::UnknownProfile(message),
        EngineError::InvalidProfile(_) | EngineError::BrokenProfile(_) => {
            AgentError::InvalidProfile(message)
        }
        EngineError::Plan(PlanError::GpuBusy(_)) => AgentError::GpuBusy(message),
        EngineError::Plan(_) | EngineError::HandsOff(_) => AgentError::Infeasible(message),
        EngineError::Busy(_) => AgentError::Busy(message),
        EngineError::Backend(_) => AgentError::Backend(message),
        EngineError::Apply { error, .. } => match *error {
            // A step or its verification failed: the driver's (or a tool's) answer.
            TransactionError::RolledBack { .. } | TransactionError::RollbackFailed { .. } => {
                AgentError::Backend(message)
            }
            TransactionError::Hook(_) | TransactionError::Journal(_) => AgentError::Failed(message),
        },
        EngineError::Sharing(_)
        | EngineError::InvalidArgument(_)
        | EngineError::NotPossible(_)
        | EngineError::Slurm(_)
        | EngineError::Probe { .. }
        | EngineError::Bench { .. }
        | EngineError::Recovery(_)
        | EngineError::StateDirectory { .. }
        | EngineError::Internal(_) => AgentError::Failed(message),
        // Refused after repairing what an earlier apply left: the refusal's kind.
        EngineError::AfterRollback { error, .. } => of_kind(*error, message),
    }
}

/// Why a call failed, as its caller is told: one of the agent's errors, or a standard one.
#[derive(Debug)]
pub enum Failure {
    /// `io.gpushare.Agent1.Error.*`.
    Agent(AgentError),
    /// `org.freedesktop.DBus.Error.*`.
    Fdo(zbus::fdo::Error),
}

impl Failure {
    /// One of the agent's errors.
    pub fn agent(e: AgentError) -> Self {
        Failure::Agent(e)
    }

    /// A standard error.
    pub fn fdo(e: zbus::fdo::Error) -> Self {
        Failure::Fdo(e)
    }

    /// Refused because the caller has as many calls counted as it may.
    pub fn limits(why: impl Into<String>) -> Self {
        Failure::Fdo(zbus::fdo::Error::LimitsExceeded(why.into()))
    }

    /// The error's D-Bus name.
    #[cfg(test)]
    pub fn name(&self) -> String {
        match self {
            Failure::Agent(e) => e.name().to_string(),
            Failure::Fdo(e) => e.name().to_string(),
        }
    }

    /// The error's one-line message.
    #[cfg(test)]
    pub fn message(&self) -> String {
        match self {
            Failure::Agent(e) => e.description().unwrap_or_default().to_string(),
            Failure::Fdo(e) => e.description().unwrap_or_default().to_string(),
        }
    }

    /// The error reply to the call `header` belongs to.
    pub fn reply(&self, header: &zbus::message::Header<'_>) -> zbus::Result<zbus::Message> {
        match self {
            Failure::Agent(e) => e.create_reply(header),
            Failure::Fdo(e) => e.create_reply(header),
        }
    }
}

impl From<AgentError> for Failure {
    fn from(e: AgentError) -> Self {
        Failure::Agent(e)
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        Failure::Agent(e.into())
    }
}

/// The D-Bus name of the error `e` becomes (`io.gpushare.Agent1.Error.Backend`), for job
/// outcomes, which carry it as text.
pub fn error_name(e: &EngineError) -> String {
    AgentError::from(e.clone()).name().to_string()
}

/// A refusal of `method` to a caller the access policy does not allow.
pub fn access_denied(method: &str, why: impl std::fmt::Display) -> AgentError {
    AgentError::AccessDenied(format!("{method}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::ApplyError;
    use crate::gpu::{ErrorCode, GpuError};

    #[test]
    fn every_kind_has_its_name() {
        let gpu = GpuError::new("create_gpu_instance", Some(0), ErrorCode::InsufficientResources);
        let step = ApplyError::Backend(gpu.clone());
        let apply = |error| EngineError::Apply { profile: "p".into(), error: Box::new(error) };
        let cases = [
            (EngineError::UnknownProfile("x".into()), "UnknownProfile"),
            (EngineError::Plan(PlanError::GpuBusy("x".into())), "GpuBusy"),
            (EngineError::Plan(PlanError::Forbidden("x".into())), "Infeasible"),
            (EngineError::Busy(None), "Busy"),
            (EngineError::HandsOff("x".into()), "Infeasible"),
            (EngineError::Backend(gpu), "Backend"),
            (
                apply(TransactionError::RolledBack {
                    error: step.clone(),
                    gpus: vec![0],
                    steps_done: 1,
                    warnings: vec![],
                }),
                "Backend",
            ),
            (
                apply(TransactionError::RollbackFailed {
                    error: step,
                    rollback: "x".into(),
                    steps_done: 1,
                    warnings: vec![],
                }),
                "Backend",
            ),
            (apply(TransactionError::Hook("x".into())), "Failed"),
            (apply(TransactionError::Journal("x".into())), "Failed"),
            (EngineError::InvalidArgument("x".into()), "Failed"),
            (EngineError::NotPossible("x".into()), "Failed"),
            (
                EngineError::AfterRollback {
                    repaired: "x".into(),
                    error: Box::new(EngineError::Plan(PlanError::Forbidden("x".into()))),
                },
                "Infeasible",
            ),
        ];
        for (e, name) in cases {
            assert_eq!(error_name(&e), format!("io.gpushare.Agent1.Error.{name}"), "{e:?}");
        }
        assert_eq!(
            access_denied("Apply", "no").name().to_string(),
            "io.gpushare.Agent1.Error.AccessDenied"
        );
    }
}
