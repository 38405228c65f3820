//! `gpushare-ctl clients`: every process using the GPUs, attributed, one line each,
//! grouped by GPU and instance, then the MIG instances and MPS servers no one uses:
//!
//! ```text
//! PID   USER   UNIT/CONTAINER       WHERE       MEMORY   SHARE                          COMMAND
//! 4242  alice  serve.service        GPU 0       1 GiB    -                              python3 serve.py
//! 4250  bob    container 0123abcd…  GPU 1/GI 3  -        25 % threads, 8 GiB pinned     -
//! Idle:
//!   MIG-…  GPU 1 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process
//! ```
//!
//! A client on a GPU or MIG instance with a fault (issue 42) has `(unhealthy)` after its
//! place (`GPU 1/GI 3 MPS (unhealthy)`), and a line under the table names each such fault
//! once: `Unhealthy: GPU 1/GI 3: Xid 94 (Contained ECC error): restart the application`.
//!
//! Under the table, for each MPS server that serves someone, whom it serves: one user at a
//! time (a client of another user waits, unlisted, until the server's clients are gone:
//! NVIDIA's default) or every user at once (multi-user), from `MpsStatus`, asked only when
//! the table has MPS clients or idle MPS servers.
//!
//! A command line is shown to root and to the process's own user only (`-` otherwise).
//! `--json` prints the [`ClientTable`] document. `--watch` shows it again every
//! `--interval` ([`watch`], which `top` shares): redrawn on a terminal, one table after
//! another into a pipe, one document per line with `--json`. `--query FIELDS` prints CSV
//! ([`csv`]), as `nvidia-smi --query-compute-apps=… --format=csv` does.

use std::borrow::Cow;
use std::io::Write;
use std::time::Duration;

use gpushare_proto::clients::{ClientTable, GpuClient};
use gpushare_proto::readable_size;
use gpushare_proto::types::MpsStatus;

use super::ExitStatus;
use crate::bus::Client;
use crate::cli::{ClientField, ClientsArgs, CsvFormat};
use crate::error::{CtlError, Kind};
use crate::output::{Output, parse_document, printable};
use crate::table::Columns;

/// The refresh interval of `--watch` when `--interval` is left out, in seconds.
const DEFAULT_INTERVAL: f64 = 1.0;

/// Runs `clients`.
pub async fn run(
    client: &mut Client,
    out: &Output,
    args: &ClientsArgs,
) -> Result<ExitStatus, CtlError> {
    if !args.query.is_empty() {
        if out.json {
            let why = "--query prints CSV, --json a document: leave one out";
            return Err(CtlError::ctl(Kind::Usage, why).with_exit_code(2));
        }
        let table = fetch(client).await?;
        let _ = write_stdout(&csv(&table, &args.query, args.format.unwrap_or_default()));
        warn_left_out(out, &table);
        return Ok(0);
    }
    if args.watch {
        let interval = args.interval.unwrap_or(DEFAULT_INTERVAL);
        return watch(out, interval, "gpushare-ctl clients", async || {
            let raw = client.call("Clients", async |a| a.proxy.clients().await).await?;
            if out.json {
                return one_line(&raw, "ClientTable");
            }
            let table: ClientTable = parse_document(&raw, "ClientTable")?;
            let mut text = render(&table);
            text.push_str(&mps_lines(client, &table).await);
            if table.left_out > 0 {
                text.push_str(&format!(
                    "{} more clients not listed by the agent\n",
                    table.left_out
                ));
            }
            Ok(text)
        })
        .await;
    }
    let raw = client.call("Clients", async |a| a.proxy.clients().await).await?;
    if out.json {
        out.print_document(&raw, "ClientTable")?;
        return Ok(0);
    }
    let table: ClientTable = parse_document(&raw, "ClientTable")?;
    let mut text = render(&table);
    text.push_str(&mps_lines(client, &table).await);
    out.print(&text);
    warn_left_out(out, &table);
    Ok(0)
}

