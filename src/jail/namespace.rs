//! Entering the jail's namespaces (inner process, single-threaded): user + network +
//! mount, the id maps, private mounts, `lo` up, the hiding mounts, and a second user +
//! mount namespace that locks them (mounts copied into a less privileged mount namespace
//! cannot be unmounted or bound apart, so even a CMD that is root in its namespace cannot
//! uncover the state directory).

use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    socket,
};

/// Why the jail could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    #[error(
        "this system refuses unprivileged user namespaces ({0}), which postern jail needs to run \
         without root. Allow them (e.g. `sysctl -w user.max_user_namespaces=15000`, \
         `sysctl -w kernel.unprivileged_userns_clone=1` on Debian kernels, or on Ubuntu 24.04+ \
         `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile \
         for postern), or run the agent in a container whose only network is postern \
         (docs/jail.md, containers)"
    )]
    Refused(Errno),
    #[error("cannot set up the jail: {what}: {errno}")]
    Setup { what: String, errno: Errno },
    #[error("cannot set up the jail: {0}")]
    Io(String),
}

fn setup(what: impl Into<String>) -> impl FnOnce(Errno) -> EnterError {
    let what = what.into();
    move |errno| EnterError::Setup { what, errno }
}

/// The caller's ids. In the first user namespace they are root (its init must keep its
/// capabilities across exec to mount /proc); in the second, where CMD runs, they are the
/// caller's again (`uid uid 1` as seen from outside): CMD's files and `id` look as outside,
/// and a non-root caller's CMD holds no capability at all.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

impl Ids {
    pub fn current() -> Self {
        Self {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        }
    }
}

/// Unshares user, network and mount namespaces; maps the ids; makes every mount private
/// (nothing done here propagates to the host); brings `lo` up.
pub fn enter(ids: Ids) -> Result<(), EnterError> {
    let flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS;
    unshare(flags).map_err(|e| match e {
        Errno::EPERM | Errno::ENOSPC | Errno::EUSERS | Errno::EACCES => EnterError::Refused(e),
        e => EnterError::Setup {
            what: "unshare".into(),
            errno: e,
        },
    })?;
    map_ids(Ids { uid: 0, gid: 0 }, ids)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(setup("making mounts private"))?;
    loopback_up()
}

/// A second user + mount namespace (entered by the jail's init, root of the first): the
/// mounts made so far are locked in it, and CMD holds no capability over the network and PID
/// namespaces (owned by the first user namespace).
pub fn lock(caller: Ids) -> Result<(), EnterError> {
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
        .map_err(setup("unshare (lock)"))?;
    map_ids(caller, Ids { uid: 0, gid: 0 })
}

/// A /proc of the jail's PID namespace over the host's (by its PID 1): host processes, their
/// environments and their `/proc/PID/root` views past the hidden directories are gone.
pub fn mount_proc() -> Result<(), EnterError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>)
        .map_err(setup("mounting the jail's /proc"))
}

/// The next child starts a new PID namespace (as its PID 1).
pub fn new_pid_namespace() -> Result<(), EnterError> {
    unshare(CloneFlags::CLONE_NEWPID).map_err(setup("unshare (pid)"))
}

/// Maps `inside` to `outside` (the parent namespace's ids), one id each.
fn map_ids(inside: Ids, outside: Ids) -> Result<(), EnterError> {
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| EnterError::Io(format!("writing /proc/self/{file}: {e}")))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{} {} 1\n", inside.uid, outside.uid))?;
    write("gid_map", format!("{} {} 1\n", inside.gid, outside.gid))
}

/// Covers `dir` with an empty read-only tmpfs.
pub fn hide_dir(dir: &Path) -> Result<(), EnterError> {
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("postern-jail"),
        dir,
        Some("tmpfs"),
        flags,
        Some("size=4k,mode=0555"),
    )
    .map_err(setup(format!("hiding {}", dir.display())))
}

/// Binds `dir` onto itself with what is mounted under it: inside the jail a mount point
/// cannot be renamed or removed (EBUSY), while what is in it stays as writable as it was.
pub fn pin_dir(dir: &Path) -> Result<(), EnterError> {
    mount(
        Some(dir),
        dir,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(setup(format!("pinning {}", dir.display())))
}

/// Covers `root` (where every jail of this uid keeps its private directory) with a
/// read-only tmpfs that holds only `own` (this jail's directory, through an open handle)
/// under `name`: the other jails' directories are out of reach.
pub fn cover_keeping(root: &Path, own: &Path, name: &std::ffi::OsStr) -> Result<(), EnterError> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let what = || format!("covering {}", root.display());
    mount(
        Some("postern-jail"),
        root,
        Some("tmpfs"),
        flags,
        Some("size=4k,mode=0755"),
    )
    .map_err(setup(what()))?;
    let at = root.join(name);
    std::fs::create_dir(&at).map_err(|e| EnterError::Io(format!("{}: {e}", what())))?;
    mount(Some(own), &at, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(setup(what()))?;
    mount(
        None::<&str>,
        root,
        None::<&str>,
        flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(setup(what()))
}

/// Binds `source` over `target` (a file over a file).
pub fn bind_file(source: &Path, target: &Path) -> Result<(), EnterError> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(setup(format!("mounting over {}", target.display())))
}

/// RTM_NEWLINK on `lo` with IFF_UP, through a netlink socket (no `ip`, no ioctl).
fn loopback_up() -> Result<(), EnterError> {
    let index = nix::net::if_::if_nametoindex("lo").map_err(setup("finding lo"))?;
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(setup("netlink socket"))?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(setup("netlink bind"))?;
    send(fd.as_raw_fd(), &link_up_message(index), MsgFlags::empty())
        .map_err(setup("netlink send"))?;
    let mut buf = [0u8; 1024];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(setup("netlink recv"))?;
    match netlink_ack(buf.get(..n).unwrap_or(&[])) {
        Some(0) => Ok(()),
        Some(code) => Err(EnterError::Setup {
            what: "bringing lo up".into(),
            errno: Errno::from_raw(-code),
        }),
        None => Err(EnterError::Io(
            "bringing lo up: no netlink acknowledgement".into(),
        )),
    }
}

const RTM_NEWLINK: u16 = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const IFF_UP: u32 = 1;

/// `nlmsghdr` + `ifinfomsg` (host byte order), asking for an ack.
fn link_up_message(index: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(32);
    m.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it
    m.push(0); // ifi_family AF_UNSPEC
    m.push(0); // padding
    m.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    m.extend_from_slice(&index.to_ne_bytes()); // ifi_index
    m.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    m.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    m
}

/// The error field of an NLMSG_ERROR reply (0 is the ack).
fn netlink_ack(reply: &[u8]) -> Option<i32> {
    let kind = u16::from_ne_bytes(reply.get(4..6)?.try_into().ok()?);
    if kind != NLMSG_ERROR {
        return None;
    }
    Some(i32::from_ne_bytes(reply.get(16..20)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_message_is_one_ifinfomsg_asking_for_an_ack() {
        let m = link_up_message(1);
        assert_eq!(m.len(), 32);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 32);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), RTM_NEWLINK);
        assert_eq!(u32::from_ne_bytes(m[20..24].try_into().unwrap()), 1);
        let mut ack = vec![0u8; 36];
        ack[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert_eq!(netlink_ack(&ack), Some(0));
        ack[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(netlink_ack(&ack), Some(-1));
        assert_eq!(netlink_ack(&[0; 3]), None);
    }
}
