//! An MPS server in words, as `mps`, `clients` and `status` say it: the device it serves
//! (`GPU 0`, `GPU 1 GI 9`), the user it runs as, and whom it serves (every user at once,
//! or one user while others' clients wait). A leaf of the verbs.

use gpushare_proto::types::MpsServer;

/// `GPU 0`, or `GPU 1 GI 9` for a MIG instance's server.
pub fn device_words(server: &MpsServer) -> String {
    match server.gpu_instance_id {
        Some(gi) => format!("GPU {} GI {gi}", server.gpu),
        None => format!("GPU {}", server.gpu),
    }
}

/// A user for people: `root`, `alice`, `uid 1005` (no name known).
pub fn who(uid: u32, user: Option<&str>) -> String {
    user.map_or_else(|| format!("uid {uid}"), str::to_owned)
}

/// Whom `server` serves, in one line: every user at once (multi-user), or the one user
/// its server process runs as (others' clients wait).
pub fn serving_notes(server: &MpsServer, device: &str) -> Vec<String> {
    if server.pid.is_none() {
        return Vec::new();
    }
    if server.multi_user {
        return vec![format!(
            "{device}: multi-user: one server running as root serves every user's clients at once (less isolation: a fatal GPU fault of one client ends the others' too, whoever they are)"
        )];
    }
    match server.server_processes.first() {
        Some(p) => {
            let user =
                p.uid.map_or_else(|| "one user".to_owned(), |uid| who(uid, p.user.as_deref()));
            vec![format!(
                "{device}: server {} serves {user}'s clients only: another user's client waits until they are gone (multi_user = true in the profile serves every user at once)",
                p.pid
            )]
        }
        None => vec![format!(
            "{device}: serves one user at a time: the first client's user gets a server, another user's client waits until its clients are gone"
        )],
    }
}