/// Whom each MPS server that serves someone serves, one line each (see the module's
/// documentation); nothing when the table has nothing of MPS, or the agent does not say.
async fn mps_lines(client: &mut Client, table: &ClientTable) -> String {
    let mps = table.clients.iter().any(|c| c.via == "mps")
        || table.idle.iter().any(|d| d.what == "mps-server");
    if !mps {
        return String::new();
    }
    let Ok(raw) = client.call("MpsStatus", async |a| a.proxy.mps_status().await).await else {
        return String::new();
    };
    let Ok(status) = parse_document::<MpsStatus>(&raw, "MpsStatus") else {
        return String::new();
    };
    serving_lines(&status)
}

/// The lines of [`mps_lines`] for `status`.
pub fn serving_lines(status: &MpsStatus) -> String {
    let mut text = String::new();
    for server in &status.servers {
        let serves = server.server_processes.first().is_some_and(|p| p.uid.is_some());
        if !(serves || server.multi_user && server.pid.is_some()) {
            continue;
        }
        let device = format!("MPS server of {}", super::mps_words::device_words(server));
        for line in super::mps_words::serving_notes(server, &device) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

/// Asks the agent for its client table.
async fn fetch(client: &mut Client) -> Result<ClientTable, CtlError> {
    let raw = client.call("Clients", async |a| a.proxy.clients().await).await?;
    parse_document(&raw, "ClientTable")
}

/// Says on stderr how many clients the agent left out, if any.
fn warn_left_out(out: &Output, table: &ClientTable) {
    if table.left_out > 0 {
        out.warn(&format!(
            "{} more clients were left out (the agent lists at most {})",
            table.left_out,
            table.clients.len()
        ));
    }
}

/// An agent document on one line (for NDJSON), after checking it is one JSON object.
pub fn one_line(raw: &str, what: &str) -> Result<String, CtlError> {
    let doc: serde_json::Map<String, serde_json::Value> = parse_document(raw, what)?;
    Ok(serde_json::Value::Object(doc).to_string())
}

/// Writes to stdout and flushes; an error (a closed pipe) is returned, not printed.
fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// Shows what `frame` returns every `seconds` until Ctrl-C (exit 0) or until stdout is
/// closed (exit 0): on a terminal the screen is cleared and redrawn, cut to its height
/// under a title line with the time, as watch(1) does; with `--json` each frame is one
/// line (NDJSON) with the time as `"time"`; otherwise frames follow each other, each under
/// a line with the time and a blank line between two, so that a log of them says when a
/// client came or went. An agent call that fails ends it.
pub async fn watch(
    out: &Output,
    seconds: f64,
    title: &str,
    mut frame: impl AsyncFnMut() -> Result<String, CtlError>,
) -> Result<ExitStatus, CtlError> {
    let interval = Duration::from_secs_f64(seconds);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut first = true;
    loop {
        let text = tokio::select! {
            _ = &mut ctrl_c => return Ok(0),
            text = frame() => text?,
        };
        let now = local_time_now();
        let shown = if out.json {
            format!("{}\n", with_time(&text, &now))
        } else if out.stdout_tty {
            let screen = format!("Every {seconds} s: {title}  {now}  (Ctrl-C quits)\n\n{text}");
            // One line fewer than the terminal has: a last newline would scroll it.
            let (rows, columns) = terminal_size();
            format!("\x1b[H\x1b[2J{}", fit(&screen, rows.saturating_sub(1), columns))
        } else if first {
            format!("{now}\n{text}")
        } else {
            format!("\n{now}\n{text}")
        };
        first = false;
        if write_stdout(&shown).is_err() {
            return Ok(0);
        }
        tokio::select! {
            _ = &mut ctrl_c => return Ok(0),
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// A frame's JSON object with `"time"` added; the text unchanged if it is no object.
fn with_time(frame: &str, now: &str) -> String {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(frame) {
        Ok(mut fields) => {
            fields.insert("time".into(), now.into());
            serde_json::Value::Object(fields).to_string()
        }
        Err(_) => frame.trim_end().to_string(),
    }
}

/// The local time now, `2026-11-27 11:40:05 CET` (the C library's `localtime_r` and
/// `strftime`, so `TZ` and `/etc/localtime` count); empty if it cannot be told.
pub fn local_time_now() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    local_time(now.map_or(0, |d| d.as_secs()))
}

/// [`local_time_now`] for `seconds` since the Unix epoch.
pub fn local_time(seconds: u64) -> String {
    gpushare_base::local_time::format(seconds, "%Y-%m-%d %H:%M:%S %Z").unwrap_or_default()
}

/// The rows and columns of the terminal on stdout, 24 by 80 when it does not say.
fn terminal_size() -> (usize, usize) {
    // Raw ioctl: nix has no call that reads a terminal's size (only a macro to write one).
    let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points to `size`,
    // alive and exclusively borrowed for the call.
    let got = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &raw mut size) };
    if got == 0 && size.ws_row > 0 && size.ws_col > 0 {
        (usize::from(size.ws_row), usize::from(size.ws_col))
    } else {
        (24, 80)
    }
}

/// `text` cut to one screen: each line to `columns` characters (a wrapped line would take
/// two rows), and to `rows` lines at most: when longer, its first `rows - 1` lines and
/// `… N more lines` (at least the first line and that one are kept).
pub fn fit(text: &str, rows: usize, columns: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let keep = if lines.len() <= rows { lines.len() } else { rows.saturating_sub(1).max(1) };
    let mut cut = String::new();
    for line in &lines[..keep] {
        cut.extend(line.chars().take(columns.max(1)));
        cut.push('\n');
    }
    if keep == lines.len() {
        return cut;
    }
    let more = lines.len() - keep;
    cut.push_str(&format!("… {more} more {}\n", if more == 1 { "line" } else { "lines" }));
    cut
}

/// `clients --query`: the fields of each client as CSV (RFC 4180 quoting, LF line ends,
/// control characters as `?`), under a header line of the field names unless `format`
/// leaves it out.
pub fn csv(table: &ClientTable, fields: &[ClientField], format: CsvFormat) -> String {
    let mut text = String::new();
    let mut record = |values: Vec<String>| {
        let quoted: Vec<String> =
            values.iter().map(|v| csv_quote(&printable(v)).into_owned()).collect();
        text.push_str(&quoted.join(","));
        text.push('\n');
    };
    if format.header {
        record(fields.iter().map(|f| f.name().to_owned()).collect());
    }
    for c in &table.clients {
        record(fields.iter().map(|f| field(c, *f)).collect());
    }
    text
}

/// A CSV value, in double quotes (doubled inside) when it holds a comma, a quote or a line
/// break.
pub fn csv_quote(value: &str) -> Cow<'_, str> {
    if value.contains([',', '"', '\n', '\r']) {
        Cow::Owned(format!("\"{}\"", value.replace('"', "\"\"")))
    } else {
        Cow::Borrowed(value)
    }
}

/// One field of a client for `--query`; empty where the agent does not know or show it.
pub fn field(c: &GpuClient, f: ClientField) -> String {
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map(|v| v.to_string()).unwrap_or_default()
    }
    match f {
        ClientField::Pid => c.pid.to_string(),
        ClientField::User => opt(c.user.as_deref()),
        ClientField::Uid => opt(c.uid),
        ClientField::Unit => opt(c.unit.as_deref()),
        ClientField::Container => opt(c.container.as_deref()),
        ClientField::Gpu => c.gpu.to_string(),
        ClientField::GpuUuid => c.gpu_uuid.clone(),
        ClientField::Instance => opt(c.instance.as_deref()),
        ClientField::Via => c.via.clone(),
        ClientField::MpsServer => opt(c.mps_server.as_deref()),
        ClientField::MemoryBytes => opt(c.memory_bytes),
        ClientField::ShareThreads => opt(c.share.as_ref().map(|s| s.active_thread_percentage)),
        ClientField::ShareMemoryBytes => opt(c.share.as_ref().and_then(|s| s.pinned_memory_bytes)),
        ClientField::Command => opt(c.command.as_deref()),
        ClientField::Unhealthy => opt(c.unhealthy.as_deref()),
    }
}

