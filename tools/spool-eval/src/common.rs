//! Record format, payload generation and measurement helpers shared by all backends.

use std::io;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Fixed header: class u8, key_len u8, origin u64, seq u64, ingress_ts u64 (little endian).
pub const HEADER_LEN: usize = 1 + 1 + 8 + 8 + 8;
pub const KEY_LEN: usize = 20;
/// Byte offset of the seq field inside an encoded record.
pub const SEQ_OFFSET: usize = 2 + 8;

/// Encode one spool record into `out` (appends).
pub fn encode(out: &mut Vec<u8>, seq: u64, origin: u64, ts: u64, class: u8, payload: &[u8]) {
    out.reserve(HEADER_LEN + KEY_LEN + payload.len());
    out.push(class);
    out.push(KEY_LEN as u8);
    out.extend_from_slice(&origin.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&ts.to_le_bytes());
    // 20-byte key: "k-" + 18 hex digits of origin^seq.
    let k = format!("k-{:018x}", origin.rotate_left(17) ^ seq);
    out.extend_from_slice(&k.as_bytes()[..KEY_LEN]);
    out.extend_from_slice(payload);
}

/// Overwrite the seq field of an encoded record.
pub fn set_seq(rec: &mut [u8], seq: u64) {
    rec[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&seq.to_le_bytes());
}

/// Decode and sanity-check a record, returning (seq, payload_len).
pub fn decode(rec: &[u8]) -> io::Result<(u64, usize)> {
    if rec.len() < HEADER_LEN + KEY_LEN {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short record"));
    }
    let key_len = rec[1] as usize;
    let seq = u64::from_le_bytes(rec[SEQ_OFFSET..SEQ_OFFSET + 8].try_into().unwrap());
    let plen = rec
        .len()
        .checked_sub(HEADER_LEN + key_len)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad key length"))?;
    Ok((seq, plen))
}

pub fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Pool of incompressible bytes; payloads are slices at varying offsets.
pub struct PayloadPool {
    pool: Vec<u8>,
    len: usize,
}

impl PayloadPool {
    pub fn new(len: usize, seed: u64) -> Self {
        let mut x = seed | 1;
        let mut pool = Vec::with_capacity(4 << 20);
        while pool.len() < (4 << 20) {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            pool.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        PayloadPool { pool, len }
    }
    pub fn get(&self, i: u64) -> &[u8] {
        let span = (self.pool.len() - self.len) as u64;
        let off = (i.wrapping_mul(4099) % span) as usize;
        &self.pool[off..off + self.len]
    }
}

/// A batch of encoded records that must become durable together.
#[derive(Default)]
pub struct Group {
    pub first_seq: u64,
    pub buf: Vec<u8>,
    pub ends: Vec<usize>,
}

impl Group {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn push_end(&mut self) {
        self.ends.push(self.buf.len());
    }
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        let mut start = 0;
        self.ends.iter().enumerate().map(move |(i, &e)| {
            let s = start;
            start = e;
            (self.first_seq + i as u64, &self.buf[s..e])
        })
    }
}

/// (read_bytes, write_bytes, cancelled_write_bytes) from /proc/self/io.
pub fn proc_io() -> (u64, u64, u64) {
    let s = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let mut r = (0, 0, 0);
    for line in s.lines() {
        let mut it = line.split(':');
        let (k, v) = (it.next().unwrap_or(""), it.next().unwrap_or("").trim());
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "read_bytes" => r.0 = v,
            "write_bytes" => r.1 = v,
            "cancelled_write_bytes" => r.2 = v,
            _ => {}
        }
    }
    r
}

/// Allocated bytes under `path` (like `du -s --block-size=1`): st_blocks * 512.
pub fn du(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_dir() {
                    total += du(&e.path());
                } else {
                    total += m.blocks() * 512;
                }
            }
        }
    }
    total
}

/// Apparent size (sum of file lengths).
pub fn apparent(path: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_dir() {
                    total += apparent(&e.path());
                } else {
                    total += m.len();
                }
            }
        }
    }
    total
}

pub fn count_files(path: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                if m.is_dir() {
                    n += count_files(&e.path());
                } else {
                    n += 1;
                }
            }
        }
    }
    n
}

pub fn sync_dir(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Ordered key=value results of one step; printed as one `RESULT` line.
#[derive(Default)]
pub struct Report(pub Vec<(String, String)>);

pub trait Val {
    fn fmt_val(&self) -> String;
}
impl Val for f64 {
    fn fmt_val(&self) -> String {
        format!("{self:.4}")
    }
}
impl Val for u64 {
    fn fmt_val(&self) -> String {
        self.to_string()
    }
}
impl Val for usize {
    fn fmt_val(&self) -> String {
        self.to_string()
    }
}
impl Val for &str {
    fn fmt_val(&self) -> String {
        self.to_string()
    }
}
impl Val for String {
    fn fmt_val(&self) -> String {
        self.clone()
    }
}

impl Report {
    pub fn add<V: Val>(&mut self, k: &str, v: V) {
        self.0.push((k.to_string(), v.fmt_val()));
    }
    pub fn line(&self) -> String {
        let mut s = String::from("RESULT");
        for (k, v) in &self.0 {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(&v.replace(' ', "_"));
        }
        s
    }
}
