//! What `/proc` says of a process and the processes below it: CPU time and
//! resident memory, for the gateway's load and peers examples (a proxy
//! that forks workers, as LiteLLM may, is measured whole).

/// `pid` and every process below it.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let parent = stat_fields(&stat)
                .get(1)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0);
            parents.push((child, parent));
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// The fields of a `/proc/<pid>/stat` line after the command name (which
/// is in parentheses and may hold spaces): state, ppid, ...
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect()
}

/// The CPU time (user and system) of `pid` and its descendants so far, in
/// seconds: utime and stime, the 14th and 15th fields of the stat line (the
/// 12th and 13th after the name), in clock ticks of `getconf CLK_TCK`, 100
/// here.
pub fn cpu_seconds(pid: u32) -> f64 {
    process_tree(pid)
        .into_iter()
        .map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let fields = stat_fields(&stat);
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            (ticks(11) + ticks(12)) as f64 / 100.0
        })
        .sum()
}

/// The resident memory of `pid` and its descendants, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    process_tree(pid)
        .into_iter()
        .map(|p| {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}
