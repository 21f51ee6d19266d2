//! A FUSE filesystem for fault tests: what a program writes stays in this
//! filesystem's own cache until the program syncs it, as it would in a
//! disk's volatile cache, and a simulated power cut forgets everything not
//! synced. It can also fail chosen calls with an errno (EIO, ENOSPC), and
//! reports a capacity so that a program's free-space checks and a full
//! disk can be tested.
//!
//! What survives a power cut, strictly as POSIX promises and no more:
//! - a file's data and size as of its last successful `fsync` or
//!   `fdatasync`;
//! - a directory's entries (created, renamed or removed names) as of its
//!   last successful `fsync`;
//! - nothing else: a file whose name was never synced in its directory is
//!   gone, whatever was synced of its data.
//!
//! A failed `fsync` (injected) behaves as Linux does after a writeback
//! error: the data it covered is dropped from what will survive, yet stays
//! readable until the power cut, and a later `fsync` of the same file
//! succeeds without making it durable. A program that retries the sync and
//! trusts it loses data at the next cut ("fsyncgate").
//!
//! A cut may also keep a random part of what was not synced
//! ([`Cut::Torn`]): a prefix of each file's unsynced writes, the last one
//! cut at a random byte, as a disk that wrote some of its cache would.
//!
//! Every reply carries a zero time-to-live and every open is direct I/O,
//! so the kernel caches nothing: after a cut, the next read sees what
//! survived. `syncfs(2)` is not seen by a FUSE filesystem and persists
//! nothing here.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

/// Block size reported to `statfs`.
const BLOCK: u64 = 4096;
/// Nothing is cached by the kernel.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

/// A call that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `write`, `pwrite`.
    Write,
    /// `fsync`, `fdatasync` of a file.
    Fsync,
    /// `fsync` of a directory.
    FsyncDir,
    /// Creating a file or directory.
    Create,
    /// `rename`.
    Rename,
}

/// What a power cut keeps of what was not synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Nothing.
    Clean,
    /// Per file, a random prefix of its unsynced writes, the last one torn
    /// at a random byte (from this seed).
    Torn(u64),
}

/// Counts of what happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Successful file syncs.
    pub fsyncs: u64,
    /// Successful directory syncs.
    pub dir_syncs: u64,
    /// Calls failed on purpose.
    pub injected: u64,
    /// Power cuts.
    pub cuts: u64,
    /// Bytes of unsynced writes forgotten by cuts.
    pub lost_bytes: u64,
}

#[derive(Debug, Clone)]
struct Fault {
    op: Op,
    errno: i32,
    /// Calls left to fail.
    left: u32,
    /// Only for files whose name contains this.
    name: Option<String>,
}

#[derive(Debug, Clone)]
enum Change {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Debug, Default)]
struct FileData {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Changes since the last sync, in order.
    pending: Vec<Change>,
}

#[derive(Debug, Default)]
struct DirData {
    live: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
}

#[derive(Debug)]
enum Node {
    File(FileData),
    Dir(DirData),
}

#[derive(Debug)]
struct Inode {
    node: Node,
    /// The last name it had (for name-matched faults).
    name: OsString,
    mode: u16,
}

#[derive(Debug)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    capacity: u64,
    faults: Vec<Fault>,
    stats: Stats,
}

