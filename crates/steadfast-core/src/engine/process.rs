//! Who this process is, for leases: host, pid and start time, and whether a
//! recorded owner on this host is still alive.

use crate::record::checkpoint::Owner;

/// This process as a lease owner. The start time (from `/proc` on Linux; 0
/// elsewhere) tells this process apart from a later one that reuses its pid.
pub fn current_owner() -> Owner {
    let pid = std::process::id();
    Owner::new(hostname(), pid, start_time(pid).unwrap_or(0))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Field 22 of `/proc/PID/stat`: the start time in clock ticks since boot;
/// `None` for no such process, or one that has exited and waits to be
/// reaped (a zombie: it runs nothing and holds nothing).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the lease holder `owner` is still running, when it is on this
/// host (`None` for another host, whose processes cannot be seen from here).
pub fn holder_is_running(owner: &Owner) -> Option<bool> {
    (owner.host == hostname()).then(|| is_alive(owner))
}

/// Whether `owner`, recorded on this host, is still running. Unknown means
/// alive: a lease is only taken over early when its holder is surely gone.
pub(crate) fn is_alive(owner: &Owner) -> bool {
    if !std::path::Path::new("/proc/self/stat").exists() {
        return true;
    }
    match start_time(owner.pid) {
        None => false,
        Some(started) => owner.started == 0 || started == owner.started,
    }
}

/// The boot-clock deadline `ttl` from now on this host, for a lease's
/// [`local_until`](crate::Lease::local_until) (`None` where the system has
/// no boot clock).
pub fn local_deadline(ttl: std::time::Duration) -> Option<u64> {
    boot_millis().map(|b| b.saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64))
}

/// Milliseconds since this host booted, counting time asleep: the same clock
/// for every process on the host, and unmoved when someone sets the wall
/// clock. `None` where the system has no such clock.
pub(crate) fn boot_millis() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let secs = u64::try_from(t.tv_sec()).ok()?;
    let nanos = u64::try_from(t.tv_nsec()).ok()?;
    Some(secs.saturating_mul(1000).saturating_add(nanos / 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder that exited but is not reaped yet is gone: its lease can be
    /// taken over at once.
    #[test]
    fn a_zombie_holder_is_not_alive() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let started = start_time(pid).expect("a running child has a start time");
        let owner = Owner::new(hostname(), pid, started);
        assert!(is_alive(&owner), "running");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_alive(&owner), "exited, not yet reaped");
        assert_eq!(holder_is_running(&owner), Some(false));
        child.wait().expect("reap");
        assert!(!is_alive(&owner), "reaped");
        assert!(is_alive(&current_owner()), "this process");
    }
}