/// The table for people.
pub fn render(table: &ClientTable) -> String {
    let mut text = String::new();
    if table.clients.is_empty() && table.unseen.is_empty() {
        text.push_str("No process uses the GPUs.\n");
    } else if !table.clients.is_empty() {
        text.push_str(&client_rows(table.clients.iter()));
        text.push_str(&unhealthy_lines(&table.clients));
    }
    if !table.unseen.is_empty() {
        text.push_str("Listed by the driver, not in the agent's /proc (another PID namespace, or just ended):\n");
        for u in &table.unseen {
            let place = match u.gpu_instance_id {
                Some(gi) => format!("GPU {}/GI {gi}", u.gpu),
                None => format!("GPU {}", u.gpu),
            };
            let memory = u.memory_bytes.map_or_else(|| "-".to_string(), readable_size);
            text.push_str(&format!("  PID {}  {place}  {memory}\n", u.pid));
        }
    }
    if !table.idle.is_empty() {
        text.push_str("Idle:\n");
        for d in &table.idle {
            text.push_str(&format!("  {}  {}\n", d.uuid, d.describe));
        }
    }
    text
}

/// The clients' table (with its header line), one line each.
pub fn client_rows<'a>(clients: impl Iterator<Item = &'a GpuClient>) -> String {
    rows(clients, true)
}