impl State {
    fn new(capacity: u64) -> State {
        let mut inodes = HashMap::new();
        inodes.insert(
            ROOT,
            Inode {
                node: Node::Dir(DirData::default()),
                name: OsString::from("/"),
                mode: 0o755,
            },
        );
        State {
            inodes,
            next_ino: ROOT + 1,
            capacity,
            faults: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn used(&self) -> u64 {
        self.inodes
            .values()
            .map(|i| match &i.node {
                Node::File(f) => f.live.len() as u64,
                Node::Dir(_) => 0,
            })
            .sum()
    }

    /// The errno to fail `op` on `ino` with, if a fault matches (and is
    /// used up by it).
    fn fault(&mut self, op: Op, ino: u64) -> Option<Errno> {
        let name = self
            .inodes
            .get(&ino)
            .map(|i| i.name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let k = self.faults.iter().position(|f| {
            f.op == op && f.left > 0 && f.name.as_ref().is_none_or(|n| name.contains(n.as_str()))
        })?;
        let f = &mut self.faults[k];
        f.left -= 1;
        let errno = f.errno;
        if f.left == 0 {
            self.faults.remove(k);
        }
        self.stats.injected += 1;
        Some(Errno::from_i32(errno))
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let i = self.inodes.get(&ino)?;
        let (kind, size, nlink) = match &i.node {
            Node::File(f) => (FileType::RegularFile, f.live.len() as u64, 1),
            Node::Dir(_) => (FileType::Directory, 0, 2),
        };
        let now = SystemTime::now();
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm: i.mode,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLOCK as u32,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut DirData, Errno> {
        match self.inodes.get_mut(&ino).map(|i| &mut i.node) {
            Some(Node::Dir(d)) => Ok(d),
            Some(Node::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match self.inodes.get_mut(&ino).map(|i| &mut i.node) {
            Some(Node::File(f)) => Ok(f),
            Some(Node::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?
            .live
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    fn make(&mut self, parent: u64, name: &OsStr, node: Node, mode: u16) -> Result<u64, Errno> {
        if let Some(e) = self.fault(Op::Create, parent) {
            return Err(e);
        }
        if self.dir(parent)?.live.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(
            ino,
            Inode {
                node,
                name: name.to_owned(),
                mode,
            },
        );
        self.dir(parent)?.live.insert(name.to_owned(), ino);
        Ok(ino)
    }

    fn set_len(&mut self, ino: u64, len: u64) -> Result<(), Errno> {
        let grow = len.saturating_sub(self.file(ino)?.live.len() as u64);
        if self.used() + grow > self.capacity {
            return Err(Errno::from_i32(libc::ENOSPC));
        }
        let f = self.file(ino)?;
        f.live.resize(len as usize, 0);
        f.pending.push(Change::SetLen(len));
        Ok(())
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        if let Some(e) = self.fault(Op::Write, ino) {
            return Err(e);
        }
        let end = offset as usize + data.len();
        let grow = (end as u64).saturating_sub(self.file(ino)?.live.len() as u64);
        if self.used() + grow > self.capacity {
            return Err(Errno::from_i32(libc::ENOSPC));
        }
        let f = self.file(ino)?;
        if f.live.len() < end {
            f.live.resize(end, 0);
        }
        f.live[offset as usize..end].copy_from_slice(data);
        f.pending.push(Change::Write(offset, data.to_vec()));
        Ok(data.len() as u32)
    }

    fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        let dir = matches!(self.inodes.get(&ino).map(|i| &i.node), Some(Node::Dir(_)));
        let op = if dir { Op::FsyncDir } else { Op::Fsync };
        if let Some(e) = self.fault(op, ino) {
            // As Linux after a writeback error: what the sync covered is
            // no longer waiting to be written, and is not durable either.
            if let Ok(f) = self.file(ino) {
                let lost: usize = f.pending.iter().map(change_bytes).sum();
                f.pending.clear();
                self.stats.lost_bytes += lost as u64;
            }
            return Err(e);
        }
        match self.inodes.get_mut(&ino).map(|i| &mut i.node) {
            Some(Node::File(f)) => {
                for c in f.pending.drain(..) {
                    apply(&mut f.durable, &c, usize::MAX);
                }
                self.stats.fsyncs += 1;
                Ok(())
            }
            Some(Node::Dir(d)) => {
                d.durable = d.live.clone();
                self.stats.dir_syncs += 1;
                Ok(())
            }
            None => Err(Errno::ENOENT),
        }
    }

    fn cut(&mut self, how: Cut) {
        let mut rng = match how {
            Cut::Clean => None,
            Cut::Torn(seed) => Some(Rng(seed | 1)),
        };
        let mut lost = 0u64;
        let mut inos: Vec<u64> = self.inodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let inode = self.inodes.get_mut(&ino).expect("listed");
            match &mut inode.node {
                Node::File(f) => {
                    let pending = std::mem::take(&mut f.pending);
                    let keep = rng.as_mut().map_or(0, |r| r.below(pending.len() + 1));
                    for (k, c) in pending.iter().enumerate() {
                        if k < keep {
                            // The last change kept may be torn.
                            let limit = match (k + 1 == keep, rng.as_mut()) {
                                (true, Some(r)) => r.below(change_bytes(c) + 1),
                                _ => usize::MAX,
                            };
                            apply(&mut f.durable, c, limit);
                        } else {
                            lost += change_bytes(c) as u64;
                        }
                    }
                    f.live = f.durable.clone();
                }
                Node::Dir(d) => d.live = d.durable.clone(),
            }
        }
        self.stats.lost_bytes += lost;
        self.stats.cuts += 1;
    }
}

fn change_bytes(c: &Change) -> usize {
    match c {
        Change::Write(_, d) => d.len(),
        Change::SetLen(_) => 0,
    }
}

/// Applies `c` to `data`, at most `limit` bytes of a write.
fn apply(data: &mut Vec<u8>, c: &Change, limit: usize) {
    match c {
        Change::Write(offset, bytes) => {
            let bytes = &bytes[..bytes.len().min(limit)];
            let start = *offset as usize;
            let end = start + bytes.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[start..end].copy_from_slice(bytes);
        }
        Change::SetLen(len) => data.resize(*len as usize, 0),
    }
}

/// xorshift64*: a seeded, reproducible choice of what a torn cut keeps.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1) as u64) as usize
    }
}

/// The filesystem as FUSE serves it.
struct FaultFs {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl FaultFs {
    fn st(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn entry(&self, reply: ReplyEntry, made: Result<u64, Errno>) {
        let st = self.st();
        match made.and_then(|ino| st.attr(ino).ok_or(Errno::ENOENT)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.st().lookup(parent.0, name);
        self.entry(reply, found);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.st().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.st();
        if let Some(len) = size {
            if let Err(e) = st.set_len(ino.0, len) {
                return reply.error(e);
            }
        }
        if let (Some(mode), Some(i)) = (mode, st.inodes.get_mut(&ino.0)) {
            i.mode = (mode & 0o7777) as u16;
        }
        match st.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.st().make(
            parent.0,
            name,
            Node::Dir(DirData::default()),
            (mode & 0o7777) as u16,
        );
        self.entry(reply, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st();
        let r = st
            .dir(parent.0)
            .and_then(|d| d.live.remove(name).map(|_| ()).ok_or(Errno::ENOENT));
        empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st();
        let r = st.lookup(parent.0, name).and_then(|ino| {
            if st.dir(ino)?.live.is_empty() {
                st.dir(parent.0)?.live.remove(name);
                Ok(())
            } else {
                Err(Errno::ENOTEMPTY)
            }
        });
        empty(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st();
        let r = (|| {
            let ino = st.lookup(parent.0, name)?;
            if let Some(e) = st.fault(Op::Rename, ino) {
                return Err(e);
            }
            st.dir(newparent.0)?;
            st.dir(parent.0)?.live.remove(name);
            st.dir(newparent.0)?.live.insert(newname.to_owned(), ino);
            if let Some(i) = st.inodes.get_mut(&ino) {
                i.name = newname.to_owned();
            }
            Ok(())
        })();
        empty(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.st().inodes.contains_key(&ino.0) {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.st();
        match st.file(ino.0) {
            Ok(f) => {
                let start = (offset as usize).min(f.live.len());
                let end = (start + size as usize).min(f.live.len());
                reply.data(&f.live[start..end]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.st().write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.st().fsync(ino.0);
        empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.st().dir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.st();
        let entries: Vec<(OsString, u64)> = match st.dir(ino.0) {
            Ok(d) => d.live.iter().map(|(n, i)| (n.clone(), *i)).collect(),
            Err(e) => return reply.error(e),
        };
        let mut all = vec![
            (OsString::from("."), ino.0, FileType::Directory),
            (OsString::from(".."), ROOT, FileType::Directory),
        ];
        for (name, i) in entries {
            let kind = match st.inodes.get(&i).map(|n| &n.node) {
                Some(Node::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            all.push((name, i, kind));
        }
        for (k, (name, i, kind)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(i), (k + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.st().fsync(ino.0);
        empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.st();
        let blocks = st.capacity / BLOCK;
        let free = st.capacity.saturating_sub(st.used()) / BLOCK;
        reply.statfs(
            blocks,
            free,
            free,
            1 << 20,
            1 << 20,
            BLOCK as u32,
            255,
            BLOCK as u32,
        );
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.st();
        let made = st.make(
            parent.0,
            name,
            Node::File(FileData::default()),
            (mode & 0o7777) as u16,
        );
        match made.and_then(|ino| st.attr(ino).ok_or(Errno::ENOENT)) {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }
}

/// A mounted [`FaultFs`]: unmounted when dropped.
pub struct Mounted {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

/// Mounts an empty filesystem of `capacity` bytes at `at` (an existing
/// directory; needs root or a FUSE mount helper).
pub fn mount(at: &Path, capacity: u64) -> io::Result<Mounted> {
    let state = Arc::new(Mutex::new(State::new(capacity)));
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("weir-faultfs".into()),
        MountOption::Subtype("weir-faultfs".into()),
    ];
    let session = fuser::spawn_mount2(
        FaultFs {
            state: state.clone(),
        },
        at,
        &config,
    )?;
    Ok(Mounted {
        state,
        session: Some(session),
    })
}

impl Mounted {
    /// A power cut: everything not synced is forgotten (or, with
    /// [`Cut::Torn`], partly kept). Programs using the filesystem must
    /// have been stopped first, as the cut stops them on a real box.
    pub fn power_cut(&self, how: Cut) {
        lock(&self.state).cut(how);
    }

    /// Fails the next `count` calls of `op` (on files or directories whose
    /// name contains `name`, if given) with `errno`.
    pub fn fail(&self, op: Op, errno: i32, count: u32, name: Option<&str>) {
        lock(&self.state).faults.push(Fault {
            op,
            errno,
            left: count,
            name: name.map(str::to_owned),
        });
    }

    /// Removes every fault not yet used.
    pub fn heal(&self) {
        lock(&self.state).faults.clear();
    }

    /// What happened so far.
    pub fn stats(&self) -> Stats {
        lock(&self.state).stats
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errno has no `PartialEq`: compare codes.
    fn code<T>(r: Result<T, Errno>) -> Result<T, i32> {
        r.map_err(Errno::code)
    }

    fn state() -> (State, u64, u64) {
        let mut st = State::new(1 << 20);
        let dir = st
            .make(ROOT, OsStr::new("d"), Node::Dir(DirData::default()), 0o755)
            .unwrap();
        st.fsync(ROOT).unwrap();
        let f = st
            .make(dir, OsStr::new("f"), Node::File(FileData::default()), 0o644)
            .unwrap();
        (st, dir, f)
    }

    fn live(st: &mut State, f: u64) -> Vec<u8> {
        st.file(f).unwrap().live.clone()
    }

    #[test]
    fn a_cut_keeps_synced_data_and_names_only() {
        let (mut st, dir, f) = state();
        st.write(f, 0, b"hello").unwrap();
        st.fsync(f).unwrap();
        st.write(f, 5, b" world").unwrap();
        // The name is not synced yet: the file is gone after a cut.
        st.cut(Cut::Clean);
        assert_eq!(code(st.lookup(dir, OsStr::new("f"))), Err(libc::ENOENT));
        let f = st
            .make(dir, OsStr::new("g"), Node::File(FileData::default()), 0o644)
            .unwrap();
        st.write(f, 0, b"hello").unwrap();
        st.fsync(f).unwrap();
        st.fsync(dir).unwrap();
        st.write(f, 5, b" world").unwrap();
        st.set_len(f, 3).unwrap();
        assert_eq!(live(&mut st, f), b"hel");
        st.cut(Cut::Clean);
        assert_eq!(code(st.lookup(dir, OsStr::new("g"))), Ok(f));
        assert_eq!(live(&mut st, f), b"hello");
        // A rename not synced in its directory is undone.
        st.dir(dir).unwrap().live.remove(OsStr::new("g"));
        st.dir(dir).unwrap().live.insert("h".into(), f);
        st.cut(Cut::Clean);
        assert_eq!(code(st.lookup(dir, OsStr::new("g"))), Ok(f));
        assert_eq!(code(st.lookup(dir, OsStr::new("h"))), Err(libc::ENOENT));
    }

    #[test]
    fn a_failed_fsync_loses_what_it_covered_though_a_retry_succeeds() {
        let (mut st, dir, f) = state();
        st.fsync(dir).unwrap();
        st.write(f, 0, b"kept").unwrap();
        st.fsync(f).unwrap();
        st.write(f, 4, b"-lost").unwrap();
        st.faults.push(Fault {
            op: Op::Fsync,
            errno: libc::EIO,
            left: 1,
            name: Some("f".into()),
        });
        assert_eq!(code(st.fsync(f)), Err(libc::EIO));
        // Still readable, and a second sync "succeeds".
        assert_eq!(live(&mut st, f), b"kept-lost");
        assert_eq!(code(st.fsync(f)), Ok(()));
        st.cut(Cut::Clean);
        assert_eq!(live(&mut st, f), b"kept");
        assert_eq!(st.stats.injected, 1);
    }

    #[test]
    fn a_torn_cut_keeps_a_prefix_of_the_unsynced_writes() {
        for seed in 1..200 {
            let (mut st, dir, f) = state();
            st.fsync(dir).unwrap();
            let mut expect = Vec::new();
            for k in 0..5u8 {
                let chunk = vec![b'a' + k; 10];
                st.write(f, expect.len() as u64, &chunk).unwrap();
                expect.extend_from_slice(&chunk);
            }
            st.cut(Cut::Torn(seed));
            let got = live(&mut st, f);
            assert_eq!(got[..], expect[..got.len()], "seed {seed}");
        }
    }

    #[test]
    fn writes_past_the_capacity_fail_with_enospc() {
        let mut st = State::new(100);
        let f = st
            .make(
                ROOT,
                OsStr::new("f"),
                Node::File(FileData::default()),
                0o644,
            )
            .unwrap();
        assert_eq!(code(st.write(f, 0, &[1; 100])), Ok(100));
        assert_eq!(code(st.write(f, 100, &[1; 1])), Err(libc::ENOSPC));
    }
}
