//! File operations on segments: names, creation (durably), reading back,
//! truncation, moving a bad file aside, deletion, checkpoints.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use weir_core::spool::{Checkpoint, SegmentHeader};

/// Extension of segment files.
pub(super) const SEGMENT_EXT: &str = "seg";
/// Name of a class's checkpoint file.
pub(super) const CHECKPOINT_FILE: &str = "released";

/// `dir/<first_index, 20 digits>.seg`: names sort in log order.
pub(super) fn segment_path(dir: &Path, first_index: u64) -> PathBuf {
    dir.join(format!("{first_index:020}.{SEGMENT_EXT}"))
}

/// The first index a segment file name states, if it is one.
pub(super) fn parse_segment_name(path: &Path) -> Option<u64> {
    if path.extension()? != SEGMENT_EXT {
        return None;
    }
    path.file_stem()?.to_str()?.parse().ok()
}

/// fsync of a directory, so that files created, renamed or deleted in it
/// stay so after a power cut.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and any missing parent, durably: each directory created
/// is synced in its parent, so that a power cut cannot take a directory
/// (and every segment in it) that files were synced into. The parent of
/// `dir` is synced even when `dir` existed: an earlier start may have
/// created it without.
pub(crate) fn create_dir_durable(dir: &Path) -> io::Result<()> {
    let mut created = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        created.push(d.to_path_buf());
        at = d.parent();
    }
    fs::create_dir_all(dir)?;
    if created.is_empty() {
        created.push(dir.to_path_buf());
    }
    for d in created.iter().rev() {
        let parent = match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        sync_dir(parent)?;
    }
    Ok(())
}

/// Creates a segment file holding `header`, durably (file and directory
/// synced): frames appended later never sit in a file whose header or
/// directory entry a power cut could lose.
pub(super) fn create_segment(dir: &Path, header: &SegmentHeader) -> io::Result<(File, u64)> {
    let path = segment_path(dir, header.first_index);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let mut bytes = Vec::with_capacity(header.encoded_len());
    header.encode(&mut bytes);
    file.write_all_at(&bytes, 0)?;
    file.sync_data()?;
    sync_dir(dir)?;
    Ok((file, bytes.len() as u64))
}

/// Opens an existing segment to append after its `len` valid bytes.
pub(super) fn open_segment(dir: &Path, first_index: u64) -> io::Result<(File, SegmentHeader)> {
    let path = segment_path(dir, first_index);
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let mut buf = vec![0u8; 512];
    let n = file.read_at(&mut buf, 0)?;
    let (header, _) = SegmentHeader::decode(&buf[..n])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((file, header))
}

/// Reads `len` bytes at `offset`, fewer at the end of the file.
pub(super) fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Cuts a segment to `len` bytes (a torn tail), durably.
pub(super) fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(len)?;
    file.sync_all()
}

/// Moves an unreadable segment aside (`<name>.bad`) so that start-up goes
/// on and an operator can look at it.
pub(super) fn quarantine(path: &Path) -> io::Result<PathBuf> {
    let mut to = path.as_os_str().to_owned();
    to.push(".bad");
    let to = PathBuf::from(to);
    fs::rename(path, &to)?;
    Ok(to)
}

/// Deletes a segment; one already gone is fine.
pub(super) fn delete_segment(dir: &Path, first_index: u64) -> io::Result<()> {
    match fs::remove_file(segment_path(dir, first_index)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads a class's checkpoint; `None` if missing or damaged.
pub(super) fn read_checkpoint(dir: &Path) -> Option<Checkpoint> {
    Checkpoint::decode(&fs::read(dir.join(CHECKPOINT_FILE)).ok()?)
}

/// Replaces a class's checkpoint (write, then rename over); with
/// `durable`, file and directory are synced (the directory sync also makes
/// earlier segment deletions hold). A stale checkpoint only replays
/// delivered records again.
pub(super) fn write_checkpoint(
    dir: &Path,
    checkpoint: &Checkpoint,
    durable: bool,
) -> io::Result<()> {
    replace(dir, CHECKPOINT_FILE, &checkpoint.encode(), durable)
}

/// Replaces `dir/name` with `bytes` whole (a temporary file renamed over
/// it, so a reader sees the old or the new content, never a mix); with
/// `durable`, the file and the directory are synced before returning.
pub(super) fn replace(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    io::Write::write_all(&mut f, bytes)?;
    if durable {
        f.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Free bytes on the filesystem holding `dir` for an unprivileged writer.
pub(super) fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out
    // pointer for the duration of the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Hands memory freed after start-up back to the system. Start-up reads
/// whole segments; glibc keeps a freed block of that size in its heap
/// (its mmap threshold grows with the blocks freed), so without this a
/// recovered weir keeps a segment's worth of memory it no longer uses.
pub(super) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Takes an exclusive lock on `dir/lock` (released when the file is
/// closed, including by a crash); `WouldBlock` if another process has it.
pub(super) fn lock_dir(dir: &Path) -> io::Result<File> {
    lock_file(&dir.join("lock"))
}

/// Takes an exclusive lock on the file at `path`, creating it (released
/// when the file is closed, including by a crash); `WouldBlock` if another
/// process has it.
pub(crate) fn lock_file(path: &Path) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    // SAFETY: a valid open descriptor for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}
