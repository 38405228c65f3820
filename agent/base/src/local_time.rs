//! The local time as people read it on this host (`TZ` and `/etc/localtime` count), for
//! `gpushare-ctl clients` and the simulated NVIDIA tools' output and logs: the C library's
//! `localtime_r` and `strftime`, through raw `libc` because nix has no local time (and std
//! none at all). The one `unsafe` block of it in gpushare.

use std::ffi::CString;

/// `seconds` since the Unix epoch as local time, formatted by `strftime(format)` (at most
/// 63 bytes); `None` when the C library cannot tell the local time or `format` holds a NUL.
pub fn format(seconds: u64, format: &str) -> Option<String> {
    let seconds = libc::time_t::try_from(seconds).unwrap_or(libc::time_t::MAX);
    let format = CString::new(format).ok()?;
    let mut buffer = [0u8; 64];
    // SAFETY: `libc::tm` is plain old data, so all zeros is a valid value; localtime_r
    // reads `seconds` and writes only into `tm`, both alive for the call; strftime writes at
    // most `buffer.len()` bytes into `buffer` from the NUL-terminated `format` and `tm`,
    // and returns how many it wrote.
    let written = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&raw const seconds, &raw mut tm).is_null() {
            return None;
        }
        libc::strftime(buffer.as_mut_ptr().cast(), buffer.len(), format.as_ptr(), &raw const tm)
    };
    Some(String::from_utf8_lossy(&buffer[..written.min(buffer.len())]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_reads_as_its_year_in_any_time_zone() {
        // 1970 in UTC and east of it, 1969 west of it: whatever TZ the machine has.
        let year = format(0, "%Y").expect("the C library tells the local time");
        assert!(year == "1970" || year == "1969", "{year}");
        assert_eq!(format(0, "100%%").as_deref(), Some("100%"));
        assert_eq!(format(0, "a\0b"), None);
    }
}