/// The same without the command lines (`status`, which never has them).
pub fn client_rows_without_command<'a>(clients: impl Iterator<Item = &'a GpuClient>) -> String {
    rows(clients, false)
}

fn rows<'a>(clients: impl Iterator<Item = &'a GpuClient>, command: bool) -> String {
    client_columns(command).render(clients)
}

/// The clients' columns, in order; the command line last, where asked (`status` never
/// has them).
fn client_columns(command: bool) -> Columns<'static, GpuClient> {
    let columns = Columns::<GpuClient>::new()
        .left("PID", |c| c.pid.to_string())
        .left("USER", user)
        .left("UNIT/CONTAINER", placement)
        .left("WHERE", place)
        .left("MEMORY", |c| c.memory_bytes.map_or_else(|| "-".to_string(), readable_size))
        .left("SHARE", share);
    if !command {
        return columns;
    }
    columns.left("COMMAND", |c| c.command.clone().unwrap_or_else(|| "-".into()))
}

/// Its user's name, else its uid.
fn user(c: &GpuClient) -> String {
    match (&c.user, c.uid) {
        (Some(name), _) => name.clone(),
        (None, Some(uid)) => uid.to_string(),
        (None, None) => "?".into(),
    }
}

/// `container 0123456789ab`, the unit, or `-`.
fn placement(c: &GpuClient) -> String {
    match (&c.container, &c.unit) {
        (Some(id), _) => format!("container {id}"),
        (None, Some(unit)) if unit.chars().count() > UNIT_COLUMN_MAX => {
            let head: String = unit.chars().take(UNIT_COLUMN_MAX - 1).collect();
            format!("{head}…")
        }
        (None, Some(unit)) => unit.clone(),
        (None, None) => "-".into(),
    }
}

/// The widest unit shown in a table (a user may name its own up to 255 characters, which
/// would push the other columns off the screen); `--json` and `--query` give it whole.
const UNIT_COLUMN_MAX: usize = 40;

/// `GPU 0`, `GPU 1/GI 3`, `GPU 0 MPS`, `GPU 1/GI 3 MPS`, with ` (unhealthy)` after it
/// while a fault covers the GPU or instance.
fn place(c: &GpuClient) -> String {
    let device = device(c);
    let mps = if c.via == "mps" { " MPS" } else { "" };
    let unhealthy = if c.unhealthy.is_some() { " (unhealthy)" } else { "" };
    format!("{device}{mps}{unhealthy}")
}

/// `GPU 0`, `GPU 1/GI 3`.
fn device(c: &GpuClient) -> String {
    match c.gpu_instance_id {
        Some(gi) => format!("GPU {}/GI {gi}", c.gpu),
        None => format!("GPU {}", c.gpu),
    }
}

