//! The filesystem mounted for real (needs root and /dev/fuse, as the
//! spool's power-cut tests do), used through ordinary file calls.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use weir_faultfs::{mount, Cut, Op};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weir-faultfs-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn what_was_synced_survives_a_cut_and_nothing_else() {
    let at = dir("cut");
    let fs = mount(&at, 64 << 20).expect("mount (needs root and /dev/fuse)");
    let sub = at.join("spool");
    fs::create_dir(&sub).unwrap();
    File::open(&at).unwrap().sync_all().unwrap();
    let path = sub.join("a.seg");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"synced").unwrap();
    f.sync_data().unwrap();
    File::open(&sub).unwrap().sync_all().unwrap();
    f.write_all(b"-unsynced").unwrap();
    fs::write(sub.join("b.tmp"), b"never synced").unwrap();
    fs::rename(sub.join("b.tmp"), sub.join("b")).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"synced-unsynced");
    drop(f);
    fs.power_cut(Cut::Clean);
    assert_eq!(fs::read(&path).unwrap(), b"synced");
    assert!(!sub.join("b").exists() && !sub.join("b.tmp").exists());
    // statvfs sees the capacity.
    let free = {
        let c = std::ffi::CString::new(at.to_str().unwrap()).unwrap();
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_frsize as u64
    };
    assert!(free > 60 << 20 && free <= 64 << 20, "{free}");
    drop(fs);
    let _ = fs::remove_dir_all(at);
}

#[test]
fn injected_errors_reach_the_caller_and_a_failed_sync_is_not_durable() {
    let at = dir("eio");
    let fs = mount(&at, 64 << 20).expect("mount (needs root and /dev/fuse)");
    let path = at.join("x.seg");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    File::open(&at).unwrap().sync_all().unwrap();
    f.write_all_at(b"one", 0).unwrap();
    f.sync_data().unwrap();
    fs.fail(Op::Fsync, libc::EIO, 1, Some(".seg"));
    f.write_all_at(b"two", 3).unwrap();
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    // The retry "succeeds", and the data is still not durable.
    f.sync_data().unwrap();
    fs.fail(Op::Write, libc::ENOSPC, 1, None);
    let e = f.write_all_at(b"three", 6).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    drop(f);
    fs.power_cut(Cut::Clean);
    assert_eq!(fs::read(&path).unwrap(), b"one");
    assert_eq!(fs.stats().injected, 2);
    drop(fs);
    let _ = fs::remove_dir_all(at);
}
