//! NVIDIA's `nvidia-cuda-mps-control` (the simulated one) run by hand against an agent's
//! MPS daemons, as root or as another user: what the MPS tests do behind the agent's back.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::{Agent, SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV, as_user, binary, text};

impl Agent {
    /// The simulated control tool, copied into the agent's directory (open to other
    /// users, where the build's directory need not be).
    pub fn mps_control_tool(&self) -> PathBuf {
        let tool = self.dir.path().join("nvidia-cuda-mps-control");
        if !tool.exists() {
            crate::copy_executable(&binary(SIM_MPS_CONTROL, SIM_MPS_CONTROL_ENV), &tool);
        }
        tool
    }

    /// The control tool as `user` (root when `None`) on pipe directory `pipe`, with `args`
    /// and `input` on stdin.
    pub fn mps_control(
        &self,
        user: Option<&str>,
        pipe: &Path,
        args: &[&str],
        input: &str,
    ) -> Output {
        let tool = self.mps_control_tool();
        let mut command = match user {
            Some(user) => {
                let mut c = as_user(user);
                c.arg(&tool);
                c
            }
            None => Command::new(&tool),
        };
        let mut child = command
            .args(args)
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
            .env_remove("GPUSHARE_SIM_RECORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// `line` sent by root to the daemon of `pipe`: its answer lines.
    pub fn mps_ask(&self, pipe: &Path, line: &str) -> Vec<String> {
        let out = self.mps_control(None, pipe, &[], &format!("{line}\n"));
        assert!(out.status.success(), "{line}: {}", text(&out));
        String::from_utf8(out.stdout).unwrap().lines().map(String::from).collect()
    }
}