/// A line for each fault the clients are under, once each, in their order:
/// `Unhealthy: GPU 1/GI 3: Xid 94 (…): restart the application`; nothing when none is.
pub fn unhealthy_lines(clients: &[GpuClient]) -> String {
    let mut seen: Vec<(String, &str)> = Vec::new();
    for c in clients {
        if let Some(detail) = &c.unhealthy {
            let key = (device(c), detail.as_str());
            if !seen.contains(&key) {
                seen.push(key);
            }
        }
    }
    seen.iter()
        .map(|(device, detail)| format!("Unhealthy: {device}: {}\n", printable(detail)))
        .collect()
}

/// `25 % threads, 8 GiB pinned` (`own` when the client lowered its percentage), or `-`.
fn share(c: &GpuClient) -> String {
    let Some(s) = &c.share else { return "-".into() };
    let own = if s.from == "client" { " (own)" } else { "" };
    let pinned =
        s.pinned_memory_bytes.map(|b| format!(", {} pinned", readable_size(b))).unwrap_or_default();
    format!("{} % threads{own}{pinned}", s.active_thread_percentage)
}

#[cfg(test)]
mod tests {
    use gpushare_proto::clients::{ClientShare, IdleDevice, UnseenProcess};

    use crate::cli::CsvFormat;

    use super::*;

    fn client(pid: u32, via: &str) -> GpuClient {
        GpuClient {
            pid,
            uid: Some(1000),
            user: Some("alice".into()),
            command: None,
            unit: None,
            container: None,
            gpu: 0,
            gpu_uuid: "GPU-0".into(),
            instance: None,
            gpu_instance_id: None,
            via: via.into(),
            mps_server: None,
            memory_bytes: None,
            share: None,
            unhealthy: None,
        }
    }

