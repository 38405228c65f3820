//! Whose is the metrics port a bench scrapes (the histogram method). A replica binds
//! `$GPUSHARE_BENCH_METRICS_PORT` itself, moments after the agent found the port free and
//! let it go; another local user may bind it first and answer the scrapes. So before it
//! believes a scrape, the agent checks that every socket listening where a connection to
//! `127.0.0.1:PORT` goes (`127.0.0.1`, `0.0.0.0`, `::`, `::ffff:127.0.0.1`, in
//! `/proc/net/tcp` and `tcp6`) belongs to the replica's user: the kernel's table gives each
//! socket's owner to anyone, and no other user can make a socket of theirs. (Looking for
//! the socket among the replica's descriptors in `/proc/PID/fd` needs `CAP_SYS_PTRACE`,
//! which the packaged unit does not give the agent: every scrape was refused there.)

use std::collections::HashSet;

/// The owners (uid) of the TCP sockets listening where a connection to `127.0.0.1:port`
/// would go, as the kernel lists them in `/proc/net/tcp` and `/proc/net/tcp6` (of the
/// agent's network namespace, which the replicas share).
pub fn listening(port: u16) -> HashSet<u32> {
    let mut found = HashSet::new();
    for (file, serving) in [("/proc/net/tcp", &SERVING_V4[..]), ("/proc/net/tcp6", &SERVING_V6[..])]
    {
        if let Ok(table) = std::fs::read_to_string(file) {
            found.extend(listening_in(&table, port, serving));
        }
    }
    found
}

/// `127.0.0.1` and `0.0.0.0` as `/proc/net/tcp` writes them (the address's bytes as a
/// little-endian word).
const SERVING_V4: [&str; 2] = ["0100007F", "00000000"];
/// `::`, `::ffff:127.0.0.1` and `::ffff:0.0.0.0` as `/proc/net/tcp6` writes them.
const SERVING_V6: [&str; 3] = [
    "00000000000000000000000000000000",
    "0000000000000000FFFF00000100007F",
    "0000000000000000FFFF000000000000",
];

/// The owners of the listening sockets of `table` (a `/proc/net/tcp*` text) on `port` at
/// one of the `serving` addresses.
fn listening_in(table: &str, port: u16, serving: &[&str]) -> Vec<u32> {
    let port = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (address, local_port) = fields.get(1)?.split_once(':')?;
            // State 0A: LISTEN.
            let listens = fields.get(3) == Some(&"0A");
            let matches = listens
                && local_port.eq_ignore_ascii_case(&port)
                && serving.iter().any(|s| s.eq_ignore_ascii_case(address));
            matches.then(|| fields.get(7)?.parse().ok())?
        })
        .collect()
}

/// Why a port is not to be scraped for a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOwn {
    /// Nothing listens there (yet).
    Nothing(String),
    /// Something that is not the replica's does: the replica cannot have it.
    Foreign(String),
}

impl NotOwn {
    /// The reason, in one line.
    pub fn why(&self) -> &str {
        match self {
            NotOwn::Nothing(why) | NotOwn::Foreign(why) => why,
        }
    }
}

/// Whether what listens on `port` is replica `index`'s own: every listener there belongs
/// to `uid`, the user the replicas run as.
pub fn check_owner(port: u16, index: usize, uid: u32) -> Result<(), NotOwn> {
    let owners = listening(port);
    if owners.is_empty() {
        return Err(NotOwn::Nothing(format!("nothing listens on 127.0.0.1:{port} yet")));
    }
    if owners.iter().all(|&owner| owner == uid) {
        return Ok(());
    }
    Err(NotOwn::Foreign(format!(
        "127.0.0.1:{port} is listened on by another user's process, not replica {index}'s (another program bound $GPUSHARE_BENCH_METRICS_PORT first); its scrapes are not believed"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0
   1: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 4343 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4444 1 0 100 0 0 10 0
   3: 0200007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4545 1 0 100 0 0 10 0
";

    #[test]
    fn the_listeners_of_a_port_are_read_from_the_kernels_table() {
        // Port 8080 (1F90): the listener on 127.0.0.1, not the connection, not 127.0.0.2.
        assert_eq!(listening_in(TCP, 8080, &SERVING_V4), [1000]);
        assert_eq!(listening_in(TCP, 8081, &SERVING_V4), [1001]);
        assert!(listening_in(TCP, 9999, &SERVING_V4).is_empty());
    }

    #[test]
    fn a_port_someone_else_listens_on_is_not_the_replicas() {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listening(port).len(), 1);
        // This process's user holds it.
        let me = crate::sys::unix::effective_uid();
        assert_eq!(check_owner(port, 0, me), Ok(()));
        // A replica of another user does not.
        let e = check_owner(port, 2, me.wrapping_add(1)).unwrap_err();
        assert!(matches!(e, NotOwn::Foreign(_)), "{e:?}");
        assert!(e.why().contains("not replica 2's"), "{e:?}");
        drop(listener);
        let e = check_owner(port, 0, me).unwrap_err();
        assert!(matches!(e, NotOwn::Nothing(_)), "{e:?}");
    }
}