    /// Issue 42: a client on a faulted GPU or instance is marked after its place, and a
    /// line under the table names each fault once; a healthy table has neither.
    #[test]
    fn clients_on_an_unhealthy_gpu_or_instance_are_marked_with_the_fault() {
        let lost = "GPU lost: reboot the node";
        let xid = "Xid 94 (Contained ECC error): restart the application";
        let on = |pid: u32, gpu: u32, gi: Option<u32>, fault: Option<&str>| GpuClient {
            gpu,
            gpu_instance_id: gi,
            unhealthy: fault.map(Into::into),
            ..client(pid, if gi.is_some() { "mps" } else { "gpu" })
        };
        let healthy = ClientTable {
            clients: vec![on(10, 0, None, None), on(11, 1, Some(3), None)],
            ..ClientTable::default()
        };
        let text = render(&healthy);
        assert!(!text.contains("unhealthy") && !text.contains("Unhealthy"), "{text}");
        let table = ClientTable {
            clients: vec![
                on(10, 0, None, Some(lost)),
                on(12, 0, None, Some(lost)),
                on(11, 1, Some(3), Some(xid)),
                on(13, 1, Some(4), None),
            ],
            ..ClientTable::default()
        };
        let text = render(&table);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7, "{text}");
        assert!(lines[1].contains("GPU 0 (unhealthy)"), "{text}");
        assert!(lines[2].contains("GPU 0 (unhealthy)"), "{text}");
        assert!(lines[3].contains("GPU 1/GI 3 MPS (unhealthy)"), "{text}");
        assert!(lines[4].contains("GPU 1/GI 4 MPS") && !lines[4].contains("unhealthy"), "{text}");
        assert_eq!(lines[5], format!("Unhealthy: GPU 0: {lost}"));
        assert_eq!(lines[6], format!("Unhealthy: GPU 1/GI 3: {xid}"));
        // A document of an agent before the field reads as healthy.
        let mut raw = serde_json::to_value(&healthy).unwrap();
        raw["clients"][0].as_object_mut().unwrap().remove("unhealthy");
        let parsed: ClientTable = parse_document(&raw.to_string(), "ClientTable").unwrap();
        assert_eq!(parsed.clients[0].unhealthy, None);
    }

    #[test]
    fn clients_are_listed_one_line_each_then_idle_capacity() {
        let whole = GpuClient {
            command: Some("python3 serve.py".into()),
            unit: Some("serve.service".into()),
            memory_bytes: Some(1 << 30),
            ..client(4242, "gpu")
        };
        let mps = GpuClient {
            user: None,
            container: Some("0123456789ab".into()),
            unit: Some("docker-x.scope".into()),
            gpu: 1,
            gpu_instance_id: Some(3),
            instance: Some("MIG-c".into()),
            mps_server: Some("MIG-c".into()),
            share: Some(ClientShare {
                active_thread_percentage: 10,
                pinned_memory_bytes: Some(8 << 30),
                from: "client".into(),
            }),
            ..client(4250, "mps")
        };
        let table = ClientTable {
            clients: vec![whole, mps],
            idle: vec![IdleDevice {
                gpu: 1,
                uuid: "MIG-b".into(),
                what: "mig".into(),
                describe: "GPU 1 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process".into(),
            }],
            ..ClientTable::default()
        };
        let text = render(&table);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let cols = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[0]),
            ["PID", "USER", "UNIT/CONTAINER", "WHERE", "MEMORY", "SHARE", "COMMAND"]
        );
        assert!(lines[1].starts_with("4242"), "{text}");
        for word in ["alice", "serve.service", "GPU 0 ", "1 GiB", "python3 serve.py"] {
            assert!(lines[1].contains(word), "{word}: {text}");
        }
        for word in
            ["1000", "container 0123456789ab", "GPU 1/GI 3 MPS", "10 % threads (own), 8 GiB pinned"]
        {
            assert!(lines[2].contains(word), "{word}: {text}");
        }
        assert!(lines[2].trim_end().ends_with('-'), "no command shown: {text}");
        assert_eq!(lines[3], "Idle:");
        assert_eq!(lines[4], "  MIG-b  GPU 1 (A100-SXM4-40GB) MIG 1g.5gb (GI 9, CI 0): no process");

        let empty = ClientTable::default();
        assert_eq!(render(&empty), "No process uses the GPUs.\n");
        // A process the driver lists and the agent's /proc lacks is said, not dropped.
        let unseen = UnseenProcess {
            pid: 999_999,
            gpu: 2,
            gpu_instance_id: None,
            memory_bytes: Some(512 << 20),
        };
        let table = ClientTable { unseen: vec![unseen], ..ClientTable::default() };
        assert_eq!(
            render(&table),
            "Listed by the driver, not in the agent's /proc (another PID namespace, or just ended):\n  PID 999999  GPU 2  512 MiB\n"
        );
    }

    #[test]
    fn long_units_are_cut_in_tables_only() {
        let unit = format!("{}.service", "x".repeat(100));
        let c = GpuClient { unit: Some(unit.clone()), ..client(7, "gpu") };
        let shown = placement(&c);
        assert_eq!(shown.chars().count(), UNIT_COLUMN_MAX);
        assert!(shown.starts_with("xxx") && shown.ends_with('…'), "{shown}");
        assert!(client_rows(std::iter::once(&c)).lines().all(|l| l.chars().count() < 120));
        assert_eq!(field(&c, ClientField::Unit), unit);
    }

    #[test]
    fn watched_frames_carry_the_time() {
        let now = local_time_now();
        // `2026-11-27 11:40:05 UTC`: a date, a time and a zone.
        let words: Vec<&str> = now.split(' ').collect();
        assert_eq!(words.len(), 3, "{now}");
        assert_eq!((words[0].len(), words[1].len()), (10, 8), "{now}");
        assert_eq!(with_time(r#"{"clients":[]}"#, "T"), r#"{"clients":[],"time":"T"}"#);
        assert_eq!(with_time("{}\n", "T"), r#"{"time":"T"}"#);
        assert_eq!(with_time("not json\n", "T"), "not json");
    }

    #[test]
    fn csv_has_a_header_and_quotes_what_needs_it() {
        use crate::cli::parse_field;
        let odd = GpuClient {
            command: Some("python3 -c \"print(1, 2)\"\n\u{1b}[2Ksecond line".into()),
            memory_bytes: Some(512 << 20),
            share: Some(ClientShare {
                active_thread_percentage: 25,
                pinned_memory_bytes: None,
                from: "server".into(),
            }),
            ..client(4242, "mps")
        };
        let plain = GpuClient { user: None, uid: None, ..client(7, "gpu") };
        let table = ClientTable { clients: vec![odd, plain], ..ClientTable::default() };
        let fields: Vec<ClientField> =
            "pid,user,uid,memory_bytes,share_threads,share_memory_bytes,command"
                .split(',')
                .map(|f| parse_field(f).unwrap())
                .collect();
        assert_eq!(
            csv(&table, &fields, CsvFormat { header: true }),
            "pid,user,uid,memory_bytes,share_threads,share_memory_bytes,command\n\
             4242,alice,1000,536870912,25,,\"python3 -c \"\"print(1, 2)\"\"??[2Ksecond line\"\n\
             7,,,,,,\n"
        );
        let fields = [ClientField::Pid, ClientField::Via];
        assert_eq!(csv(&table, &fields, CsvFormat { header: false }), "4242,mps\n7,gpu\n");
        assert_eq!(csv(&ClientTable::default(), &fields, CsvFormat::default()), "pid,via\n");
        assert_eq!(csv_quote("a,b"), "\"a,b\"");
        assert_eq!(csv_quote("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_quote("cr\rlf"), "\"cr\rlf\"");
        assert_eq!(csv_quote("plain text"), "plain text");
    }

    #[test]
    fn every_field_has_a_value() {
        let c = GpuClient {
            unit: Some("serve.service".into()),
            container: Some("0123456789ab".into()),
            instance: Some("MIG-c".into()),
            mps_server: Some("MIG-c".into()),
            share: Some(ClientShare {
                active_thread_percentage: 10,
                pinned_memory_bytes: Some(1 << 30),
                from: "client".into(),
            }),
            command: Some("sleep 600".into()),
            memory_bytes: Some(1),
            unhealthy: Some("Xid 94 (Contained memory error): restart the application".into()),
            ..client(9, "mps")
        };
        let values: Vec<String> = ClientField::ALL.iter().map(|f| field(&c, *f)).collect();
        assert_eq!(
            values,
            [
                "9",
                "alice",
                "1000",
                "serve.service",
                "0123456789ab",
                "0",
                "GPU-0",
                "MIG-c",
                "mps",
                "MIG-c",
                "1",
                "10",
                "1073741824",
                "sleep 600",
                "Xid 94 (Contained memory error): restart the application"
            ]
        );
    }

    #[test]
    fn a_long_screen_is_cut_with_a_count() {
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        assert_eq!(fit(&text, 10, 80), text);
        assert_eq!(fit(&text, 40, 80), text);
        assert_eq!(fit(&text, 4, 80), "line 1\nline 2\nline 3\n… 7 more lines\n");
        assert_eq!(
            fit(&text, 9, 80),
            format!("{}… 2 more lines\n", &text[..text.find("line 9").unwrap()])
        );
        // A terminal too small still shows the first line and the count.
        assert_eq!(fit(&text, 0, 80), "line 1\n… 9 more lines\n");
        assert_eq!(fit("a\nb\n", 1, 80), "a\n… 1 more line\n");
        // Lines as wide as the terminal at most; characters, not bytes.
        assert_eq!(fit("├─ 3g.20gb\nab\n", 5, 4), "├─ 3\nab\n");
        assert_eq!(fit(&text, 3, 3), "lin\nlin\n… 8 more lines\n");
    }

    #[test]
    fn documents_become_one_line() {
        assert_eq!(
            one_line("{\n  \"clients\": [],\n  \"idle\": []\n}\n", "ClientTable").unwrap(),
            "{\"clients\":[],\"idle\":[]}"
        );
        assert!(one_line("[]", "ClientTable").is_err());
    }
}
